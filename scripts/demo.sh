#!/usr/bin/env bash
# Sets up, builds and runs the main job on a bundled model: import a GPT-2-style model and run its
# forward pass against PyTorch's reference outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BIN=${OASES_BUILD_DIR:-build}/bin
MODEL=models/small/gpt2_tiny
"$BIN/oases-import" "$MODEL/model.onnx"
"$BIN/oases-run" "$MODEL/model.onnx" --data-set "$MODEL/test_data_set_0"
