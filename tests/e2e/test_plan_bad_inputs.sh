#!/usr/bin/env bash
# oases-train --plan FILE validates the plan before any work (issue 30): a bad field is one line
# naming the file and the field, exit code 2, nothing else printed (the runs are not quiet). Once
# chunks 0, -3 and 10^12 and mesh sizes [0, 2] trained without a word. The plans are made by
# oases-train --export-plan, with --tp 2 (version 1: one tp x dp mesh and the parameters' specs)
# and with --pp 2 (version 4: a list of stages), each also run unchanged, then one field changed;
# a version 3 pipeline file still runs.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx
T=$OASES_BIN/oases-train
RUN=("$T" "$MODEL" --synthetic --steps 1 --local-ranks 2)

"$T" "$MODEL" --synthetic --steps 0 -q --local-ranks 2 --tp 2 --export-plan "$WORK/good.json" || fail "export a plan"
# edit FIELD VALUE NAME [BASE]: the plan BASE (default good) with FIELD (a path of keys, e.g.
# schedule.chunks) set to VALUE (JSON; "-" removes it), written to $WORK/NAME.json
edit() {
  /usr/bin/python3 - "$WORK/${4:-good}.json" "$1" "$2" "$WORK/$3.json" <<'PY'
import json, sys
plan, path, value, out = sys.argv[1], sys.argv[2].split("."), sys.argv[3], sys.argv[4]
p = json.load(open(plan))
at = p
for k in path[:-1]:
    at = at.setdefault(k, {}) if not isinstance(at, list) else at[int(k)]
last = int(path[-1]) if isinstance(at, list) else path[-1]
if value == "-":
    del at[last]
else:
    at[last] = json.loads(value)
json.dump(p, open(out, "w"))
PY
}

edit schedule '{"name": "oases", "chunks": 2}' chunks2
"${RUN[@]}" -q --plan "$WORK/chunks2.json" || fail "the good plan with 2 chunks does not run"
edit schedule.chunks 0 chunks0
expect_error "chunks 0" "^error: .*/chunks0\.json: schedule\.chunks: 0 is not a positive integer$" "${RUN[@]}" --plan "$WORK/chunks0.json"
edit schedule.chunks -3 chunks-3
expect_error "chunks -3" "^error: .*/chunks-3\.json: schedule\.chunks: -3 is not a positive integer$" "${RUN[@]}" --plan "$WORK/chunks-3.json"
edit schedule.chunks 1000000000000 chunks1e12
expect_error "chunks 10^12" "^error: .*/chunks1e12\.json: schedule\.chunks: 1000000000000 is more than 1048576, the most a plan may give$" \
  "${RUN[@]}" --plan "$WORK/chunks1e12.json"
edit schedule.chunks 1e12 chunks1e12float
expect_error "chunks 1e12" "^error: .*/chunks1e12float\.json: schedule\.chunks: 1000000000000 is more than 1048576" \
  "${RUN[@]}" --plan "$WORK/chunks1e12float.json"
edit schedule.chunks 2.5 chunks2.5
expect_error "chunks 2.5" "^error: .*/chunks2\.5\.json: schedule\.chunks: 2\.5 is not an integer$" "${RUN[@]}" --plan "$WORK/chunks2.5.json"
# chunks that do not divide the batch: the plan's batch, or the run's (the model's input)
edit batch 8 batch8
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['schedule']={'name': 'oases', 'chunks': 3}; json.dump(p, open(sys.argv[1], 'w'))" "$WORK/batch8.json"
expect_error "chunks 3 of a batch of 8" "^error: .*/batch8\.json: schedule\.chunks: dp 1 x 3 chunks do not divide the batch of 8$" \
  "${RUN[@]}" --plan "$WORK/batch8.json"
edit schedule '{"name": "oases", "chunks": 3}' chunks3
expect_error "chunks 3 of the run's batch of 2" "--chunks 3 does not divide the batch size 2" "${RUN[@]}" --plan "$WORK/chunks3.json"
edit schedule.name '"fastest"' sched
expect_error "unknown schedule" "^error: .*/sched\.json: schedule\.name: unknown schedule 'fastest'" "${RUN[@]}" --plan "$WORK/sched.json"

edit mesh.sizes '[0, 2]' sizes0
expect_error "mesh sizes [0, 2]" "^error: .*/sizes0\.json: mesh\.sizes\[0\]: 0 is not a positive integer$" "${RUN[@]}" --plan "$WORK/sizes0.json"
edit mesh.sizes '[1, -2]' sizes-2
expect_error "mesh sizes [1, -2]" "^error: .*/sizes-2\.json: mesh\.sizes\[1\]: -2 is not a positive integer$" "${RUN[@]}" --plan "$WORK/sizes-2.json"
edit mesh.ranks 4 ranks4
expect_error "mesh ranks 4 of sizes [1, 2]" "^error: .*/ranks4\.json: mesh\.ranks: 4, but the mesh dp=1 x tp=2 has 2 ranks$" \
  "${RUN[@]}" --plan "$WORK/ranks4.json"
edit parameters.0.spec '"[S(tp)/0, R]"' segments0
expect_error "spec with 0 segments" "^error: .*/segments0\.json: parameters\['.*'\]: spec '\[S\(tp\)/0, R\]': 0 segments" \
  "${RUN[@]}" --plan "$WORK/segments0.json"
edit parameters.0.name '"m.wte\nweight"' newline
expect_error "a newline in a name" "^error: .*/newline\.json: parameters\[0\]\.name: 'm\.wte\\\\nweight' holds a control character$" \
  "${RUN[@]}" --plan "$WORK/newline.json"
edit dtype '"fp8"' dtype
expect_error "dtype fp8" "^error: .*/dtype\.json: dtype: unknown dtype 'fp8'" "${RUN[@]}" --plan "$WORK/dtype.json"
edit version '"1"' version
expect_error "version as a string" "^error: .*/version\.json: version: a string where an integer belongs$" "${RUN[@]}" --plan "$WORK/version.json"

# a pipeline plan (version 4): the stages' fields
"$T" "$MODEL" --synthetic --steps 0 -q --local-ranks 2 --pp 2 --export-plan "$WORK/pp.json" || fail "export a pipeline plan"
"${RUN[@]}" -q --plan "$WORK/pp.json" || fail "the good pipeline plan does not run"
edit pipeline.micro_batches 0 micro0 pp
expect_error "micro-batches 0" "^error: .*/micro0\.json: pipeline\.micro_batches: 0 is not a positive integer$" "${RUN[@]}" --plan "$WORK/micro0.json"
edit pipeline.stages.1.blocks '"2-3"' cuts pp
expect_error "cuts with a gap" "^error: .*/cuts\.json: pipeline\.cuts: stage 1 starts at block 2, not 1" "${RUN[@]}" --plan "$WORK/cuts.json"
edit pipeline.stages '[]' stages0 pp
expect_error "stages 0" "^error: .*/stages0\.json: pipeline\.stages: 0 stages \(1 to 1048576\)$" "${RUN[@]}" --plan "$WORK/stages0.json"
edit pipeline.schedule '"zigzag"' zigzag pp
expect_error "pipeline schedule" "^error: .*/zigzag\.json: pipeline\.schedule: unknown pipeline schedule 'zigzag'" \
  "${RUN[@]}" --plan "$WORK/zigzag.json"
edit pipeline.stages.1 '{"blocks": "1-1", "tp": 1}' meshes pp
expect_error "a stage with half a mesh" "^error: .*/meshes\.json: pipeline\.stages\[1\]: a stage after the first needs both \"tp\" and \"dp\", or neither" \
  "${RUN[@]}" --plan "$WORK/meshes.json"
edit pipeline.stages.1 '{"blocks": "1-1"}' first_mesh pp
"${RUN[@]}" -q --plan "$WORK/first_mesh.json" || fail "a stage without tp and dp (the first stage's mesh) does not run"
edit pipeline.stages.1.chunks 4 chunks4 pp
expect_error "a stage of other chunks" "^error: .*/chunks4\.json: pipeline\.stages\[1\]\.chunks: 4, the first stage's are 1" \
  "${RUN[@]}" --plan "$WORK/chunks4.json"
# version 3 files still load: the same pipeline as counts and cuts
/usr/bin/python3 - "$WORK/pp.json" "$WORK/v3.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
q = p["pipeline"]
p["version"] = 3
p["pipeline"] = {"stages": len(q["stages"]), "micro_batches": q["micro_batches"], "schedule": q["schedule"],
                 "cuts": ",".join(s["blocks"] for s in q["stages"])}
json.dump(p, open(sys.argv[2], "w"))
PY
"${RUN[@]}" -q --plan "$WORK/v3.json" || fail "a version 3 pipeline plan does not run"
edit pipeline.meshes '[{"tp": 1, "dp": 1}]' v3meshes v3
expect_error "one mesh for two stages" "^error: .*/v3meshes\.json: pipeline\.meshes: 1 meshes for 2 stages" "${RUN[@]}" --plan "$WORK/v3meshes.json"
finish
