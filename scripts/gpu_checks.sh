#!/usr/bin/env bash
# scripts/gpu_checks.sh: every check that needs a GPU, for a machine that has one (CI has none; there
# the GPU tests report SKIPPED). Builds nothing: point OASES_BIN at a CUDA build's bin folder
# (default build/bin; oases_gpu_tests is looked for there and in ../tests/bin).
#
#   1. oases-gpu-info: the libraries load, a device is seen
#   2. oases_gpu_tests: every committed model's forward and backward values on the GPU against the
#      CPU (fp32, bf16), the attention kernel, twenty training steps against the CPU
#   3. tests/e2e/test_gpu_train.sh: 30 steps of oases-train, fp32 and bf16, against the CPU
#   4. the forward pass of every committed model with test data (models/small, models/hf,
#      tests/data/models) on the GPU against its reference outputs (oases-run --device cuda, the
#      CPU's tolerances); a model with an op that has no CUDA kernel must be refused in one line
#   5. oases-train on the GPU against the CPU, 8 steps each, in the configurations the executor
#      treats differently: a schedule with chunks and recomputation, gradient accumulation, fp16 with
#      loss scaling, a checkpoint written on the GPU and resumed, a Hugging Face export
#
# Prints one line per check and a summary; exits 1 when any check fails, 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${OASES_BIN:-build/bin}
PY=${OASES_PYTHON:-python3}
export OASES_BIN=$BIN OASES_SOURCE_DIR=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
pass=0 failed=0 refused=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

echo "== 1. oases-gpu-info"
if "$BIN/oases-gpu-info"; then ok "oases-gpu-info"; else bad "oases-gpu-info"; fi
count=$("$BIN/oases-gpu-info" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["devices"]["count"])')
if [[ $count == 0 ]]; then
  echo "no CUDA device here: nothing to check"
  exit 0
fi

echo "== 2. oases_gpu_tests"
T=$BIN/oases_gpu_tests
[[ -x $T ]] || T=$BIN/../tests/bin/oases_gpu_tests
if "$T" --gtest_brief=1 >"$WORK/gtest.log" 2>&1; then ok "oases_gpu_tests ($(grep -E '^\[  PASSED' "$WORK/gtest.log"))"; else
  bad "oases_gpu_tests"
  grep -E 'Failure|FAILED' -A4 "$WORK/gtest.log" | head -40
fi

echo "== 3. tests/e2e/test_gpu_train.sh"
if bash tests/e2e/test_gpu_train.sh >"$WORK/e2e.log" 2>&1; then ok "test_gpu_train ($(grep worst "$WORK/e2e.log" | tr '\n' ';'))"; else
  bad "test_gpu_train"
  tail -20 "$WORK/e2e.log"
fi

echo "== 4. forward of every committed model on the GPU"
for d in models/small/*/ models/hf/*/ tests/data/models/*/; do
  d=${d%/}
  [[ -f $d/model.onnx && -d $d/test_data_set_0 && -f $d/test_data_set_0/output_0.pb ]] || continue
  out=$("$BIN/oases-run" "$d/model.onnx" --data-set "$d/test_data_set_0" --device cuda 2>&1)
  rc=$?
  if [[ $rc == 0 ]]; then
    ok "forward $d"
  elif [[ $rc == 2 && $(grep -c . <<<"$out") == 1 && $out == *"no CUDA kernel"* ]]; then
    echo "refused (no CUDA kernel): $d: $out"
    refused=$((refused + 1))
  else
    bad "forward $d (exit $rc): $(tail -5 <<<"$out")"
  fi
done

echo "== 5. oases-train on the GPU against the CPU"
M=models/train/gpt2_bytes/model.onnx
DATA=data/kjv_genesis.txt
train_pair() {  # NAME TOL MODEL ARGS...: 8 steps on each device, losses within TOL (relative)
  local name=$1 tol=$2 model=$3
  shift 3
  if ! "$BIN/oases-train" "$model" --steps 8 --seed 1 -q "$@" --log-json "$WORK/$name.cpu.jsonl" >"$WORK/$name.cpu.log" 2>&1; then
    bad "train $name: the CPU run failed: $(tail -3 "$WORK/$name.cpu.log")"
    return
  fi
  if ! "$BIN/oases-train" "$model" --steps 8 --seed 1 -q "$@" --device cuda --log-json "$WORK/$name.gpu.jsonl" >"$WORK/$name.gpu.log" 2>&1; then
    bad "train $name: the GPU run failed: $(tail -3 "$WORK/$name.gpu.log")"
    return
  fi
  local r
  if r=$("$PY" - "$WORK/$name" "$tol" <<'PY'
import json, sys
cpu = [json.loads(l)["loss"] for l in open(sys.argv[1] + ".cpu.jsonl")]
gpu = [json.loads(l)["loss"] for l in open(sys.argv[1] + ".gpu.jsonl")]
assert len(cpu) == len(gpu) and cpu, (len(cpu), len(gpu))
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
print(f"worst relative loss difference {worst:.2e} over {len(cpu)} steps (tolerance {sys.argv[2]})")
sys.exit(0 if worst <= float(sys.argv[2]) else 1)
PY
  ); then ok "train $name: $r"; else bad "train $name: $r"; fi
}
BASE=(--data "$DATA" --batch 4 --seq 64 --lr 3e-3)
train_pair oases_chunks 1e-3 "$M" "${BASE[@]}" --schedule oases --chunks 2
train_pair grad_accum 1e-3 "$M" "${BASE[@]}" --grad-accum 2
train_pair fp16 3e-2 "$M" "${BASE[@]}" --dtype fp16
train_pair llama 1e-3 models/hf/torchscript_llama/model.onnx --synthetic --batch 2 --seq 16 --lr 1e-3
train_pair qwen2_dynamo 1e-3 models/hf/dynamo_qwen2/model.onnx --synthetic --batch 2 --seq 16 --lr 1e-3
train_pair roberta 1e-3 models/hf/torchscript_roberta/model.onnx --synthetic --batch 2 --seq 16 --lr 1e-3
train_pair dropout 1e-3 models/train/gpt2_dropout/model.onnx "${BASE[@]}"

# a checkpoint written on the GPU, resumed on the GPU: the same losses as one run through
if "$BIN/oases-train" "$M" "${BASE[@]}" --steps 8 --seed 1 -q --device cuda --log-json "$WORK/straight.jsonl" >/dev/null 2>&1 &&
  "$BIN/oases-train" "$M" "${BASE[@]}" --steps 8 --stop-after 4 --seed 1 -q --device cuda --save "$WORK/ck" >/dev/null 2>&1 &&
  "$BIN/oases-train" "$M" "${BASE[@]}" --steps 8 --seed 1 -q --device cuda --resume "$WORK/ck" --log-json "$WORK/resumed.jsonl" >/dev/null 2>&1; then
  if r=$("$PY" - "$WORK" <<'PY'
import json, sys
a = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1] + "/straight.jsonl"))}
b = {j["step"]: j["loss"] for j in map(json.loads, open(sys.argv[1] + "/resumed.jsonl"))}
assert b and set(b) <= set(a), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in b)
print(f"steps {min(b)}-{max(b)} after resuming: worst relative loss difference {worst:.2e}")
sys.exit(0 if worst <= 1e-4 else 1)
PY
  ); then ok "resume on the GPU: $r"; else bad "resume on the GPU: $r"; fi
else
  bad "resume on the GPU: a run failed"
fi

echo "== $pass passed, $failed failed, $refused refused for want of a CUDA kernel"
[[ $failed == 0 ]]
