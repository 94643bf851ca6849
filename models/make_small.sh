#!/usr/bin/env bash
# Regenerates the committed test models under models/small/ (model.onnx, test_data_set_*/,
# grads/, info.json, expect.txt), deterministically: fixed seeds, fixed exporter versions.
#   bash models/make_small.sh            all of them
#   bash models/make_small.sh NAME ...   only these
# Two exporters: Debian's python3-torch 1.13 (/usr/bin/python3, TorchScript exporter) and a current
# torch in models/.venv-torch (bash models/setup_export_env.sh; dynamo exporter and the new torch's
# TorchScript path). The versions that made the committed files are in each info.json; another
# torch version may write different (equally valid) graphs.
set -euo pipefail
cd "$(dirname "$0")"
OLD=${OASES_OLD_TORCH_PYTHON:-/usr/bin/python3}
NEW=${OASES_NEW_TORCH_PYTHON:-.venv-torch/bin/python}
export PYTHONHASHSEED=0 CUBLAS_WORKSPACE_CONFIG=:4096:8 CUDA_VISIBLE_DEVICES=""

want=("$@")
selected() {
  [[ ${#want[@]} -eq 0 ]] && return 0
  local w
  for w in "${want[@]}"; do [[ $w == "$1" ]] && return 0; done
  return 1
}

gen() {  # gen NAME PYTHON export.py-arguments...
  local name=$1 py=$2
  shift 2
  selected "$name" || return 0
  if ! "$py" -c "import torch, onnx" 2>/dev/null; then
    echo "make_small: $py has no torch/onnx (for the current torch: bash models/setup_export_env.sh)" >&2
    exit 1
  fi
  rm -rf "small/$name"
  echo "== $name"
  "$py" export.py --out "small/$name" "$@"
}

# Debian's torch 1.13, TorchScript exporter
gen gpt2_tiny            "$OLD" --family gpt2
gen gpt2_loss            "$OLD" --family gpt2 --loss-inside
gen bert_mask            "$OLD" --family bert --attention-mask
gen llama_gqa            "$OLD" --family llama --heads 4 --kv-heads 2
gen gpt2_rms_gelu        "$OLD" --family gpt2 --norm rmsnorm --act gelu --tied no
gen gpt2_erf_opset14     "$OLD" --family gpt2 --act gelu --opset 14
gen bert_dynamic_opset16 "$OLD" --family bert --attention-mask --opset 16 --dynamic
# current torch, its TorchScript exporter at opset 20
gen gpt2_ts_opset20      "$NEW" --family gpt2 --act gelu --opset 20
# current torch, dynamo exporter
gen gpt2_dynamo          "$NEW" --exporter dynamo --family gpt2
gen llama_dynamo_dynamic "$NEW" --exporter dynamo --family llama --heads 4 --kv-heads 2 --dynamic
gen bert_dynamo_loss     "$NEW" --exporter dynamo --opset 20 --family bert --attention-mask --loss-inside --dynamic
echo "make_small: done"
