#!/usr/bin/env python3
"""Tiny random Hugging Face models (GPT-2, LLaMA with grouped-query attention, BERT, OPT, Phi; hidden 64,
2 layers, 4 heads, vocabulary 128, seed 0) exported as users export them (models/make_hf.sh runs it):
  optimum DIR      optimum-cli export onnx (opset 18)              -> DIR/optimum_NAME/model.onnx
  torchscript DIR  torch.onnx.export(dynamo=False, opset 17, dynamic batch and sequence)
                                                                    -> DIR/torchscript_NAME/model.onnx
  grads DIR        PyTorch's gradients for the optimum exports (DIR/optimum_*/grads; see grads())
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
    for d in sorted(os.listdir(work)):
        path = os.path.join(work, d, "model.onnx")
        if not os.path.exists(path):
            continue
        rng = np.random.default_rng(sum(map(ord, d)))  # per model: stable whatever else the folder holds
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


def grads(work):
    """PyTorch's gradients for the optimum exports (run with the transformers that exported them):
    the mean next-token cross-entropy of the logits at test_data_set_0 (targets input_ids[:, 1:], the
    last position dropped), as oases-train --inputs appends it, one TensorProto per initializer of the
    graph in grads/. Initializers the exporter merged (equal tensors stored once: a fresh model's
    zero biases, unit norm scales) get the sum of their parameters' gradients, as the graph shares
    them; a head the exporter folded into a transposed copy of the embedding is the embedding's, and
    a linear layer's weight the exporter stored transposed (exporter-named) gets the transposed
    gradient."""
    import glob
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper
    models = tiny_models()
    for name, (model, _) in models.items():
        d = os.path.join(work, "optimum_" + name)
        if not os.path.isdir(d):
            continue
        model.eval()
        # nn.Embedding's padding_idx (no gradient into the padding token's row) is not in the ONNX
        # graph, which is a plain Gather: the reference is the graph's gradient
        for mod in model.modules():
            if isinstance(mod, torch.nn.Embedding):
                mod.padding_idx = None
        feeds = {}
        for f in sorted(glob.glob(os.path.join(d, "test_data_set_0", "input_*.pb"))):
            t = onnx.load_tensor(f)
            feeds[t.name] = torch.from_numpy(numpy_helper.to_array(t).copy())
        logits = model(**feeds).logits
        ids = feeds["input_ids"]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        params = dict(model.named_parameters())
        graph = onnx.load(os.path.join(d, "model.onnx")).graph
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        out = os.path.join(d, "grads")
        os.makedirs(out, exist_ok=True)
        k = 0
        for iname, value in inits.items():
            if value.dtype != np.float32 or value.ndim == 0:
                continue
            # the parameters this initializer stands for: itself, and those of equal value the
            # exporter stored under its name
            own = [iname] if iname in params else []
            merged = [n for n, p in params.items() if n not in inits and tuple(p.shape) == value.shape
                      and np.array_equal(p.detach().numpy(), value)]
            if own or merged:
                g = sum(params[n].grad.numpy() for n in own + merged)
            else:
                # an exporter-made copy: nn.Linear's weight stored transposed for MatMul
                src = [n for n, p in params.items() if p.ndim == 2 and tuple(p.shape[::-1]) == value.shape
                       and np.array_equal(p.detach().numpy().T, value)]
                if len(src) != 1 or src[0] in inits:
                    continue  # a transposed copy of an initializer the graph has: the folded tie (Oases re-ties it)
                g = params[src[0]].grad.numpy().T
            open(os.path.join(out, f"grad_{k}.pb"), "wb").write(numpy_helper.from_array(g.astype(np.float32), iname).SerializeToString())
            k += 1
        print(f"{name}: loss {loss.item():.6f}, {k} gradients")


if __name__ == "__main__":
    {"optimum": optimum, "torchscript": torchscript, "reference": reference, "grads": grads}[sys.argv[1]](sys.argv[2])
