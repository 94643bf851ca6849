#!/usr/bin/env bash
# Training step time of Oases (oases-train) against PyTorch on CPU, side by side: Debian's PyTorch
# 1.13 and PyTorch 2.x from PyPI (eager and torch.compile; build/bench-venv, set up on the first run
# by bench/train/setup_torch2.sh); prints the ratios, each one's peak memory and share of the
# OpenBLAS sgemm roof measured in the same run. Exports the models once into build/bench-models
# (or $OASES_BENCH_CACHE).
#   bash bench/train/run.sh [--shapes gpt-mini,gpt2-small] [--rounds 2] [--steps N] [--threads 2]
#                           [--no-torch2] [--no-compile] [--blas-core SkylakeX]
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -x build/bin/oases-train ]] || { echo "build first: cmake -S . -B build -G Ninja && cmake --build build -j2" >&2; exit 2; }
/usr/bin/python3 -c "import torch, onnx, numpy" 2>/dev/null || { echo "needs Debian's python3-torch, python3-onnx and python3-numpy" >&2; exit 2; }
torch2=1
for arg in "$@"; do
  case $arg in --no-torch2|--torch2-python|--torch2-python=*|-h|--help) torch2=0 ;; esac
done
if (( torch2 )); then
  bash bench/train/setup_torch2.sh >&2 \
    || { echo "PyTorch 2.x peer unavailable (see above; bench/train/setup_torch2.sh), --no-torch2 runs without it" >&2; exit 2; }
fi
exec /usr/bin/python3 bench/train/bench_train.py "$@"
