#!/usr/bin/env bash
# bench/gpu/run.sh is ready for a GPU machine: here it must say that there is no CUDA device and
# exit 0 without measuring anything; bad options exit 2 with one line; and its whole pipeline
# (export, oases-train, the PyTorch side, the report) runs on the CPU backend at a tiny shape
# (--device cpu) and prints tokens/s, MFU and the ratio. With a GPU present the real benchmark is
# not run here (minutes): run bash bench/gpu/run.sh by hand.
source "$(dirname "$0")/lib.sh"
RUN=$OASES_SOURCE_DIR/bench/gpu/run.sh
export OASES_BUILD_DIR=$(dirname "$OASES_BIN")
count=$("$OASES_BIN/oases-gpu-info" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"]["count"])')
if [[ "$count" == "0" ]]; then
  out=$(bash "$RUN" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "no-GPU run: exit code $rc, expected 0: $out"
  grep -q "nothing was measured" <<<"$out" || fail "no-GPU run does not say nothing was measured: $out"
  echo "ok: no GPU -> $out"
fi
expect_error "unknown option" "unknown option" bash "$RUN" --frobnicate 1
expect_error "bad dtype" "dtype" bash "$RUN" --dtype fp8
expect_error "bad hidden" "hidden" bash "$RUN" --hidden 100
expect_error "cpu without peak" "peak-tflops" bash "$RUN" --device cpu
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  [[ $FAILURES -ne 0 ]] && finish
  echo "SKIPPED: /usr/bin/python3 has no PyTorch; the pipeline smoke test did not run"
  exit 77
fi
bash "$RUN" --device cpu --dtype fp32 --hidden 64 --layers 1 --seq 32 --batch 2 --vocab 256 --steps 3 --peak-tflops 0.1 \
  > "$WORK/table.txt" 2>&1 || fail "cpu pipeline smoke test failed: $(cat "$WORK/table.txt")"
cat "$WORK/table.txt"
for pat in "^oases +[0-9.]+ +[0-9]+ +[0-9.]+%" "^pytorch +[0-9.]+ +[0-9]+ +[0-9.]+%" "oases / pytorch throughput: [0-9.]+x"; do
  grep -qE "$pat" "$WORK/table.txt" || fail "report lacks /$pat/"
done
# the FLOP count the MFU rests on: 6 N + 12 L T C, N = 12 L C^2 + V C
/usr/bin/python3 -c "
import sys; sys.path.insert(0, '$OASES_SOURCE_DIR/bench/gpu')
from report import model_flops_per_token as f
C, L, T, V = 1024, 24, 1024, 50257
N = 12 * L * C * C + V * C
assert N == 353_453_056, N
assert f(C, L, T, V) == 6 * N + 12 * L * T * C
" || fail "model FLOPs per token"
finish
