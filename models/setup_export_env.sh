#!/usr/bin/env bash
# Creates models/.venv-torch: a current PyTorch (CPU wheel) with onnx and onnxscript, for exports with
# the dynamo exporter (torch.onnx.export(..., dynamo=True) → opset 18+, IR 10) and the new torch's
# TorchScript exporter. Debian's python3-torch 1.13 stays the other exporter (no venv needed).
# Idempotent. Needs network access once; export scripts run offline afterwards.
#   OASES_TORCH_SPEC  pip requirement for torch (default: torch, the newest CPU wheel)
#   OASES_TORCH_INDEX index URL for the CPU wheel (default: https://download.pytorch.org/whl/cpu)
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv-torch
SPEC=${OASES_TORCH_SPEC:-torch}
INDEX=${OASES_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PY=${OASES_EXPORT_PYTHON:-/usr/bin/python3}
if [[ ! -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  pip install --upgrade pip
  # The CPU index first (small wheel, no CUDA libraries); PyPI as the fallback (its Linux wheel pulls
  # the CUDA libraries in too, a few GB, unused here: exports run on the CPU).
  pip install --retries 1 --timeout 20 --index-url "$INDEX" "$SPEC" 2>/dev/null || {
    echo "setup_export_env: $INDEX unreachable, installing $SPEC from PyPI"
    pip install "$SPEC"
  }
fi
"$VENV/bin/python" -c "import onnx, onnxscript" 2>/dev/null || pip install onnx onnxscript numpy
"$VENV/bin/python" - <<'PY'
import torch, onnx, onnxscript, numpy
print(f"setup_export_env: torch {torch.__version__}, onnx {onnx.__version__}, onnxscript {onnxscript.__version__}, numpy {numpy.__version__}")
PY
