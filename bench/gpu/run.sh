#!/usr/bin/env bash
# GPU throughput: tokens/s, model-FLOPs utilisation (MFU = model FLOPs / (time x peak)) and peak
# device memory of GPT layer stacks trained by oases-train --device cuda and, in the same command,
# by PyTorch at its best (bench/gpu/pytorch_ref.py, the model of models/transformer.py that
# models/export.py exports, with PyTorch's fast paths swapped in): `torch-eager` (SDPA attention,
# fused AdamW) and `torch-compile` (the same under torch.compile), with oases's throughput over
# each. Then a short oases-train --profile run of each stack: kernels, the rest of the graph run
# (uploads, copies back, launch gaps), the host update, the longest op types.
#
#   bash bench/gpu/run.sh                 # two stacks: hidden 1024 x 24 layers, batch 8 x 1024 tokens;
#                                         # hidden 2048 x 24 (1.3 B parameters), batch 4 x 2048 tokens
#   bash bench/gpu/run.sh --all           # the paper's four stacks that fit one 80 GB GPU (1024/24,
#                                         # 2048/24, 3072/24, 4096/16; batch 8, 4, 2, 2 x 1024 tokens)
#   bash bench/gpu/run.sh --hidden 2048 --layers 24 --batch 4 --seq 2048   # one stack (defaults 1024/24/8/1024)
#        [--dtype bf16|fp16|fp32] [--steps 8] [--warmup 2] [--peak-tflops X] [--modes eager,compile[,manual]]
#        [--compile-scope blocks|model] [--mode-timeout 300] [--no-profile] [--out-dir DIR] [--serial]
#   bash bench/gpu/run.sh --device cpu --hidden 64 --layers 2 --seq 64 --batch 2 --vocab 256 --peak-tflops 0.1
#                                         # smoke test of the pipeline on the CPU backend (both sides on the CPU)
#
# Without a CUDA device (or in a build without CUDA) it prints why, measures nothing and exits 0.
# A side that fails (an out-of-memory oases-train, torch.compile unavailable, a timeout) is a row
# saying so, not the end of the bench. An oases-train that fails runs once more without the newest
# device fusions (OASES_NO_DEVICE_FUSION=$OASES_BENCH_RETRY_WITHOUT, default attention,gelu: those
# not yet run on a GPU when this was written), and its row and bench.json say so ("fallback"). Results: one table per stack on stdout; every number in
# OUT_DIR/bench.json (OUT_DIR: --out-dir, default ${OASES_BUILD_DIR:-build}/bench/gpu), each stack's
# files in OUT_DIR/hC_lL_bB_tT/. Exported models are cached in ${OASES_BENCH_MODELS:-OUT_DIR/models}.
#
# torch.compile: by default "regional compilation" (--compile-scope blocks: each block compiled in
# place, one graph for all blocks, and the final norm + LM head + loss as a second region), which
# compiles in a fraction of the time of --compile-scope model (the whole forward and loss as one
# graph; about a minute per 24-layer stack, more than this bench's budget for two stacks). A mode
# past --mode-timeout seconds is a failed row.
# Order, to spend little device time: the ONNX exports (CPU only: about 20 s for 1024/24 and a minute
# for 2048/24 on a fast host) run in the background while PyTorch measures every stack; oases-train
# runs after the exports, alone. --serial exports first, in the foreground.
#
# Model FLOPs per token, training (forward 1x + backward 2x): 6 N + 12 L T C, with N = 12 L C^2 + V C
# (attention 4C^2 and MLP 8C^2 per block, the tied LM head; biases, norms and the embedding lookups
# left out) and 12 L T C the attention scores and the weighted sum (Megatron/PaLM accounting, causal
# masking not discounted). The peak is the device's dense tensor-core rate for bf16/fp16 and its
# non-tensor-core rate for fp32 (TF32 is not used), from the device name, or --peak-tflops.
# Python: $OASES_PYTHON (default /usr/bin/python3, Debian's PyTorch) exports the model and runs the
# PyTorch side; point it at another interpreter whose torch has CUDA.
# Timings: median step time after --warmup untimed steps on both sides (torch.compile's first,
# compiling, step is one more), host-measured and step-synchronised. oases's peak device memory is
# the largest "device_peak_mib" of its --log-json lines (n/a where the build does not write it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
HIDDEN="" LAYERS="" BATCH="" SEQ="" VOCAB=50257 DTYPE=bf16 STEPS=8 WARMUP=2 PEAK="" DEVICE=cuda ALL=0
MODES=eager,compile SCOPE=blocks MODE_TIMEOUT=300 PROFILE=1 SERIAL=0 OUT_DIR=""
while [[ $# -gt 0 ]]; do
  case $1 in --all | --no-profile | --serial) ;; *) [[ $# -ge 2 ]] || { echo "error: $1 needs a value" >&2; exit 2; } ;; esac
  case $1 in
    --hidden) HIDDEN=$2; shift 2 ;; --layers) LAYERS=$2; shift 2 ;; --batch) BATCH=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;; --vocab) VOCAB=$2; shift 2 ;; --dtype) DTYPE=$2; shift 2 ;; --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;; --peak-tflops) PEAK=$2; shift 2 ;; --device) DEVICE=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;; --compile-scope) SCOPE=$2; shift 2 ;; --mode-timeout) MODE_TIMEOUT=$2; shift 2 ;;
    --out-dir) OUT_DIR=$2; shift 2 ;; --all) ALL=1; shift ;; --no-profile) PROFILE=0; shift ;; --serial) SERIAL=1; shift ;;
    *) echo "error: unknown option $1" >&2; exit 2 ;;
  esac
done
for v in HIDDEN LAYERS BATCH SEQ; do
  [[ -z ${!v} || ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: --${v,,} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for v in VOCAB STEPS WARMUP MODE_TIMEOUT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { n=${v,,}; echo "error: --${n//_/-} must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $DTYPE == bf16 || $DTYPE == fp16 || $DTYPE == fp32 ]] || { echo "error: --dtype must be bf16, fp16 or fp32, got '$DTYPE'" >&2; exit 2; }
[[ $DEVICE == cuda || $DEVICE == cpu ]] || { echo "error: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2; }
[[ -z $HIDDEN ]] || (( HIDDEN % 64 == 0 )) || { echo "error: --hidden must be a multiple of 64 (heads = hidden/64), got $HIDDEN" >&2; exit 2; }
[[ -z $PEAK || $PEAK =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "error: --peak-tflops must be a number, got '$PEAK'" >&2; exit 2; }
[[ $MODES =~ ^(eager|compile|manual)(,(eager|compile|manual))*$ ]] || { echo "error: --modes takes eager, compile, manual (comma-separated), got '$MODES'" >&2; exit 2; }
[[ $SCOPE == model || $SCOPE == blocks ]] || { echo "error: --compile-scope must be model or blocks, got '$SCOPE'" >&2; exit 2; }
BIN=${OASES_BIN:-${OASES_BUILD_DIR:-build}/bin}
PY=${OASES_PYTHON:-/usr/bin/python3}
# the device fusions left out of a second oases-train run when the first fails (graph/passes/fusion.h):
# those written since the last GPU run
RETRY_WITHOUT=${OASES_BENCH_RETRY_WITHOUT:-attention,gelu}
[[ -x $BIN/oases-train && -x $BIN/oases-gpu-info ]] || { echo "error: $BIN/oases-train or oases-gpu-info not found: build first (cmake -S . -B build && cmake --build build -j)" >&2; exit 2; }

if [[ -n $HIDDEN$LAYERS$BATCH$SEQ && $ALL == 1 ]]; then
  echo "error: --all runs its own stacks: leave out --hidden, --layers, --batch and --seq" >&2
  exit 2
elif [[ -n $HIDDEN$LAYERS$BATCH$SEQ ]]; then
  STACKS=("${HIDDEN:-1024} ${LAYERS:-24} ${BATCH:-8} ${SEQ:-1024}")
elif [[ $ALL == 1 ]]; then
  STACKS=("1024 24 8 1024" "2048 24 4 1024" "3072 24 2 1024" "4096 16 2 1024")
else
  STACKS=("1024 24 8 1024" "2048 24 4 2048")
fi

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
NAME=${NAME//_/ }

OUT_DIR=${OUT_DIR:-${OASES_BUILD_DIR:-build}/bench/gpu}
MODELS=${OASES_BENCH_MODELS:-$OUT_DIR/models}
mkdir -p "$OUT_DIR" "$MODELS" || exit 2
T0=$SECONDS
say() { echo "[bench/gpu $((SECONDS - T0)) s] $*" >&2; }
model_dir() { echo "$MODELS/h$1_l$2_v${VOCAB}_t$4"; }  # C L B T
stack_dir() { echo "$OUT_DIR/h$1_l$2_b$3_t$4"; }

export_stack() {  # C L B T: the ONNX model (cached); status in its folder's export.rc
  local md
  md=$(model_dir "$@")
  mkdir -p "$md"
  if [[ -f $md/model.onnx && $(cat "$md/export.rc" 2>/dev/null) == 0 ]]; then echo cached >"$md/export.s"; return 0; fi
  rm -f "$md/export.rc"
  local t=$SECONDS
  "$PY" models/export.py --family gpt2 --dynamic --hidden "$1" --layers "$2" --heads $(($1 / 64)) \
    --vocab "$VOCAB" --max-pos "$4" --no-data --out "$md" >"$md/export.log" 2>&1
  local rc=$?
  echo $((SECONDS - t)) >"$md/export.s"
  echo $rc >"$md/export.rc"
  return $rc
}

torch_stack() {  # C L B T
  local sd
  sd=$(stack_dir "$@")
  say "PyTorch ($MODES), hidden $1 x $2 layers, batch $3 x $4"
  "$PY" bench/gpu/pytorch_ref.py --hidden "$1" --layers "$2" --heads $(($1 / 64)) --batch "$3" --seq "$4" \
    --vocab "$VOCAB" --dtype "$DTYPE" --device "$DEVICE" --steps "$STEPS" --warmup "$WARMUP" --modes "$MODES" \
    --compile-scope "$SCOPE" --mode-timeout "$MODE_TIMEOUT" --out "$sd/torch.json" 2>"$sd/torch.log"
  local rc=$?
  cat "$sd/torch.log" >&2
  [[ $rc == 0 ]] || say "pytorch_ref.py exited $rc"
}

oases_stack() {  # C L B T
  local sd md
  sd=$(stack_dir "$@")
  md=$(model_dir "$@")
  if [[ $(cat "$md/export.rc" 2>/dev/null) != 0 ]]; then
    echo "the ONNX export failed: $(grep . "$md/export.log" 2>/dev/null | tail -1)" >"$sd/oases.reason"
    say "oases-train skipped: $(cat "$sd/oases.reason")"
    return
  fi
  # the same optimizer as the PyTorch side: AdamW, no weight decay, global-norm clip 1, constant lr;
  # no validation passes (--val-fraction 0: they are not timed, but they cost device time)
  local args=("$md/model.onnx" --synthetic --batch "$3" --seq "$4" --device "$DEVICE" --dtype "$DTYPE" --lr 1e-4 --no-cosine --clip 1
    --val-fraction 0)
  say "oases-train, hidden $1 x $2 layers, batch $3 x $4 ($((WARMUP + STEPS)) steps)"
  local t=$SECONDS without=()
  "$BIN/oases-train" "${args[@]}" --steps $((WARMUP + STEPS)) -q --log-json "$sd/oases.jsonl" >"$sd/oases.log" 2>&1
  echo $? >"$sd/oases.rc"
  echo $((SECONDS - t)) >"$sd/oases.s"
  if [[ $(cat "$sd/oases.rc") != 0 && -z ${OASES_NO_DEVICE_FUSION:-} ]]; then
    # a device fusion that has not run on a GPU before may be what failed: measured once more
    # without the newest ones (the row says so), so one fault does not cost the whole measurement
    say "oases-train failed: $(grep . "$sd/oases.log" | tail -1); once more with OASES_NO_DEVICE_FUSION=$RETRY_WITHOUT"
    echo "failed with every device fusion ($(grep . "$sd/oases.log" | tail -1)); measured with OASES_NO_DEVICE_FUSION=$RETRY_WITHOUT" \
      >"$sd/oases.fallback"
    mv "$sd/oases.log" "$sd/oases.failed.log"
    without=(env OASES_NO_DEVICE_FUSION="$RETRY_WITHOUT")
    t=$SECONDS
    "${without[@]}" "$BIN/oases-train" "${args[@]}" --steps $((WARMUP + STEPS)) -q --log-json "$sd/oases.jsonl" >"$sd/oases.log" 2>&1
    echo $? >"$sd/oases.rc"
    echo $((SECONDS - t)) >"$sd/oases.s"
  fi
  if [[ $(cat "$sd/oases.rc") != 0 ]]; then
    say "oases-train failed: $(grep . "$sd/oases.log" | tail -1)"
  elif [[ $PROFILE == 1 ]]; then
    say "oases-train --profile, 3 steps (the first not profiled)"
    t=$SECONDS
    "${without[@]}" "$BIN/oases-train" "${args[@]}" --steps 3 -q --profile --log-json "$sd/profile.jsonl" >"$sd/profile.txt" 2>&1
    echo $? >"$sd/profile.rc"
    echo $((SECONDS - t)) >"$sd/profile.s"
  fi
}

report_stack() {  # C L B T: the table (and summary.json) of a measured stack
  local sd
  sd=$(stack_dir "$@")
  echo
  "$PY" bench/gpu/report.py --out "$sd" --model-dir "$(model_dir "$@")" --hidden "$1" --layers "$2" --batch "$3" --seq "$4" \
    --vocab "$VOCAB" --dtype "$DTYPE" --warmup "$WARMUP" --device-name "$NAME" --peak-tflops "$PEAK" ||
    echo "error: report.py failed for $sd" >&2
}

combine() {  # bench.json from the stacks' summaries; $1: complete (true/false)
  local dirs=() s
  for s in "${STACKS[@]}"; do
    # shellcheck disable=SC2086
    dirs+=("$(stack_dir $s)")
  done
  OASES_BENCH_META=$(printf '{"date": "%s", "device": "%s", "dtype": "%s", "steps": %d, "warmup": %d, "modes": "%s", "compile_scope": "%s", "exports_in_background": %s, "complete": %s, "elapsed_s": %d}' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NAME" "$DTYPE" "$STEPS" "$WARMUP" "$MODES" "$SCOPE" "$([[ $SERIAL == 1 ]] && echo false || echo true)" "$1" $((SECONDS - T0))) \
    "$PY" bench/gpu/report.py --combine "$OUT_DIR/bench.json" "${dirs[@]}"
}

for s in "${STACKS[@]}"; do
  # shellcheck disable=SC2086
  sd=$(stack_dir $s)
  rm -rf "$sd"
  mkdir -p "$sd"
done
# stopped (a timeout around the bench): what was measured still goes into bench.json
stopped() {
  trap - TERM INT
  say "stopped: the tables of what was measured"
  for s in "${STACKS[@]}"; do
    # shellcheck disable=SC2086
    [[ -f $(stack_dir $s)/summary.json ]] || report_stack $s
  done
  combine false
  exit 143
}
trap stopped TERM INT

EXPORT_PID=""
if [[ $SERIAL == 1 ]]; then
  for s in "${STACKS[@]}"; do
    say "exporting $s (hidden layers batch seq)"
    # shellcheck disable=SC2086
    export_stack $s || say "export of $s failed"
  done
else
  say "exporting the models in the background (${#STACKS[@]} stacks)"
  (
    trap - TERM INT
    for s in "${STACKS[@]}"; do
      # shellcheck disable=SC2086
      export_stack $s
    done
  ) &
  EXPORT_PID=$!
fi
for s in "${STACKS[@]}"; do
  # shellcheck disable=SC2086
  torch_stack $s
done
if [[ -n $EXPORT_PID ]]; then
  say "waiting for the exports"
  wait "$EXPORT_PID"
  say "exports done"
fi
for s in "${STACKS[@]}"; do
  # shellcheck disable=SC2086
  oases_stack $s
  # shellcheck disable=SC2086
  report_stack $s
done
combine true
echo
echo "bench/gpu: $((SECONDS - T0)) s; every number in $OUT_DIR/bench.json"
