#!/usr/bin/env bash
# Training step time of Oases (oases-train) against PyTorch on CPU, side by side; prints the
# ratio and each one's peak memory. Exports the models once into build/bench-models (or
# $OASES_BENCH_CACHE).
#   bash bench/train/run.sh [--shapes gpt-mini,gpt2-small] [--rounds 2] [--steps N] [--threads 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -x build/bin/oases-train ]] || { echo "build first: cmake -S . -B build -G Ninja && cmake --build build -j2" >&2; exit 2; }
/usr/bin/python3 -c "import torch, onnx" 2>/dev/null || { echo "needs Debian's python3-torch and python3-onnx" >&2; exit 2; }
exec /usr/bin/python3 bench/train/bench_train.py "$@"
