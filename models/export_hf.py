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



# --- architectures beyond models/hf's first five (issue 16) --------------------------------------
# Tiny random models (hidden 16, 2 layers, 4 heads, vocabulary 128, seed 0), exported by torch's
# dynamo exporter (opset 20, IR 10, static batch 2 x 16, the exporter's own optimisation as users
# get it) and its TorchScript exporter (opset 17, dynamic batch and sequence). Every parameter is
# nudged off its initial value so that no two are equal (exporters store equal tensors once, and a
# fresh model's unit norm scales and zero biases are all equal), so the graph holds PyTorch's
# parameters one for one.
TEXT, IMAGE, SEQ2SEQ = "text", "image", "seq2seq"


def arch_models():
    import torch
    import transformers as tf
    h = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, vocab_size=128, max_position_embeddings=64)
    specs = {
        # grouped-query attention with q/k/v biases
        "qwen2": lambda: (tf.Qwen2ForCausalLM(tf.Qwen2Config(intermediate_size=32, num_key_value_heads=2, **h)), TEXT),
        "mistral": lambda: (tf.MistralForCausalLM(tf.MistralConfig(intermediate_size=32, num_key_value_heads=2, sliding_window=None, **h)), TEXT),
        # attention and MLP side by side on one residual, partial rotary, fused qkv
        "gpt_neox": lambda: (tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(intermediate_size=32, rotary_pct=0.5, **h)), TEXT),
        # multi-query (one key/value head), (1 + w) RMSNorm, embedding scaled by sqrt(hidden)
        "gemma": lambda: (tf.GemmaForCausalLM(tf.GemmaConfig(intermediate_size=32, num_key_value_heads=1, head_dim=4, **h)), TEXT),
        # ALiBi
        "bloom": lambda: (tf.BloomForCausalLM(tf.BloomConfig(hidden_size=16, n_layer=2, n_head=4, vocab_size=128)), TEXT),
        # rotary on interleaved pairs of the first rotary_dim channels, parallel attention + MLP
        "gptj": lambda: (tf.GPTJForCausalLM(tf.GPTJConfig(n_embd=16, n_layer=2, n_head=4, vocab_size=128, n_positions=64, rotary_dim=4)), TEXT),
        # multi-query, parallel attention + MLP
        "falcon": lambda: (tf.FalconForCausalLM(tf.FalconConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                                                 multi_query=True, parallel_attn=True, new_decoder_architecture=False,
                                                                 alibi=False, bias=False)), TEXT),
        "distilbert": lambda: (tf.DistilBertForMaskedLM(tf.DistilBertConfig(dim=16, hidden_dim=32, n_layers=2, n_heads=4, vocab_size=128,
                                                                            max_position_embeddings=64)), TEXT),
        "roberta": lambda: (tf.RobertaForMaskedLM(tf.RobertaConfig(intermediate_size=32, hidden_size=16, num_hidden_layers=2,
                                                                   num_attention_heads=4, vocab_size=128, max_position_embeddings=66)), TEXT),
        # patch embedding: Conv with stride = kernel
        "vit": lambda: (tf.ViTForImageClassification(tf.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
                                                                  image_size=16, patch_size=4, num_channels=3, num_labels=10)), IMAGE),
        # encoder-decoder with a relative position bias table
        "t5": lambda: (tf.T5ForConditionalGeneration(tf.T5Config(d_model=16, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=4,
                                                                 vocab_size=128, relative_attention_num_buckets=8)), SEQ2SEQ),
    }
    only = os.environ.get("OASES_ARCH")
    out = {}
    for name, make in specs.items():
        if only and name not in only.split(","):
            continue
        torch.manual_seed(0)
        model, kind = make()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=g))
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        model.eval()
        out[name] = (model, kind)
    return out


def arch_feeds(name, kind):
    """The inputs of test_data_set_0 (numpy), by name, in the graph's input order."""
    import numpy as np
    rng = np.random.default_rng(sum(map(ord, name)))
    if kind == IMAGE:
        return {"pixel_values": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    ids = rng.integers(2, 128, (2, 16)).astype(np.int64)  # not RoBERTa's padding id 1
    mask = np.ones((2, 16), np.int64)
    if kind == SEQ2SEQ:
        dec = rng.integers(2, 128, (2, 16)).astype(np.int64)
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}
    return {"input_ids": ids, "attention_mask": mask}


def arch_labels(name):
    """An image classifier's class labels at test_data_set_0 (int64 [2], written as labels.pb beside
    the inputs: oases-train --inputs reads them as the targets of the loss it appends)."""
    import numpy as np
    return np.random.default_rng(sum(map(ord, name)) + 1).integers(0, 10, (2,)).astype(np.int64)


def _wrapped(model, kind):
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            if kind == IMAGE:
                return self.m(pixel_values=args[0]).logits
            if kind == SEQ2SEQ:
                return self.m(input_ids=args[0], attention_mask=args[1], decoder_input_ids=args[2]).logits
            return self.m(input_ids=args[0], attention_mask=args[1]).logits

    return Logits(model)


def arch_export(work):
    """dynamo_NAME and torchscript_NAME for every architecture torch can export; what fails is
    written to DIR/NAME.export_failed (one line) instead."""
    import traceback
    import torch
    for name, (model, kind) in arch_models().items():
        feeds = arch_feeds(name, kind)
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        names = list(feeds)
        for exporter in ("dynamo", "torchscript"):
            d = os.path.join(work, f"{exporter}_{name}")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "model.onnx")
            try:
                if exporter == "dynamo":
                    prog = torch.onnx.export(_wrapped(model, kind), args, dynamo=True, opset_version=20, input_names=names,
                                             output_names=["logits"], external_data=False)
                    prog.save(path)
                    # the stack traces and module paths the dynamo exporter attaches to every node
                    # (metadata_props) are two thirds of the file; the graph is untouched
                    import onnx
                    m = onnx.load(path)
                    for node in m.graph.node:
                        del node.metadata_props[:]
                    onnx.save(m, path)
                else:
                    axes = {n: {0: "batch"} if kind == IMAGE else {0: "batch", 1: "seq"} for n in names}
                    axes["logits"] = {0: "batch"} if kind == IMAGE else {0: "batch", 1: "seq"}
                    torch.onnx.export(_wrapped(model, kind), args, path, dynamo=False, opset_version=17, input_names=names,
                                      output_names=["logits"], dynamic_axes=axes)
                print(f"{exporter}_{name}: exported")
            except Exception as e:  # noqa: BLE001 - the failure is the finding
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                traceback.print_exc(limit=1)
                print(f"{exporter}_{name}: export failed: {msg}")
                import shutil
                shutil.rmtree(d, ignore_errors=True)


def arch_reference(work):
    """ONNX Runtime's logits at the fixed inputs, and PyTorch's: the two must agree (1e-4), else
    the model is reported and removed (an export that does not compute the model)."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from onnx import numpy_helper
    models = arch_models()
    for d in sorted(os.listdir(work)):
        exporter, _, name = d.partition("_")
        path = os.path.join(work, d, "model.onnx")
        if exporter not in ("dynamo", "torchscript") or name not in models or not os.path.exists(path):
            continue
        model, kind = models[name]
        feeds = arch_feeds(name, kind)
        s = ort.InferenceSession(path)
        want = [i.name for i in s.get_inputs()]
        run_feeds = {k: feeds[k] for k in want}
        out = s.run(None, run_feeds)[0]
        with torch.no_grad():
            ref = _wrapped(model, kind)(*[torch.from_numpy(v) for v in feeds.values()]).numpy()
        err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-6))
        print(f"{d}: ONNX Runtime vs PyTorch logits: {err:.1e} relative")
        sd = os.path.join(work, d, "test_data_set_0")
        os.makedirs(sd, exist_ok=True)
        for k, n in enumerate(want):
            open(os.path.join(sd, f"input_{k}.pb"), "wb").write(numpy_helper.from_array(run_feeds[n], n).SerializeToString())
        open(os.path.join(sd, "output_0.pb"), "wb").write(numpy_helper.from_array(out, "logits").SerializeToString())
        if kind == IMAGE:
            open(os.path.join(sd, "labels.pb"), "wb").write(numpy_helper.from_array(arch_labels(name), "labels").SerializeToString())


def _arch_loss(name, model, kind, feeds):
    """The loss oases-train --inputs computes for the graph: the mean next-token cross-entropy of the
    logits against the token input shifted left (decoder_input_ids for T5), the last position ignored;
    for an image classifier (ViT), the mean cross-entropy of the logits [B, classes] against the
    labels of labels.pb."""
    import torch
    logits = _wrapped(model, kind)(*[torch.from_numpy(v) for v in feeds.values()])
    if kind == IMAGE:
        return torch.nn.functional.cross_entropy(logits, torch.from_numpy(arch_labels(name)))
    ids = torch.from_numpy(feeds["decoder_input_ids" if kind == SEQ2SEQ else "input_ids"])
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def arch_grads(work):
    """PyTorch's gradients mapped onto each graph's initializers (grads/, one TensorProto per
    initializer that stands for a parameter) and params.json: PyTorch's trainable parameter names,
    and for each, the initializer holding it and how ("same": by name or equal value,
    "transposed": an equal transpose, "batch_copies": one copy per row of the static batch (a
    class token; its gradient is the token's), "rows": the exporter kept the first rows (a position table
    sliced to the sequence), "plus_one": it stored 1 + w (Gemma's norm scales)), or null when the exporter folded it away."""
    import json
    import numpy as np
    import onnx
    from onnx import numpy_helper
    models = arch_models()
    for d in sorted(os.listdir(work)):
        exporter, _, name = d.partition("_")
        path = os.path.join(work, d, "model.onnx")
        if exporter not in ("dynamo", "torchscript") or name not in models or not os.path.exists(path):
            continue
        model, kind = models[name]
        for mod in model.modules():  # padding_idx is not in the graph (a plain Gather)
            if hasattr(mod, "padding_idx") and hasattr(mod, "weight") and mod.__class__.__name__ == "Embedding":
                mod.padding_idx = None
        model.zero_grad()
        loss = _arch_loss(name, model, kind, arch_feeds(name, kind))
        loss.backward()
        params = dict(model.named_parameters())
        graph = onnx.load(path).graph
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        floats = {k: v for k, v in inits.items() if v.dtype == np.float32}
        mapping, grads = {}, {}
        for pname, p in params.items():
            w = p.detach().numpy()
            how = None
            if pname in floats and floats[pname].shape == w.shape:
                how = (pname, "same")
            else:
                for iname, v in floats.items():
                    if v.shape == w.shape and np.array_equal(v, w):
                        how = (iname, "same")
                    elif w.ndim == 2 and v.shape == w.shape[::-1] and np.array_equal(v, w.T):
                        how = (iname, "transposed")
                    elif (w.ndim >= 2 and w.shape[0] == 1 and v.ndim == w.ndim and v.shape[0] > 1 and v.shape[1:] == w.shape[1:]
                          and all(np.array_equal(v[b:b + 1], w) for b in range(v.shape[0]))):
                        # ViT's class token expanded to the static batch and folded (dynamo): Oases
                        # trains it as one token again (graph/passes/unfold_batch_copies.cpp)
                        how = (iname, "batch_copies")
                    if how:
                        break
                for iname, v in floats.items() if how is None else ():
                    if v.shape == w.shape and np.allclose(v, w + 1, rtol=0, atol=1e-6) and "norm" in pname:
                        how = (iname, "plus_one")  # Gemma's RMSNorm scales by (1 + w): the exporters fold the sum
                        break
                    if v.size < w.size and w.ndim == 2 and v.shape[-1] == w.shape[-1]:
                        rows = v.size // w.shape[-1]
                        if np.array_equal(v.reshape(rows, -1), w[:rows]):
                            how = (iname, "rows")
                            break
            mapping[pname] = None if how is None else {"initializer": how[0], "as": how[1]}
            if how is None:
                continue
            g = p.grad.numpy() if p.grad is not None else np.zeros_like(w)
            iname, kindmap = how
            v = floats[iname]
            g = g.T if kindmap == "transposed" else g[: v.size // w.shape[-1]].reshape(v.shape) if kindmap == "rows" else g
            grads[iname] = grads.get(iname, 0) + g  # tied parameters stored once: one gradient
        out = os.path.join(work, d, "grads")
        os.makedirs(out, exist_ok=True)
        for k, (iname, g) in enumerate(sorted(grads.items())):
            open(os.path.join(out, f"grad_{k}.pb"), "wb").write(
                numpy_helper.from_array(np.asarray(g, np.float32), iname).SerializeToString())
        json.dump({"loss": loss.item(), "parameters": mapping}, open(os.path.join(work, d, "params.json"), "w"), indent=1)
        lost = [p for p, m in mapping.items() if m is None]
        print(f"{d}: loss {loss.item():.6f}, {len(params)} parameters, {len(grads)} initializers with gradients"
              + (f", folded away by the exporter: {lost}" if lost else ""))


if __name__ == "__main__":
    {"optimum": optimum, "torchscript": torchscript, "reference": reference, "grads": grads, "arch-export": arch_export,
     "arch-reference": arch_reference, "arch-grads": arch_grads}[sys.argv[1]](sys.argv[2])
