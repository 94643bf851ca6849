#!/usr/bin/env bash
# Regenerates models/hf: tiny random Hugging Face GPT-2, LLaMA and BERT exported by optimum-cli
# (optimum 2.1.0, which pins transformers 4.57.6) and by torch 2.15's TorchScript exporter
# (transformers 5.23.0: 4.57.6's mask functions do not trace under torch 2.15), with ONNX Runtime's
# logits as the reference (models/export_hf.py says why) and PyTorch's gradients for the optimum exports. Needs models/.venv-torch
# (bash models/setup_export_env.sh) and network access for the two transformers versions, and .venv
# with onnxruntime (bash scripts/setup_python.sh).
set -euo pipefail
cd "$(dirname "$0")"
PY=.venv-torch/bin/python
pip() { "$PY" -m pip --disable-pip-version-check -q "$@"; }
rm -rf hf/optimum_* hf/torchscript_* hf/dynamo_*
mkdir -p hf
pip install "optimum[onnx]==2.1.0" "transformers==4.57.6"
"$PY" export_hf.py optimum hf
../.venv/bin/python export_hf.py reference hf
"$PY" export_hf.py grads hf
pip install "transformers==5.23.0"
"$PY" export_hf.py torchscript hf
../.venv/bin/python export_hf.py reference hf
# Qwen2, Mistral, GPT-NeoX, Gemma, Bloom, GPT-J, Falcon, DistilBERT, RoBERTa, ViT, T5 by both of
# torch's exporters (the same transformers), with ONNX Runtime's logits (checked against PyTorch's)
# and PyTorch's gradients mapped onto each graph's initializers (export_hf.py arch-*)
pip install onnxruntime
"$PY" export_hf.py arch-export hf
"$PY" export_hf.py arch-reference hf
"$PY" export_hf.py arch-grads hf
ls -la hf/*/model.onnx
