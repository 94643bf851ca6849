#!/usr/bin/env bash
# oases-plan --gpus N chooses a plan that oases-train runs exactly: `oases-plan MODEL --gpus 4 --out
# p.json`, then `oases-train MODEL --plan p.json` under --local-ranks 4 and under mpirun -np 4 gives
# the single-rank gradients (--steps 0 --dump-grads), for the chosen plan and for plans forced onto
# each overlapped schedule with chunks; oases-profile writes a profile the planner accepts; bad
# cluster files, memory limits no plan fits and profiles not covering the model exit 2.
# ctest: COST 31 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
P=$OASES_BIN/oases-plan
T=$OASES_BIN/oases-train
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
command -v mpirun >/dev/null || { echo "mpirun missing: install openmpi-bin (scripts/setup.sh)"; exit 1; }

same_grads() {  # same_grads REF_DIR DIR LABEL: gradients within 1e-5 relative
  /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$1" "$2" "$3"
}

# run_plan LABEL MODEL REF_DIR DATA_ARGS PLAN_ARGS...: plan for 4 GPUs, then train under threads and MPI
run_plan() {
  local label=$1 model=$2 ref=$3 data=$4
  shift 4
  local plan=$WORK/$label.json
  "$P" "$model" --gpus 4 "$@" --out "$plan" >"$WORK/$label.txt" || { fail "$label: oases-plan"; return; }
  grep -q "Megatron" "$WORK/$label.txt" && grep -q "data parallel" "$WORK/$label.txt" || fail "$label: no baselines printed"
  /usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['parts'] and 'plan' in p['prediction'], p.keys(); \
print('  ', sys.argv[2], p['schedule'], [(q['part'], q['tp'], q['dp'], q['sequence_parallel']) for q in p['parts']])" "$plan" "$label" \
    || fail "$label: plan file lacks parts or prediction"
  # shellcheck disable=SC2086
  "$T" "$model" $data --steps 0 --plan "$plan" --local-ranks 4 --dump-grads "$WORK/$label.local" -q >/dev/null \
    && same_grads "$ref" "$WORK/$label.local" "$label --local-ranks 4" || fail "$label local"
  # shellcheck disable=SC2086
  "${MPIRUN[@]}" -np 4 "$T" "$model" $data --steps 0 --plan "$plan" --dump-grads "$WORK/$label.mpi" -q >/dev/null \
    && same_grads "$ref" "$WORK/$label.mpi" "$label mpirun -np 4" || fail "$label mpi"
}

# GPT-2 bytes model at the planner's default shapes (8 x 64 tokens; the plan carries them)
M=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
"$T" "$M" --synthetic --batch 8 --seq 64 --steps 0 --dump-grads "$WORK/bytes.ref" -q >/dev/null || fail "gpt2_bytes single rank"
run_plan bytes "$M" "$WORK/bytes.ref" "--synthetic"
for s in default_checkpoint optim_comm_checkpoint overlap_checkpoint oases; do
  run_plan "bytes_$s" "$M" "$WORK/bytes.ref" "--synthetic" --schedules "$s" --chunks 2
done
# mixed degrees: a cluster whose nodes hold 2 GPUs over a slow network
cat >"$WORK/pairs.json" <<'JSON'
{"format": "oases-cluster", "version": 1, "name": "2 x 2 GPUs", "device": "RTX3090", "nodes": 2, "gpus_per_node": 2,
 "links": {"intra_node": {"kind": "pcie", "bandwidth_gbps": 6.2, "latency_us": 10},
           "inter_node": {"kind": "ethernet", "bandwidth_gbps": 1.25, "latency_us": 30}}}
JSON
run_plan bytes_cluster "$M" "$WORK/bytes.ref" "--synthetic" --cluster "$WORK/pairs.json" --dtype fp32
# precision from the cluster: GPUs with bf16 tensor cores are planned in bf16 (printed first, written
# into the plan), and oases-train --plan trains in it unless --dtype says otherwise; --dtype fp32
# plans fp32; the machine at hand (CPU ranks) plans fp32
"$P" "$M" --gpus 4 --cluster "$WORK/pairs.json" --out "$WORK/bf16.json" >"$WORK/bf16.txt" || fail "plan for the RTX3090 cluster"
sed -n 2p "$WORK/bf16.txt" | grep -q "precision: bf16 (RTX3090 has bf16 tensor cores" || fail "bf16 not printed first: $(head -3 "$WORK/bf16.txt")"
/usr/bin/python3 -c "import json,sys; assert json.load(open(sys.argv[1])).get('dtype') == 'bf16'" "$WORK/bf16.json" \
  || fail "the plan file does not record bf16"
"$T" "$M" --synthetic --steps 2 --plan "$WORK/bf16.json" --local-ranks 4 --profile >"$WORK/bf16.train.txt" 2>&1 || fail "train the bf16 plan"
grep -q bfloat16 "$WORK/bf16.train.txt" || fail "oases-train --plan did not train in the plan's bf16"
"$T" "$M" --synthetic --steps 2 --plan "$WORK/bf16.json" --dtype fp32 --local-ranks 4 --profile >"$WORK/fp32.train.txt" 2>&1 || fail "train fp32"
grep -q bfloat16 "$WORK/fp32.train.txt" && fail "--dtype fp32 did not override the plan's bf16"
"$P" "$M" --gpus 4 --cluster "$WORK/pairs.json" --dtype fp32 --out "$WORK/fp32.json" | grep -q "precision: fp32 (--dtype)" \
  || fail "--dtype fp32 not planned in fp32"
/usr/bin/python3 -c "import json,sys; assert json.load(open(sys.argv[1])).get('dtype', 'fp32') == 'fp32'" "$WORK/fp32.json" || fail "fp32 plan file"
"$P" "$M" --gpus 4 --out "$WORK/here.json" | grep -q "precision: fp32" || fail "the machine at hand not planned in fp32"
# planning never allocates the global activations: the README's GPT-3 command (with --out, --html,
# --simulate and a reference pipeline) on a small stack whose embedding output, 16384 x 256 x 64
# fp32 = 1 GiB, is over a --max-memory of 256 MiB; the cap is for what a process allocates
BIG=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
"$P" "$BIG" --gpus 64 --cluster "$OASES_SOURCE_DIR/clusters/a100_dgx_64.json" --batch 16384 --seq 256 --max-memory 256M \
  --reference-pipeline 2,4,16,1f1b,default_checkpoint --out "$WORK/big.json" --html "$WORK/big.html" --simulate >"$WORK/big.txt" 2>&1 \
  || fail "planning refused global shapes over --max-memory: $(tail -1 "$WORK/big.txt")"
[[ -s $WORK/big.json && -s $WORK/big.html ]] || fail "the big plan's files were not written"
grep -q "reference " "$WORK/big.txt" || fail "the reference pipeline was not priced"
# the search's work, guarded (not its wall time), on two stacks (shapes only) on 64 A100s: a 24-layer
# hidden-4096 GPT under an 8 GiB limit, and GPT-3's 96 layers of hidden 12288 under the A100's 80
# GiB (bench/plan's case), both limits making the chains' bounds and Pareto fronts run. The
# transitions, labels and bounding transitions they counted on 2026-11-27 plus 25%: 565384, 6418,
# 1550338 and 2292916, 74053, 6465053 (before the chains' Lagrangian bounds: 1919250 transitions
# and 29183650 labels, 8870216 and 445256028)
search_work() {  # search_work LABEL STACK MEMORY_GIB MAX_TRANSITIONS MAX_LABELS MAX_BOUNDING
  local label=$1 stack=$2 mem=$3
  /usr/bin/python3 "$OASES_SOURCE_DIR/models/make_oases_stacks.py" --out "$WORK/st" --stack "$stack" --vocab 50304 >/dev/null \
    || { fail "write the $stack stack"; return; }
  "$P" "$WORK/st/gpt_h${stack%x*}_l${stack#*x}_v50304/model.onnx" --gpus 64 --cluster "$OASES_SOURCE_DIR/clusters/a100_dgx_64.json" \
    --batch 64 --seq 1024 --no-pipeline --memory "$mem" --out "$WORK/$label.json" >"$WORK/$label.txt" 2>&1 \
    || { fail "plan the $stack stack: $(tail -1 "$WORK/$label.txt")"; return; }
  /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['search']; print('   search work (' + sys.argv[2] + '):', s['transitions'], \
'transitions,', s['labels'], 'labels,', s['bound_transitions'], 'bounding,', s['dominated'], 'dominated'); \
assert s['transitions'] <= int(sys.argv[3]) and s['labels'] <= int(sys.argv[4]) and s['bound_transitions'] <= int(sys.argv[5]), s" \
    "$WORK/$label.json" "$stack" "$4" "$5" "$6" || fail "the search's work on the $stack stack grew past its bound"
}
search_work work 4096x24 8 706700 8000 1938000
search_work work_gpt3 12288x96 80 2866000 92600 8081000

# small exported models with their committed inputs
for model in gpt2_tiny llama_gqa bert_mask; do
  D=$OASES_SOURCE_DIR/models/small/$model
  "$T" "$D/model.onnx" --inputs "$D/test_data_set_0" --steps 0 --dump-grads "$WORK/$model.ref" -q >/dev/null || fail "$model single rank"
  shape=$(/usr/bin/python3 -c "import onnx,sys; t=onnx.load_tensor(sys.argv[1]); print(*t.dims)" "$D/test_data_set_0/input_0.pb")
  read -r b t <<<"$shape"
  run_plan "$model" "$D/model.onnx" "$WORK/$model.ref" "--inputs $D/test_data_set_0" --batch "$b" --seq "$t"
done

# a measured profile: the planner takes it, and --simulate prints the predicted step
D=$OASES_SOURCE_DIR/models/small/gpt2_tiny
"$OASES_BIN/oases-profile" --backend cpu --model "$D/model.onnx" --ranks 4 --batch 2 --seq 16 --reps 1 --sizes 4096,65536 \
  --out "$WORK/prof.json" >/dev/null || fail "oases-profile --model"
"$P" "$D/model.onnx" --gpus 4 --batch 2 --seq 16 --profile "$WORK/prof.json" --simulate --trace "$WORK/trace.json" \
  --html "$WORK/p.html" --out "$WORK/prof_plan.json" >"$WORK/sim.txt" || fail "oases-plan --profile --simulate"
grep -q "^simulated" "$WORK/sim.txt" && grep -q "hidden" "$WORK/sim.txt" || fail "--simulate printed no simulation"
# the replayed programs choose among the best of each schedule x chunks and Megatron's split: the
# plan is simulated no slower than Megatron
grep -q "re-ranked by simulation" "$WORK/sim.txt" || fail "--simulate did not re-rank the candidates"
/usr/bin/python3 - "$WORK/sim.txt" <<'PY' || fail "the simulated plan is slower than the simulated Megatron split"
import re, sys
txt = open(sys.argv[1]).read().split("simulated (", 1)[1]
step = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (plan|Megatron)\s+step\s+([\d.]+) ms", txt, re.M)}
assert step["plan"] <= step["Megatron"] * (1 + 1e-9), step
# every plan tried is listed with its simulated step, the fastest being the one taken
full = open(sys.argv[1]).read()
n = int(re.search(r"(?:among|fastest of) (\d+) candidates", full).group(1))
each = re.search(r"^    simulated: (.*)$", full, re.M).group(1).split("; ")
times = [float(re.search(r": ([\d.]+) ms$", e).group(1)) for e in each if e.endswith(" ms")]
assert len(times) == n, (n, each)
assert abs(min(times) - step["plan"]) <= 0.05 + 1e-3 * step["plan"], (times, step)
print("ok re-ranked by simulation:", step, each)
PY
/usr/bin/python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['traceEvents']" "$WORK/trace.json" || fail "--trace"
# out of sample: a profile of another model (llama_4l) with the executor's terms fitted to this one's runs
L=$OASES_SOURCE_DIR/models/train/llama_4l/model.onnx
"$OASES_BIN/oases-profile" --backend cpu --model "$L" --ranks 2 --batch 4 --seq 16 --reps 1 --sizes 4096,65536 --chunks 1 \
  --calibration "$WORK/prof.json" --out "$WORK/prof_llama.json" >"$WORK/prof_llama.txt" || fail "oases-profile --calibration"
/usr/bin/python3 - "$WORK/prof.json" "$WORK/prof_llama.json" <<'PY' || fail "--calibration did not take the other profile's fitted terms"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["executor"] == b["executor"], (a["executor"], b["executor"])
assert b["machine"]["calibrated_from"] == sys.argv[1], b["machine"]
assert b["model"]["path"].endswith("llama_4l/model.onnx"), b["model"]
print("ok --calibration: the executor's terms", b["executor"], "from", sys.argv[1])
PY
expect_error "--calibration missing" "calibration" "$OASES_BIN/oases-profile" --backend cpu --out "$WORK/x.json" --calibration "$WORK/none.json"
"$T" "$D/model.onnx" --inputs "$D/test_data_set_0" --steps 0 --plan "$WORK/prof_plan.json" --local-ranks 4 --dump-grads "$WORK/prof.grads" -q \
  >/dev/null && same_grads "$WORK/gpt2_tiny.ref" "$WORK/prof.grads" "profiled plan" || fail "profiled plan"
expect_error "profile --backend cuda" "CUDA" "$OASES_BIN/oases-profile" --backend cuda --out "$WORK/cuda.json"

# collective matmuls: with one chunk (nothing to interleave) the search decomposes the sequence-
# parallel collectives where the link is slow enough for the hidden time to pay for the copies, not
# where it is fast; the plan it writes trains (h512 x 2 stack, 8 x 256 tokens on 2 ranks)
/usr/bin/python3 "$OASES_SOURCE_DIR/models/make_oases_stacks.py" --out "$WORK/cm" --stack 512x2 --vocab 1024 --seq 256 >/dev/null \
  || fail "write the h512 stack"
CM=$WORK/cm/gpt_h512_l2_v1024_s256/model.onnx
"$P" "$CM" --gpus 2 --batch 8 --seq 256 --emulate-link bw=2,latency=10 --degrees 2 --chunks 1 --schedules plain --no-pipeline \
  --out "$WORK/cm.plan.json" >"$WORK/cm.slow.txt" || fail "plan collective matmuls"
grep -q "attn tp2+sp+cm mlp tp2+sp+cm" "$WORK/cm.slow.txt" || fail "no collective matmuls behind a slow link: $(grep -A1 '^  plan ' "$WORK/cm.slow.txt")"
/usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert sum(x.get('collective_matmul', False) for x in p['parts']) >= 4, p['parts']" \
  "$WORK/cm.plan.json" || fail "the plan file lacks the parts' collective matmuls"
"$P" "$CM" --gpus 2 --batch 8 --seq 256 --emulate-link bw=8,latency=10 --degrees 2 --chunks 1 --schedules plain --no-pipeline \
  >"$WORK/cm.fast.txt" || fail "plan behind a fast link"
grep -A1 '^  plan ' "$WORK/cm.fast.txt" | grep -q "+cm" && fail "collective matmuls behind a fast link: $(grep -A1 '^  plan ' "$WORK/cm.fast.txt")"
"$P" "$CM" --gpus 2 --batch 8 --seq 256 --emulate-link bw=2,latency=10 --degrees 2 --chunks 1 --schedules plain --no-pipeline \
  --no-collective-matmul | grep -A1 '^  plan ' | grep -q "+cm" && fail "--no-collective-matmul still decomposes"
"$T" "$CM" --synthetic --batch 8 --seq 256 --steps 2 -q --local-ranks 2 --plan "$WORK/cm.plan.json" >/dev/null || fail "train the collective-matmul plan"

# bad input
cluster() { printf '%s\n' "$1" >"$WORK/c.json"; }
LINKS='"links": {"intra_node": {"kind": "pcie", "bandwidth_gbps": 6.2, "latency_us": 10}, "inter_node": {"kind": "infiniband", "bandwidth_gbps": 12.5, "latency_us": 5}}'
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "RTX3090", "nodes": 2, '"$LINKS"'}'
expect_error "cluster without gpus_per_node" 'c.json.*missing field "gpus_per_node"' "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "RTX3090", "nodes": 2, "gpus_per_node": 4}'
expect_error "cluster without links" 'missing field "links"' "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "RTX3090", "nodes": 2, "gpus_per_node": 4, "links": {"intra_node": {"kind": "pcie", "bandwidth_gbps": -6, "latency_us": 10}, "inter_node": {"kind": "ib", "bandwidth_gbps": 12, "latency_us": 5}}}'
expect_error "negative bandwidth" 'intra_node.*bandwidth_gbps must be positive' "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "RTX3090", "nodes": 0, "gpus_per_node": 4, '"$LINKS"'}'
expect_error "zero nodes" '"nodes" must be at least 1' "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "TPU9", "nodes": 1, "gpus_per_node": 4, '"$LINKS"'}'
expect_error "unknown device" "unknown device 'TPU9'" "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": {"name": "g", "fp32_tflops": 10, "memory_gbps": 0, "memory_gib": 8}, "nodes": 1, "gpus_per_node": 4, '"$LINKS"'}'
expect_error "device without bandwidth" "memory_gbps must be positive" "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "RTX3090", "nodes": 1, "gpus_per_node": 2, '"$LINKS"'}'
expect_error "more GPUs than the cluster" "--gpus 4 but the cluster has 2 GPUs" "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "CPU", "nodes": 1, "gpus_per_node": 4, "cores_per_node": -2, '"$LINKS"'}'
expect_error "negative cores per node" "cores_per_node must be positive" "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
cluster '{"format": "oases-cluster", "version": 1, "name": "x", "device": "CPU", "nodes": 1, "gpus_per_node": 4, "threads_per_rank": 2, '"$LINKS"'}'
expect_error "threads per rank without cores" 'give "cores_per_node" too' "$P" "$M" --gpus 4 --cluster "$WORK/c.json" --out "$WORK/x.json"
expect_error "missing cluster file" "no such cluster file" "$P" "$M" --gpus 4 --cluster "$WORK/none.json" --out "$WORK/x.json"
expect_error "memory no plan fits" "no plan fits 0.0001 GiB per GPU: the least memory .* needs is [0-9.]+ [KM]iB \(give --memory [0-9.]+" \
  "$P" "$M" --gpus 4 --memory 0.0001 --out "$WORK/x.json"
# the least memory named is enough
least=$("$P" "$M" --gpus 4 --memory 0.0001 --out "$WORK/x.json" 2>&1 | sed -E 's/.*give --memory ([0-9.]+).*/\1/')
"$P" "$M" --gpus 4 --memory "$least" --out "$WORK/x.json" >/dev/null || fail "--memory $least (the least named) does not fit"
"$OASES_BIN/oases-profile" --backend cpu --out "$WORK/bare.json" --reps 1 --sizes 4096 >/dev/null || fail "oases-profile without a model"
expect_error "profile not covering the ops" "bare.json: the profile does not cover [0-9]+ of the [0-9]+ op shapes the planner prices \(.*MatMul [0-9]+.*; it measured no model .*measure them: oases-profile --backend cpu --model " \
  "$P" "$M" --gpus 4 --profile "$WORK/bare.json" --out "$WORK/x.json"
# the cost model's memory per rank against the built program's (parameters, moments, the activation
# arena) within 15% where a view of a gradient had been counted beside its source (1.17x until
# 2026-11-27): the bundled gpt2_4l, whole-block recomputation, tp 2 x dp 2
G=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
"$P" "$G" --gpus 4 --batch 16 --seq 64 --schedules default_checkpoint --chunks 1 --degrees 2 --uniform --no-pipeline --no-collective-matmul \
  --no-sequence-parallel --simulate --simulate-candidates 1 >"$WORK/mem_one.txt" 2>&1 || fail "oases-plan --simulate (memory)"
/usr/bin/python3 - "$WORK/mem_one.txt" <<'EOF' || fail "one-mesh memory model vs program"
import re, sys
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
got = [float(v) * units[u] for v, u in re.findall(r"^  plan\s+step .*memory ([0-9.]+) ([KMG]?i?B)", open(sys.argv[1]).read(), re.M)]
assert len(got) >= 2, open(sys.argv[1]).read()
r = got[0] / got[1]
assert 0.85 <= r <= 1.15, f"model {got[0] / 2**20:.2f} MiB, program {got[1] / 2**20:.2f} MiB ({r:.2f}x)"
print(f"ok memory: model {got[0] / 2**20:.2f} MiB, program {got[1] / 2**20:.2f} MiB ({r:.2f}x)")
EOF
printf '{"format": "oases-profile"' >"$WORK/broken.json"
expect_error "profile not JSON" "broken.json: not valid JSON" "$P" "$M" --gpus 4 --profile "$WORK/broken.json" --out "$WORK/x.json"
expect_error "gpus zero" "--gpus must be at least 1" "$P" "$M" --gpus 0 --out "$WORK/x.json"
finish
