#!/usr/bin/env bash
# Forward time of Oases (oases-run's executor) against ONNX Runtime, side by side; prints the
# ratio and each one's share of the OpenBLAS sgemm roof measured in the same run. Exports the models once into build/bench-models (or $OASES_BENCH_CACHE).
#   bash bench/forward/run.sh [--shapes gpt-mini,gpt2-small] [--rounds 3] [--repeat 5] [--threads 2] [--blas-core SkylakeX]
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -x build/bin/oases-run ]] || { echo "build first: cmake -S . -B build -G Ninja && cmake --build build -j2" >&2; exit 2; }
[[ -x .venv/bin/python ]] && .venv/bin/python -c "import onnxruntime" 2>/dev/null \
  || { echo "ONNX Runtime missing: bash scripts/setup_python.sh" >&2; exit 2; }
/usr/bin/python3 -c "import numpy" 2>/dev/null || { echo "the sgemm roof needs Debian's python3-numpy (/usr/bin/python3)" >&2; exit 2; }
exec .venv/bin/python bench/forward/bench_forward.py "$@"
