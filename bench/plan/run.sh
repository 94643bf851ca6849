#!/usr/bin/env bash
# Planning speed: oases-plan on a 96-layer GPT (hidden 12288, GPT-3 175B's shape, vocabulary padded
# to 50304 as Megatron pads GPT-2's) for 64 GPUs (8 DGX A100, clusters/a100_dgx_64.json), batch 64 x
# 1024 tokens, every schedule, chunks 1/2/4/8, per-part tp x dp with sequence parallelism and
# collective matmuls, under the 80 GiB memory limit. The model is written with shapes only (weights
# as sparse external data that planning never reads). Two commands, each from a fresh process and
# each writing the plan file (the partitioned program of the 64 ranks):
#   one mesh     oases-plan MODEL --gpus 64 ... --no-pipeline --out plan.json   (target: under 1 s)
#   with stages  oases-plan MODEL --gpus 64 ... --out plan.json                 (the pipeline search too)
# Prints the median wall time of each, the median of each phase oases-plan reports (its "phases:"
# line: import, analysis, one-mesh search, baselines, pipeline search, simulation, plan file) and
# the one-mesh search's work (transitions, labels, bounding transitions: what tests guard).
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
printf "model: %s (%s layers, hidden %s), %s GPUs of clusters/a100_dgx_64.json, batch 64 x 1024, %s runs, %s cores (load average %s)\n" \
  "$M" "$LAYERS" "$HIDDEN" "$GPUS" "$RUNS" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
PHASES=(import analysis search baselines "pipeline search" simulation "plan file")
# bench NAME EXTRA_ARGS...: RUNS fresh processes; the wall times and each phase's median
bench() {
  local name=$1
  shift
  local walls=() txt=$OUT/$name.txt
  declare -A ph=()
  for ((r = 0; r < RUNS; ++r)); do
    local t0 t1
    t0=$(date +%s.%N)
    "$BUILD/bin/oases-plan" "$M" --gpus "$GPUS" --cluster clusters/a100_dgx_64.json --batch 64 --seq 1024 --max-memory 64G "$@" \
      --out "$OUT/$name.json" >"$txt"
    t1=$(date +%s.%N)
    walls+=("$(echo "($t1 - $t0) * 1000" | bc -l)")
    local entries e key val
    IFS=',' read -ra entries <<<"$(sed -n 's/^  phases: //p' "$txt")"
    for e in "${entries[@]}"; do  # "pipeline search 288 ms"
      e=${e# }
      key=${e% * ms}
      val=${e% ms}
      ph[$key]+="${val##* } "
    done
  done
  printf "%-12s median %5.0f ms (runs: %s ms)\n" "$name" "$(median "${walls[@]}")" "$(printf '%.0f ' "${walls[@]}")"
  local line="" p
  for p in "${PHASES[@]}"; do
    # shellcheck disable=SC2086
    line+="$(printf '%s %.0f, ' "$p" "$(median ${ph[$p]})")"
  done
  printf "%-12s phases (median ms): %s\n" "" "${line%, }"
}
bench one_mesh --no-pipeline
grep -E '^  (op times|plan |Megatron|data parallel|  )' "$OUT/one_mesh.txt"
grep -E "^  search: " "$OUT/one_mesh.txt"
bench with_stages
grep -E "^  (pipeline |chosen)" "$OUT/with_stages.txt"
