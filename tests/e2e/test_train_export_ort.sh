#!/usr/bin/env bash
# The model exported with trained weights loads and runs under ONNX Runtime, gives the outputs
# oases-run gives, and differs from the untrained model (the weights really changed).
source "$(dirname "$0")/lib.sh"
PY=$OASES_SOURCE_DIR/.venv/bin/python
if [[ ! -x $PY ]] || ! "$PY" -c "import onnxruntime" 2>/dev/null; then
  echo "SKIPPED: onnxruntime is not installed (scripts/setup_python.sh installs it)"
  exit 77
fi
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
"$OASES_BIN/oases-train" "$MODEL" --data "$OASES_SOURCE_DIR/data/kjv_genesis.txt" --steps 5 --batch 2 --seq 16 -q \
  --export-onnx "$WORK/trained.onnx" || fail "training/export failed"
"$PY" - "$MODEL" "$WORK/trained.onnx" "$WORK" <<'PY' || fail "ONNX Runtime check failed"
import sys, numpy as np, onnxruntime as ort, onnx
from onnx import numpy_helper
orig, trained, work = sys.argv[1:4]
ids = (np.arange(2 * 16).reshape(2, 16) * 7 % 256).astype(np.int64)
a = ort.InferenceSession(orig, providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
b = ort.InferenceSession(trained, providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
assert a.shape == b.shape == (2, 16, 256)
assert np.isfinite(b).all()
assert np.abs(a - b).max() > 1e-3, "trained weights did not change the outputs"
import os
os.makedirs(f"{work}/ds", exist_ok=True)
open(f"{work}/ds/input_0.pb", "wb").write(numpy_helper.from_array(ids, "input_ids").SerializeToString())
open(f"{work}/ds/output_0.pb", "wb").write(numpy_helper.from_array(b, "logits").SerializeToString())
print("ONNX Runtime ran the exported model; max change in logits", float(np.abs(a - b).max()))
PY
"$OASES_BIN/oases-run" "$WORK/trained.onnx" --data-set "$WORK/ds" || fail "oases-run disagrees with ONNX Runtime on the exported model"
finish
