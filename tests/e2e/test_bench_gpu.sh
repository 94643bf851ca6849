#!/usr/bin/env bash
# bench/gpu/run.sh is ready for a GPU machine: here it must say that there is no CUDA device and
# exit 0 without measuring anything; bad options exit 2 with one line; and its whole pipeline
# (export, oases-train and its --profile run, the PyTorch modes, the report and bench.json) runs on
# the CPU backend at a tiny shape (--device cpu) and prints tokens/s, MFU and the ratios. Debian's
# torch 1.13 has neither scaled_dot_product_attention nor torch.compile: the eager row keeps the
# hand-written attention and says so, the compile row says "unavailable". A PyTorch mode that times
# out is a failed row of the JSON, not a crash. With a GPU present the real benchmark is not run
# here (minutes): run bash bench/gpu/run.sh by hand (or scripts/gpu_checks.sh).
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
expect_error "bad modes" "modes" bash "$RUN" --modes eager,jit
expect_error "bad compile scope" "compile-scope" bash "$RUN" --compile-scope layers
expect_error "bad steps" "steps" bash "$RUN" --steps 0
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  [[ $FAILURES -ne 0 ]] && finish
  echo "SKIPPED: /usr/bin/python3 has no PyTorch; the pipeline smoke test did not run"
  exit 77
fi
bash "$RUN" --device cpu --dtype fp32 --hidden 64 --layers 1 --seq 32 --batch 2 --vocab 256 --steps 3 --peak-tflops 0.1 \
  --out-dir "$WORK/bench" > "$WORK/table.txt" 2>&1 || fail "cpu pipeline smoke test failed: $(cat "$WORK/table.txt")"
cat "$WORK/table.txt"
for pat in "^oases +[0-9.]+ +[0-9]+ +[0-9.]+%" "^torch-eager +[0-9.]+ +[0-9]+ +[0-9.]+%" \
  "^torch-compile +(unavailable: torch [^ ]+ has no torch.compile|[0-9.]+ +[0-9]+ +[0-9.]+%)" \
  "oases / torch-eager throughput: [0-9.]+x" "^oases --profile \(2 steps.*kernels [0-9.]+ ms" "^  longest op types" \
  "^seconds: export [0-9]+, oases-train [0-9]+"; do
  grep -qE "$pat" "$WORK/table.txt" || fail "report lacks /$pat/"
done
/usr/bin/python3 - "$WORK/bench/bench.json" <<'PY' || fail "bench.json"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["device"] == "cpu" and len(b["stacks"]) == 1, b.keys()
s = b["stacks"][0]
assert s["stack"] == {"hidden": 64, "layers": 1, "heads": 1, "batch": 2, "seq": 32, "vocab": 256, "dtype": "fp32"}, s["stack"]
o, e = s["rows"]["oases"], s["rows"]["torch-eager"]
assert o["status"] == "ok" and o["steps_timed"] == 3 and o["device_peak_mib"] is None, o
assert e["status"] == "ok" and e["steps_timed"] == 3 and e["optimizer"].startswith("AdamW"), e
assert max(e["same_math"].values()) < 1e-4, e["same_math"]  # the swapped fast paths compute what models/transformer.py does
assert s["rows"]["torch-compile"]["status"] in ("ok", "unavailable"), s["rows"]["torch-compile"]
assert abs(s["oases_throughput_over"]["torch-eager"] - e["median_ms"] / o["median_ms"]) < 1e-9
p = s["profile"]
assert p["status"] == "ok" and p["steps"] == 2 and p["kernels_ms"] > 0 and p["top_ops"], p
assert abs(p["step_ms"] - p["kernels_ms"] - p["run_outside_kernels_ms"] - p["update_ms"]) < 1e-6, p
print("ok: bench.json")
PY
# a PyTorch mode that does not finish is a failed row, and the JSON is still written
/usr/bin/python3 "$OASES_SOURCE_DIR/bench/gpu/pytorch_ref.py" --device cpu --dtype fp32 --hidden 64 --layers 1 --heads 1 --seq 32 \
  --batch 2 --vocab 256 --steps 100000 --modes eager --mode-timeout 1 --out "$WORK/slow.json" 2>/dev/null ||
  fail "pytorch_ref.py with a mode timing out exited $?"
/usr/bin/python3 -c "
import json, sys
r = json.load(open('$WORK/slow.json'))['modes']['eager']
assert r['status'] == 'failed' and 'timed out' in r['reason'], r
print('ok: a mode past --mode-timeout:', r['reason'])" || fail "timed-out mode"
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
