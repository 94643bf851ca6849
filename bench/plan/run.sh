#!/usr/bin/env bash
# Planning speed: oases-plan on a 96-layer GPT (hidden 12288, GPT-3 175B's shape, vocabulary padded
# to 50304 as Megatron pads GPT-2's) for 64 GPUs (8 DGX A100, clusters/a100_dgx_64.json), batch 64 x
# 1024 tokens, every schedule, chunks 1/2/4/8, per-part tp x dp with sequence parallelism, under the
# 80 GiB memory limit. The model is written with shapes only (weights as sparse external data that
# planning never reads). Prints the wall time of whole runs (import, training graph, analysis,
# search with the two baselines, plan file) and the search alone; target: under 1 s.
#
#   bash bench/plan/run.sh [--runs 5] [--gpus 64] [--layers 96] [--hidden 12288]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=5 GPUS=64 LAYERS=96 HIDDEN=12288
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) RUNS=$2; shift 2 ;; --gpus) GPUS=$2; shift 2 ;; --layers) LAYERS=$2; shift 2 ;; --hidden) HIDDEN=$2; shift 2 ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
done
BUILD=${OASES_BUILD_DIR:-build}
[[ -x $BUILD/bin/oases-plan ]] || { echo "build first: cmake --build $BUILD"; exit 2; }
OUT=$BUILD/bench/plan
M=$OUT/gpt_h${HIDDEN}_l${LAYERS}_v50304/model.onnx
[[ -f $M ]] || /usr/bin/python3 models/make_oases_stacks.py --out "$OUT" --stack "${HIDDEN}x${LAYERS}" --vocab 50304
printf "model: %s (%s layers, hidden %s), %s GPUs of clusters/a100_dgx_64.json, batch 64 x 1024, %s runs, %s cores\n" \
  "$M" "$LAYERS" "$HIDDEN" "$GPUS" "$RUNS" "$(nproc)"
walls=() searches=() pipes=() choose=()
for ((r = 0; r < RUNS; ++r)); do
  t0=$(date +%s.%N)
  "$BUILD/bin/oases-plan" "$M" --gpus "$GPUS" --cluster clusters/a100_dgx_64.json --batch 64 --seq 1024 >/dev/null
  t1=$(date +%s.%N)
  choose+=("$(echo "($t1 - $t0) * 1000" | bc -l)")
  t0=$(date +%s.%N)
  "$BUILD/bin/oases-plan" "$M" --gpus "$GPUS" --cluster clusters/a100_dgx_64.json --batch 64 --seq 1024 --max-memory 64G --out "$OUT/plan.json" >"$OUT/plan.txt"
  t1=$(date +%s.%N)
  walls+=("$(echo "($t1 - $t0) * 1000" | bc -l)")
  # the one-mesh search's line ("  search: N transitions priced in T ms"), not the pipeline search's
  searches+=("$(sed -nE 's/^  search: [0-9]+ transitions priced in ([0-9.]+) ms.*/\1/p' "$OUT/plan.txt")")
  pipes+=("$(sed -nE 's/^  pipeline search: [0-9]+ candidates priced in ([0-9.]+) ms.*/\1/p' "$OUT/plan.txt")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
sed -n '3,8p' "$OUT/plan.txt"
printf "choosing the plan (no --out): median %.0f ms (runs: %s ms)\n" "$(median "${choose[@]}")" "$(printf '%.0f ' "${choose[@]}")"
printf "with the plan file (--out, the partitioned program of %s ranks): median %.0f ms (runs: %s ms)\n" "$GPUS" "$(median "${walls[@]}")" \
  "$(printf '%.0f ' "${walls[@]}")"
printf "one-mesh search (the exact DP over every schedule and chunk count; the baselines' searches not included): median %.0f ms\n" "$(median "${searches[@]}")"
printf "pipeline search (every stage count, each on its own thread): median %.0f ms\n" "$(median "${pipes[@]:-0}")"
grep -E "^  search: " "$OUT/plan.txt"
