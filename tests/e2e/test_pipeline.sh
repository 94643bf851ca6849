#!/usr/bin/env bash
# Pipeline stages (--pp) reproduce the single-rank run: on a tied GPT-2-style model and an untied
# LLaMA-style model (4 blocks each, dynamic batch), every pipeline schedule (gpipe, 1f1b,
# eager-1f1b) over pp in {2, 4} x tp in {1, 2} x dp in {1, 2} (at most 8 ranks) gives the
# single-rank losses over 20 steps (1e-6 relative) and its gradients (fp32, 2e-6 relative), as threads
# (--local-ranks) and under mpirun; nested with the oases schedule inside the stages; the tied
# embedding's copies on the first and last stage stay bit-equal (an export checks it); dropout
# masks and sequence parallelism inside stages match one rank too; a
# checkpoint saved under one pp/tp/dp layout resumes under another with the tensors bit for bit;
# each stage on its own tp x dp mesh (--stage-meshes) matches one rank too; a failing or hung rank
# stops every stage; bad stage and batch settings are one-line errors (exit 2).
# ctest: COST 132 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
pipeline_tests  # (lib.sh) T, mpirun, common, run

for model in gpt2_4l llama_4l; do
  M=$OASES_SOURCE_DIR/models/train/$model/model.onnx
  one_rank_reference "$model" "$M"
  # lib.sh's runs dump a training run's first-step gradients: the same bits as a launch that only
  # computes them (--steps 0), on one rank and across stages
  "$T" "$M" "${common[@]}" --steps 0 --dump-grads "$WORK/$model.alone" || fail "$model: gradients alone"
  "$T" "$M" "${common[@]}" --local-ranks 4 --pp 2 --tp 2 --steps 0 --dump-grads "$WORK/$model.pp.alone" || fail "$model pp 2: gradients alone"
  "$T" "$M" "${common[@]}" --local-ranks 4 --pp 2 --tp 2 --steps 2 --dump-grads "$WORK/$model.pp.run" || fail "$model pp 2: gradients in a run"
  /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$WORK/$model.grads" "$WORK/$model.alone" "$model: one rank" --exact --rtol 0 ||
    fail "$model: one rank's gradients in a run differ from alone"
  /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$WORK/$model.pp.run" "$WORK/$model.pp.alone" "$model: pp 2 x tp 2" --exact --rtol 0 ||
    fail "$model pp 2: gradients in a run differ from alone"
  for pp in 2 4; do
    for tp in 1 2; do
      for dp in 1 2; do
        n=$((pp * tp * dp))
        ((n > 8)) && continue
        for sched in gpipe 1f1b eager-1f1b; do
          run "$model pp$pp tp$tp dp$dp $sched" "$model" "$T" "$M" --local-ranks $n -- --pp $pp --tp $tp --dp $dp --pipeline $sched
        done
      done
    done
  done
  # under MPI: each schedule once, and the oases schedule with 2 chunks inside each stage
  run "$model mpi pp2 tp2 gpipe" "$model" "${MPIRUN[@]}" -np 4 "$T" "$M" -- --pp 2 --tp 2 --pipeline gpipe
  run "$model mpi pp4 1f1b" "$model" "${MPIRUN[@]}" -np 4 "$T" "$M" -- --pp 4 --pipeline 1f1b
  run "$model mpi pp2 tp2 eager-1f1b oases" "$model" "${MPIRUN[@]}" -np 4 "$T" "$M" -- --pp 2 --tp 2 --micro-batches 4 \
    --pipeline eager-1f1b --schedule oases --chunks 2
  run "$model pp2 dp2 1f1b optim_comm_checkpoint" "$model" "$T" "$M" --local-ranks 4 -- --pp 2 --dp 2 --micro-batches 2 --pipeline 1f1b \
    --schedule optim_comm_checkpoint --chunks 2
done

# each stage its own mesh (--stage-meshes TPxDP[:SCHEDULE]): a tied weight laid out differently on
# the first and last stage, activations resharded between meshes of other shapes and sizes, the
# world the sum of the meshes, sequence parallelism on one side only, MPI
for model in gpt2_4l llama_4l; do
  M=$OASES_SOURCE_DIR/models/train/$model/model.onnx
  run "$model meshes 1x2,2x1 1f1b" "$model" "$T" "$M" --local-ranks 4 -- --pp 2 --stage-meshes 1x2,2x1
  run "$model meshes 2x2,1x1 gpipe" "$model" "$T" "$M" --local-ranks 5 -- --pp 2 --stage-meshes 2x2,1x1 --pipeline gpipe
  run "$model meshes 2x1,1x2,1x1,1x1 eager-1f1b" "$model" "$T" "$M" --local-ranks 6 -- --pp 4 --stage-meshes 2x1,1x2,1x1,1x1 \
    --pipeline eager-1f1b
done
G=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
run "gpt2_4l meshes sequence-parallel" gpt2_4l "$T" "$G" --local-ranks 4 -- --pp 2 --stage-meshes 2x1,1x2 --sequence-parallel
run "gpt2_4l meshes schedules" gpt2_4l "$T" "$G" --local-ranks 4 -- --pp 2 --stage-meshes 2x1:oases,1x2:default_checkpoint --chunks 2 \
  --micro-batches 2 --pipeline eager-1f1b
run "gpt2_4l mpi meshes 1x1,2x1" gpt2_4l "${MPIRUN[@]}" -np 3 "$T" "$G" -- --pp 2 --stage-meshes 1x1,2x1:oases --chunks 2 --micro-batches 4
"$T" "$G" "${common[@]}" --steps 0 --local-ranks 4 --pp 2 --stage-meshes 2x1,1x2 --export-plan "$WORK/meshes.plan.json" \
  || fail "export a pipeline plan with stage meshes"
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['pipeline']; assert [(x['tp'], x['dp']) for x in p['stages']] == \
[(2, 1), (1, 2)], p" "$WORK/meshes.plan.json" || fail "exported plan lacks the stage meshes"
run "gpt2_4l from a plan with stage meshes" gpt2_4l "$T" "$G" --local-ranks 4 -- --plan "$WORK/meshes.plan.json"
# the planner puts stages on their own meshes where that is faster: a vocabulary-heavy stack on 2
# PCIe hosts under a tight memory limit (65 MiB) gets a tp stage and a dp stage (planner/pipeline_search.h:
# which one takes the head follows the prices), and oases-train --plan runs the meshes it wrote
vocabulary_heavy_stack
"$OASES_BIN/oases-plan" "$V" --gpus 4 --cluster "$WORK/pcie.json" --batch 32 --seq 64 --memory 0.065 --pp 2 --dtype fp32 --out "$WORK/own.plan.json" \
  >"$WORK/own.plan.txt" || fail "plan stages on their own meshes"
grep -Eq "stage tp (1,2|2,1)" "$WORK/own.plan.txt" || fail "the planner kept one tp for both stages: $(grep -A1 '  pipeline  ' "$WORK/own.plan.txt")"
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['pipeline']; m=[(x['tp'], x['dp']) for x in p['stages']]; \
assert sorted(m) == [(1, 2), (2, 1)], p" \
  "$WORK/own.plan.json" || fail "the plan file lacks the stage meshes"
# a later stage of its own tp lists every part in the layout it was priced in
/usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['pipeline']['stages']; t=[x for x in s if x['tp'] == 2][0]; \
assert all(q['tp'] == 2 for q in t.get('parts', [])) and (s[0]['tp'] == 2 or t.get('parts')), s" \
  "$WORK/own.plan.json" || fail "the plan file lacks the tp 2 stage's own layouts"
"$T" "$V" --synthetic --batch 32 --seq 64 --steps 2 -q --local-ranks 4 --plan "$WORK/own.plan.json" || fail "run the planner's stage meshes"
# --simulate replays the fastest pipelines' stage programs and keeps the fastest that fits; each
# stage's memory as the search priced it is within 15% of its program's (parameters, moments, arena)
"$OASES_BIN/oases-plan" "$V" --gpus 4 --cluster "$WORK/pcie.json" --batch 32 --seq 64 --memory 0.065 --pp 2 --dtype fp32 --simulate \
  --out "$WORK/own.sim.json" >"$WORK/own.sim.txt" || fail "plan and replay stages"
grep -q "pipeline re-ranked by replay: " "$WORK/own.sim.txt" && grep -q "stage programs replayed; the search predicted" "$WORK/own.sim.txt" \
  || fail "--simulate did not replay the pipeline candidates: $(cat "$WORK/own.sim.txt")"
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); s=p['simulation']['pipeline']; \
assert s['step_ms'] > 0 and s['predicted_step_ms'] > 0 and len(s['stages']) == 2 and s['exchange_ms'] > 0, s; \
r=[x['predicted_memory_bytes'] / x['memory_bytes'] for x in s['stages']]; assert all(0.85 <= q <= 1.15 for q in r), r" \
  "$WORK/own.sim.json" || fail "the plan file lacks the replayed pipeline"
# a stage of its own tp with sequence parallelism inside it (a v4 plan's stage "parts") gives the
# single-rank losses and gradients
cat >"$WORK/sp_stage.plan.json" <<'EOF'
{"format": "oases-plan", "version": 4, "batch": 16, "seq": 32, "mesh": {"axes": ["dp", "tp"], "sizes": [2, 1], "ranks": 2},
 "schedule": {"name": "default_checkpoint", "chunks": 1},
 "parts": [{"part": "embedding", "tp": 1}, {"part": "layer.0.attn", "tp": 1}, {"part": "layer.0.mlp", "tp": 1},
   {"part": "layer.1.attn", "tp": 1}, {"part": "layer.1.mlp", "tp": 1}, {"part": "layer.2.attn", "tp": 1}, {"part": "layer.2.mlp", "tp": 1},
   {"part": "layer.3.attn", "tp": 1}, {"part": "layer.3.mlp", "tp": 1}, {"part": "head", "tp": 1}],
 "pipeline": {"schedule": "1f1b", "micro_batches": 4, "stages": [{"blocks": "0-1", "tp": 1, "dp": 2},
   {"blocks": "2-3", "tp": 2, "dp": 1, "parts": [
     {"part": "embedding", "tp": 2, "sequence_parallel": true}, {"part": "layer.0.attn", "tp": 2, "sequence_parallel": true},
     {"part": "layer.0.mlp", "tp": 2, "sequence_parallel": true}, {"part": "layer.1.attn", "tp": 2, "sequence_parallel": true},
     {"part": "layer.1.mlp", "tp": 2, "sequence_parallel": true}, {"part": "layer.2.attn", "tp": 2, "sequence_parallel": true},
     {"part": "layer.2.mlp", "tp": 2, "sequence_parallel": true}, {"part": "layer.3.attn", "tp": 2, "sequence_parallel": true},
     {"part": "layer.3.mlp", "tp": 2, "sequence_parallel": true}, {"part": "head", "tp": 2, "sequence_parallel": true}]}]}}
EOF
run "gpt2_4l plan stages dp 2, then tp 2 + sp" gpt2_4l "$T" "$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx" --local-ranks 4 -- \
  --plan "$WORK/sp_stage.plan.json"
sed 's/"head", "tp": 2/"head", "tp": 1/' "$WORK/sp_stage.plan.json" >"$WORK/sp_bad.plan.json"
expect_error "a stage's part off its tp" "pipeline\.stages\[1\]\.parts\[9\]\.tp: 1, the stage's tp is 2" \
  "$T" "$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx" --synthetic --steps 1 --local-ranks 4 --plan "$WORK/sp_bad.plan.json"
expect_error "a staged plan on too few ranks" "the plan's 2 stages need 4 ranks, this run has 2" \
  "$T" "$V" --synthetic --batch 32 --seq 64 --steps 2 -q --local-ranks 2 --plan "$WORK/own.plan.json"
expect_error "stage meshes and --tp" "not both" "$T" "$G" --synthetic --steps 1 --pp 2 --local-ranks 4 --stage-meshes 2x1,1x2 --tp 2
expect_error "stage meshes off the world" "needs 4 ranks, the run has 5" "$T" "$G" --synthetic --steps 1 --pp 2 --local-ranks 5 \
  --stage-meshes 2x1,1x2
expect_error "stage meshes malformed" "not TPxDP" "$T" "$G" --synthetic --steps 1 --pp 2 --local-ranks 4 --stage-meshes 2x1,2y2
expect_error "stage meshes too few" "names 1 meshes for 2 stages" "$T" "$G" --synthetic --steps 1 --pp 2 --local-ranks 2 --stage-meshes 2x1
expect_error "stage meshes and the batch" "dp 3" "$T" "$G" --synthetic --steps 1 --batch 16 --pp 2 --local-ranks 4 --stage-meshes 1x1,1x3

# dropout: every stage replays the single-rank masks (with recomputation inside the stages too);
# sequence parallelism inside the stages
D=$OASES_SOURCE_DIR/models/train/gpt2_dropout/model.onnx
"$T" "$D" "${common[@]}" --steps 20 --log-json "$WORK/dropout.jsonl" || fail "dropout single rank"
"$T" "$D" "${common[@]}" --steps 0 --dump-grads "$WORK/dropout.grads" || fail "dropout single-rank gradients"
run "gpt2_dropout pp2 tp2 eager-1f1b oases" dropout "$T" "$D" --local-ranks 4 -- --pp 2 --tp 2 --micro-batches 4 --pipeline eager-1f1b \
  --schedule oases --chunks 2
run "gpt2_4l pp2 tp2 sequence-parallel" gpt2_4l "$T" "$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx" --local-ranks 4 -- --pp 2 --tp 2 \
  --sequence-parallel
run "gpt2_4l pp2 tp2 collective matmuls oases" gpt2_4l "$T" "$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx" --local-ranks 4 -- --pp 2 \
  --tp 2 --sequence-parallel --collective-matmul --schedule oases --chunks 2

# --export-plan writes the stages into the plan (version 4); --plan alone runs them again
G=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
"$T" "$G" "${common[@]}" --steps 0 --local-ranks 4 --pp 2 --tp 2 --pipeline eager-1f1b --stages 0-0,1-3 --export-plan "$WORK/pp.plan.json" \
  || fail "export a pipeline plan"
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); q=p['pipeline']; assert p['version'] == 4 and \
q['schedule'] == 'eager-1f1b' and q['micro_batches'] == 2 and [(s['blocks'], s['tp'], s['dp']) for s in q['stages']] == \
[('0-0', 2, 1), ('1-3', 2, 1)], q" "$WORK/pp.plan.json" \
  || fail "exported plan lacks its pipeline"
run "gpt2_4l from an exported pipeline plan" gpt2_4l "$T" "$G" --local-ranks 4 -- --plan "$WORK/pp.plan.json"

# the issue's command: mpirun -np 4, pp 2 x tp 2, 4 micro-batches, eager 1F1B, oases with 2 chunks, a trace
M=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
"${MPIRUN[@]}" -np 4 "$T" "$M" "${common[@]}" --steps 4 --pp 2 --tp 2 --micro-batches 4 --pipeline eager-1f1b --schedule oases --chunks 2 \
  --trace "$WORK/t.json" --export-onnx "$WORK/trained.onnx" || fail "traced pipeline run"
/usr/bin/python3 - "$WORK/t.json" <<'EOF' || fail "trace of the pipeline"
import json, sys
doc = json.load(open(sys.argv[1]))
ev = doc["traceEvents"]
assert doc["otherData"]["pp"] == 2 and doc["otherData"]["pipeline"] == "eager-1f1b", doc["otherData"]
names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
assert {"rank 0 (stage 0)", "rank 3 (stage 1)"} <= names, names
transfers = [e for e in ev if e.get("ph") == "X" and e["tid"] == 2]
assert transfers and all(e["name"].startswith(("send", "recv")) for e in transfers), transfers[:3]
for pid in range(4):
    assert any(e["pid"] == pid for e in transfers), f"rank {pid} shows no transfer"
    # each traced step a span on the compute thread, the optimizer's update inside it
    steps = [e for e in ev if e.get("ph") == "X" and e["pid"] == pid and e["args"].get("kind") == "step"]
    updates = [e for e in ev if e.get("ph") == "X" and e["pid"] == pid and e["name"] == "optimizer step"]
    assert steps and len(updates) == len(steps), (pid, len(steps), len(updates))
    assert all(e["tid"] == 0 and e["args"]["kind"] == "compute" for e in updates), updates[:1]
    assert all(any(s["ts"] <= u["ts"] and u["ts"] + u["dur"] <= s["ts"] + s["dur"] + 1 for s in steps) for u in updates), (steps, updates)
print(f"ok trace: {len(transfers)} cross-stage transfers on 4 ranks, {len(steps)} step spans a rank with the update in each")
EOF

# a checkpoint of pp 2 x tp 2 (one file per stage and a manifest) resumes under pp 4 (and under no
# pipeline) with every tensor bit for bit
"$T" "$M" "${common[@]}" --steps 20 --stop-after 10 --local-ranks 4 --pp 2 --tp 2 --save "$WORK/pp.ckpt" || fail "pp save"
"$T" "$M" "${common[@]}" --steps 10 --local-ranks 4 --pp 4 --resume "$WORK/pp.ckpt" --save "$WORK/pp4.ckpt" || fail "pp4 resave"
"$T" "$M" "${common[@]}" --steps 10 --resume "$WORK/pp.ckpt" --save "$WORK/one.ckpt" || fail "one-rank resave"
# (and under stage meshes of other shapes, resaved there and read back by one rank)
"$T" "$M" "${common[@]}" --steps 10 --local-ranks 4 --pp 2 --stage-meshes 1x2,2x1 --resume "$WORK/pp.ckpt" --save "$WORK/meshes.ckpt" \
  || fail "stage meshes resave"
for c in pp4 one meshes; do same_checkpoint "$WORK/pp.ckpt" "$WORK/$c.ckpt" || fail "checkpoint resaved under $c differs"; done
"$T" "$M" "${common[@]}" --steps 20 --local-ranks 4 --pp 4 --resume "$WORK/pp.ckpt" --log-json "$WORK/resumed.jsonl" || fail "pp4 resume"
"$T" "$M" "${common[@]}" --steps 20 --log-json "$WORK/straight.jsonl" || fail "straight run"
resumed_continues "$WORK/straight.jsonl" "$WORK/resumed.jsonl" "under pp 4" || fail "resumed losses"

# a pipeline checkpoint missing a stage file, or holding one of another save, is refused
[[ -f $WORK/pp.ckpt.stage0-of-2 && -f $WORK/pp.ckpt.stage1-of-2 ]] || fail "pp 2 checkpoint: no file per stage"
mv "$WORK/pp.ckpt.stage1-of-2" "$WORK/held"
expect_error "missing stage file" "pp.ckpt.stage1-of-2: no such checkpoint" "$T" "$M" "${common[@]}" --steps 12 --resume "$WORK/pp.ckpt"
cp "$WORK/pp4.ckpt.stage3-of-4" "$WORK/pp.ckpt.stage1-of-2"
expect_error "stage file of another save" "not this save.s stage file" "$T" "$M" "${common[@]}" --steps 12 --resume "$WORK/pp.ckpt"
mv "$WORK/held" "$WORK/pp.ckpt.stage1-of-2"
printf 'OASESPP1\n{"format": "oases-pipeline-checkpoint", "files": ["self.ckpt"], "step": 1}' >"$WORK/self.ckpt"
expect_error "manifest naming itself" "a pipeline manifest where a stage" "$T" "$M" "${common[@]}" --steps 2 --resume "$WORK/self.ckpt"
printf 'OASESPP1\n{"format": "oases-pipeline-checkpoint", "files": ["../etc.ckpt"], "step": 1}' >"$WORK/out.ckpt"
expect_error "stage file outside the folder" "not a file name beside the manifest" "$T" "$M" "${common[@]}" --steps 2 --resume "$WORK/out.ckpt"

# a failing or hung rank of a later stage stops every stage (no rank waits forever on a transfer)
out=$(OASES_TEST_FAULT=3:1:error timeout 120 "$T" "$M" "${common[@]}" --steps 3 --local-ranks 4 --pp 2 --tp 2 --comm-timeout 5 2>&1)
rc=$?
[[ $rc -eq 2 && $out == *"injected failure"* ]] || fail "pipeline rank failure: exit $rc: $out"
out=$(OASES_TEST_FAULT=3:1:hang timeout 120 "$T" "$M" "${common[@]}" --steps 3 --local-ranks 4 --pp 2 --tp 2 --comm-timeout 5 2>&1)
rc=$?
# (whichever times out first names rank 3: its tp peer's all-reduce, or a receive on the first stage
# from that peer, which waits for rank 3)
[[ $rc -eq 2 && ($out == *"for rank 3, which did not arrive"* || $out == *"waits for rank 3 in"*) ]] || fail "pipeline hung rank: exit $rc: $out"

# bad settings: one line, exit 2
expect_error "more stages than blocks" "4 transformer block" "$T" "$M" --synthetic --steps 1 --batch 5 --seq 16 --pp 5 --local-ranks 5
expect_error "empty stage" "stage|range" "$T" "$M" --synthetic --steps 1 --pp 2 --local-ranks 2 --stages 0-3,4-3
expect_error "stages that skip a block" "stage|block" "$T" "$M" --synthetic --steps 1 --pp 2 --local-ranks 2 --stages 0-1,3-3
expect_error "batch not divisible" "batch|micro-batch" "$T" "$M" --synthetic --steps 1 --batch 6 --seq 16 --pp 2 --local-ranks 2 --micro-batches 4
expect_error "world not divisible" "--pp 2 does not divide" "$T" "$M" --synthetic --steps 1 --pp 2 --local-ranks 3
expect_error "micro-batches without stages" "need --pp" "$T" "$M" --synthetic --steps 1 --micro-batches 2
finish
