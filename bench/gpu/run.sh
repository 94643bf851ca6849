#!/usr/bin/env bash
# GPU throughput: tokens/s and model-FLOPs utilisation (MFU = model FLOPs / (time x peak)) of the
# GPT layer stacks of the Oases paper (hidden/layers 1024/24, 2048/24, 3072/24, 4096/16; heads =
# hidden/64; sequence 1024; GPT-2 vocabulary 50257), trained by oases-train --device cuda and, in the
# same command, by PyTorch (bench/gpu/pytorch_ref.py: the same model definition, models/transformer.py,
# that models/export.py exports to ONNX), with the ratio printed. The paper's larger stacks (6144/16,
# 8192/8, 12288/4) do not fit one GPU with fp32 Adam state; they are tensor-parallel work.
#
#   bash bench/gpu/run.sh                      # stack 1024/24, batch 8
#   bash bench/gpu/run.sh --all                # the four stacks that fit one 80 GB GPU
#   bash bench/gpu/run.sh --hidden 2048 --layers 24 --batch 4 [--seq 1024] [--dtype bf16|fp16|fp32]
#                         [--steps 12] [--peak-tflops X]
#   bash bench/gpu/run.sh --device cpu --hidden 64 --layers 2 --seq 64 --batch 2 --vocab 256 --peak-tflops 0.1
#                         # smoke test of the pipeline on the CPU backend (both sides on the CPU)
#
# Without a CUDA device (or in a build without CUDA) it prints why, measures nothing and exits 0.
#
# Model FLOPs per token, training (forward 1x + backward 2x): 6 N + 12 L T C, with N = 12 L C^2 + V C
# (attention 4C^2 and MLP 8C^2 per block, the tied LM head; biases, norms and the embedding lookups
# left out) and 12 L T C the attention scores and the weighted sum (Megatron/PaLM accounting, causal
# masking not discounted). The peak is the device's dense tensor-core rate for bf16/fp16 and its
# non-tensor-core rate for fp32 (TF32 is not used), from the device name, or --peak-tflops.
# Python: $OASES_PYTHON (default /usr/bin/python3, Debian's PyTorch) exports the model and runs the
# PyTorch side; point it at another interpreter whose torch has CUDA.
# Timings: median step time of both sides after two warm-up steps (host-measured, step-synchronised).
set -euo pipefail
cd "$(dirname "$0")/../.."
HIDDEN=1024 LAYERS=24 BATCH=8 SEQ=1024 VOCAB=50257 DTYPE=bf16 STEPS=12 PEAK="" DEVICE=cuda ALL=0
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 || $1 == --all ]] || { echo "error: $1 needs a value" >&2; exit 2; }
  case $1 in
    --hidden) HIDDEN=$2; shift 2 ;; --layers) LAYERS=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;; --vocab) VOCAB=$2; shift 2 ;; --dtype) DTYPE=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;;
    --peak-tflops) PEAK=$2; shift 2 ;; --device) DEVICE=$2; shift 2 ;; --all) ALL=1; shift ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
for v in HIDDEN LAYERS BATCH SEQ VOCAB STEPS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: --${v,,} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $DTYPE == bf16 || $DTYPE == fp16 || $DTYPE == fp32 ]] || { echo "error: --dtype must be bf16, fp16 or fp32, got '$DTYPE'" >&2; exit 2; }
[[ $DEVICE == cuda || $DEVICE == cpu ]] || { echo "error: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2; }
(( HIDDEN % 64 == 0 )) || { echo "error: --hidden must be a multiple of 64 (heads = hidden/64), got $HIDDEN" >&2; exit 2; }
[[ -z $PEAK || $PEAK =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "error: --peak-tflops must be a number, got '$PEAK'" >&2; exit 2; }
BIN=${OASES_BIN:-${OASES_BUILD_DIR:-build}/bin}
PY=${OASES_PYTHON:-/usr/bin/python3}
[[ -x $BIN/oases-train && -x $BIN/oases-gpu-info ]] || { echo "error: $BIN/oases-train or oases-gpu-info not found: build first (cmake -S . -B build && cmake --build build -j)" >&2; exit 2; }

NAME="cpu"
if [[ $DEVICE == cuda ]]; then
  INFO=$("$BIN/oases-gpu-info" --json)
  read -r BUILT COUNT NAME REASON < <("$PY" -c '
import json, sys
j = json.loads(sys.stdin.read()); d = j["devices"]
print(int(j["built"]), d["count"], (d.get("names") or ["-"])[0].replace(" ", "_"), (d.get("error") or "-").replace(" ", "_"))' <<<"$INFO")
  if [[ $BUILT == 0 ]]; then
    echo "bench/gpu: this build has no CUDA backend (configured with -DOASES_CUDA=OFF or without nvcc); nothing was measured"
    exit 0
  fi
  if [[ $COUNT == 0 ]]; then
    echo "bench/gpu: no CUDA device here (${REASON//_/ }); nothing was measured"
    exit 0
  fi
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "error: a CUDA device is present but $PY's PyTorch cannot use it (install a CUDA build of torch); nothing was measured" >&2
    exit 2
  }
elif [[ -z $PEAK ]]; then
  echo "error: --device cpu needs --peak-tflops (the CPU's peak for MFU)" >&2
  exit 2
fi

run_stack() {  # hidden layers batch
  local C=$1 L=$2 B=$3 H=$(($1 / 64))
  local OUT=${OASES_BUILD_DIR:-build}/bench/gpu/h${C}_l${L}_v${VOCAB}_t${SEQ}
  mkdir -p "$OUT"
  if [[ ! -f $OUT/model.onnx ]]; then
    "$PY" models/export.py --family gpt2 --dynamic --hidden "$C" --layers "$L" --heads "$H" \
      --vocab "$VOCAB" --max-pos "$SEQ" --no-data --out "$OUT" >/dev/null
  fi
  rm -f "$OUT/oases.jsonl" "$OUT/torch.json"
  # the same optimizer on both sides: AdamW, no weight decay, global-norm clip 1, constant lr
  "$BIN/oases-train" "$OUT/model.onnx" --synthetic --batch "$B" --seq "$SEQ" --steps $((STEPS + 2)) --device "$DEVICE" \
    --dtype "$DTYPE" --lr 1e-4 --no-cosine --clip 1 -q --log-json "$OUT/oases.jsonl"
  "$PY" bench/gpu/pytorch_ref.py --hidden "$C" --layers "$L" --heads "$H" --batch "$B" --seq "$SEQ" \
    --vocab "$VOCAB" --dtype "$DTYPE" --device "$DEVICE" --steps $((STEPS + 2)) --out "$OUT/torch.json"
  "$PY" bench/gpu/report.py --out "$OUT" --hidden "$C" --layers "$L" --batch "$B" --seq "$SEQ" \
    --vocab "$VOCAB" --dtype "$DTYPE" --device-name "${NAME//_/ }" --peak-tflops "$PEAK"
}

if [[ $ALL == 1 ]]; then
  for s in "1024 24 8" "2048 24 4" "3072 24 2" "4096 16 2"; do
    # shellcheck disable=SC2086
    run_stack $s
    echo
  done
else
  run_stack "$HIDDEN" "$LAYERS" "$BATCH"
fi
