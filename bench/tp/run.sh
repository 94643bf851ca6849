#!/usr/bin/env bash
# Tensor-parallel step time over MPI on CPU, and the bytes the collectives move per step checked
# against the analytic Megatron count: per block two all-reduces of the [B, T, C] activations in
# the forward pass and two in the backward pass.
#
#   bash bench/tp/run.sh [--hidden 256 --layers 4 --heads 8 --batch 8 --seq 128 --steps 12]
#
# Model: GPT-2-style, byte vocabulary (256), exported by models/export.py into build/bench/tp.
# On a 2-core machine tp=4 runs 4 processes on 2 cores: the table shows what that costs.
set -euo pipefail
cd "$(dirname "$0")/../.."
HIDDEN=256 LAYERS=4 HEADS=8 BATCH=8 SEQ=128 STEPS=12
while [[ $# -gt 0 ]]; do
  case $1 in
    --hidden) HIDDEN=$2; shift 2 ;; --layers) LAYERS=$2; shift 2 ;; --heads) HEADS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;; --seq) SEQ=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
done
BIN=${OASES_BUILD_DIR:-build}/bin
OUT=${OASES_BUILD_DIR:-build}/bench/tp/h${HIDDEN}_l${LAYERS}
mkdir -p "$OUT"
if [[ ! -f $OUT/model.onnx ]]; then
  /usr/bin/python3 models/export.py --family gpt2 --dynamic --hidden "$HIDDEN" --layers "$LAYERS" --heads "$HEADS" \
    --vocab 256 --max-pos "$SEQ" --no-data --out "$OUT" >/dev/null
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
printf "GPT-2-style model: hidden %s, %s layers, %s heads, batch %s x %s tokens, %s timed steps (median), %s cores\n" \
  "$HIDDEN" "$LAYERS" "$HEADS" "$BATCH" "$SEQ" "$STEPS" "$(nproc)"
printf "%-4s %12s %9s %12s %22s %22s %8s\n" tp "ms/step" "vs tp=1" "collectives" "fwd all-reduce bytes" "bwd all-reduce bytes" "check"
base=""
for tp in 1 2 4; do
  "$BIN/oases-plan" "$OUT/model.onnx" --tp $tp --batch "$BATCH" --seq "$SEQ" --out "$OUT/plan_tp$tp.json" >/dev/null
  rm -f "$OUT/log_tp$tp.jsonl"
  if [[ $tp == 1 ]]; then
    "$BIN/oases-train" "$OUT/model.onnx" --synthetic --batch "$BATCH" --seq "$SEQ" --steps $((STEPS + 2)) -q --log-json "$OUT/log_tp$tp.jsonl"
  else
    "${MPIRUN[@]}" -np $tp "$BIN/oases-train" "$OUT/model.onnx" --synthetic --batch "$BATCH" --seq "$SEQ" --steps $((STEPS + 2)) \
      --tp $tp -q --log-json "$OUT/log_tp$tp.jsonl"
  fi
  /usr/bin/python3 - "$OUT/plan_tp$tp.json" "$OUT/log_tp$tp.jsonl" "$tp" "$BATCH" "$SEQ" "$HIDDEN" "$LAYERS" "${base:-0}" <<'PY'
import json, statistics, sys
plan, log, tp, B, T, C, L, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8])
p = json.load(open(plan))
ms = statistics.median(json.loads(l)["ms"] for l in list(open(log))[2:])  # two warm-up steps
blocks = p["blocks"]
fwd = sum(c["payload_bytes"] for b in blocks for c in b["collectives"] if c["op"] == "AllReduce" and c["phase"] == "forward" and c["mesh_axis"] == "tp")
bwd = sum(c["payload_bytes"] for b in blocks for c in b["collectives"] if c["op"] == "AllReduce" and c["phase"] == "backward" and c["mesh_axis"] == "tp")
analytic = 0 if tp == 1 else 2 * L * B * T * C * 4
ok = fwd == analytic and bwd == analytic
ratio = "" if base == 0 else f"{base / ms:.2f}x"
print(f"{tp:<4} {ms:12.1f} {ratio:>9} {p['summary']['collectives_per_step']:12d} {fwd:>12d} ({analytic:>8d}) {bwd:>12d} ({analytic:>8d}) {'ok' if ok else 'MISMATCH':>8}")
open(log + ".ms", "w").write(str(ms))
if not ok:
    sys.exit(1)
PY
  [[ -z $base ]] && base=$(cat "$OUT/log_tp$tp.jsonl.ms")
done
echo "(bytes: measured from the plan's collectives, in parentheses the analytic Megatron count 2 x layers x B x T x C x 4)"
