#!/usr/bin/env bash
# A virtual environment in .venv with ONNX Runtime (benchmarks, and the test that exported models
# run under ONNX Runtime). Uses Debian's python3 with its numpy/onnx/torch (system site packages).
# Idempotent; when PyPI is unreachable the environment stays without onnxruntime and the tests that
# need it report themselves skipped. Then the cuDNN frontend headers (scripts/setup_cudnn_frontend.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv || { echo "setup_python: cannot create .venv"; exit 0; }
fi
if ! .venv/bin/python -c "import onnxruntime" 2>/dev/null; then
  # bounded: a slow or unreachable index costs minutes at most, never the CI run
  timeout -k 10 600 .venv/bin/pip install -q --disable-pip-version-check --timeout 30 --retries 2 "onnxruntime>=1.17" 2>&1 | tail -2 || true
fi
.venv/bin/python -c "import onnxruntime; print('setup_python: onnxruntime', onnxruntime.__version__)" 2>/dev/null \
  || echo "setup_python: onnxruntime unavailable (tests that need it will be skipped)"
# The cuDNN frontend headers (PyPI, like the above) for the CUDA build's fused attention.
bash scripts/setup_cudnn_frontend.sh
