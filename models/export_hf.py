#!/usr/bin/env python3
"""Tiny random Hugging Face models (GPT-2, LLaMA with grouped-query attention, BERT, OPT, Phi; hidden 64,
2 layers, 4 heads, vocabulary 128, seed 0) exported as users export them (models/make_hf.sh runs it):
  optimum DIR      optimum-cli export onnx (opset 18)              -> DIR/optimum_NAME/model.onnx
  torchscript DIR  torch.onnx.export(dynamo=False, opset 17, dynamic batch and sequence)
                                                                    -> DIR/torchscript_NAME/model.onnx
  reference DIR    ONNX Runtime's logits for each model, batch 2 x 16 with row 1 padded from position
                   12 (DIR/*/test_data_set_0). The reference is ONNX Runtime's, not PyTorch's: the
                   TorchScript exporter's trace of transformers' mask functions does not reproduce
                   PyTorch's own logits (ONNX Runtime and Oases agree with each other on the graph).
The first two run in models/.venv-torch (with transformers and optimum), the third where onnxruntime is."""
import os
import subprocess
import sys


def tiny_models():
    import torch
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, OPTConfig,
                              OPTForCausalLM, PhiConfig, PhiForCausalLM)
    torch.manual_seed(0)
    return {
        "gpt2": (GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)), "text-generation"),
        "llama": (LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)), "text-generation"),
        "bert": (BertForMaskedLM(BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                            vocab_size=128, max_position_embeddings=64)), "fill-mask"),
        # learned positions with an offset, ReLU, the embedding tied to the head (three readers of one weight)
        "opt": (OPTForCausalLM(OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                         max_position_embeddings=64, word_embed_proj_dim=64)), "text-generation"),
        # attention and MLP side by side on one LayerNorm, partial rotary positions, biases everywhere
        "phi": (PhiForCausalLM(PhiConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                         max_position_embeddings=64)), "text-generation"),
    }


def optimum(work):
    import tempfile
    cli = os.path.join(os.path.dirname(sys.executable), "optimum-cli")
    for name, (model, task) in tiny_models().items():
        model.eval()
        with tempfile.TemporaryDirectory() as src:
            model.save_pretrained(src)
            out = os.path.join(work, "optimum_" + name)
            # optimum validates with ONNX Runtime afterwards; the model is written before that step
            subprocess.run([cli, "export", "onnx", "--model", src, "--task", task, out], capture_output=True)
        if not os.path.exists(os.path.join(out, "model.onnx")):
            sys.exit(f"optimum-cli wrote no model for {name}")
        for extra in os.listdir(out):
            if extra != "model.onnx":
                os.remove(os.path.join(out, extra))


def torchscript(work):
    import torch
    for name, (model, task) in tiny_models().items():
        model.eval()

        class Logits(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask).logits

        # no key/value cache: the exported graph takes the whole sequence, as optimum's export above
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        ts = os.path.join(work, "torchscript_" + name)
        os.makedirs(ts, exist_ok=True)
        axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
        torch.onnx.export(Logits(model), (torch.randint(0, 128, (2, 16)), torch.ones(2, 16, dtype=torch.int64)),
                          os.path.join(ts, "model.onnx"), dynamo=False, opset_version=17, input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], dynamic_axes=axes)


def reference(work):
    import numpy as np
    import onnxruntime as ort
    from onnx import numpy_helper
    rng = np.random.default_rng(0)
    for d in sorted(os.listdir(work)):
        path = os.path.join(work, d, "model.onnx")
        if not os.path.exists(path):
            continue
        s = ort.InferenceSession(path)
        feeds = {}
        for i in s.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = rng.integers(0, 128, (2, 16)).astype(np.int64)
            elif i.name == "attention_mask":
                m = np.ones((2, 16), np.int64)
                m[1, 12:] = 0
                feeds[i.name] = m
            elif i.name == "position_ids":
                feeds[i.name] = np.tile(np.arange(16), (2, 1)).astype(np.int64)
            else:
                feeds[i.name] = np.zeros((2, 16), np.int64)
        out = s.run(None, feeds)[0]
        sd = os.path.join(work, d, "test_data_set_0")
        os.makedirs(sd, exist_ok=True)
        for k, (name, v) in enumerate(feeds.items()):
            open(os.path.join(sd, f"input_{k}.pb"), "wb").write(numpy_helper.from_array(v, name).SerializeToString())
        open(os.path.join(sd, "output_0.pb"), "wb").write(numpy_helper.from_array(out, "logits").SerializeToString())


if __name__ == "__main__":
    {"optimum": optimum, "torchscript": torchscript, "reference": reference}[sys.argv[1]](sys.argv[2])
