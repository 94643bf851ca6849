#!/usr/bin/env python3
"""Writes the seven GPT layer stacks of the Oases paper's evaluation (Li et al., arXiv 2305.16121) as
ONNX models for planning, with their weights as zero-filled external data:

  hidden/layers = 1024/24, 2048/24, 3072/24, 4096/16, 6144/16, 8192/8, 12288/4
  heads = hidden/64, sequence 1024 (max positions), GPT-2 style (learned positions, pre-LN
  LayerNorm, fused c_attn [C, 3C] + Split, tanh-GELU written out, causal mask via Where,
  Conv1D-style [in, out] weights with biases, tied LM head), vocabulary 50257 (GPT-2's).

  /usr/bin/python3 models/make_oases_stacks.py --out DIR [--only 1024 [--only 2048 ...]]
  build/bin/oases-import DIR/gpt_h1024_l24/model.onnx --dim batch=8 --dim sequence=1024

DIR/<stack>/model.onnx holds the graph (written with onnx.helper, as the TorchScript exporter writes
a GPT-2 block at opset 17, inputs `input_ids[batch, sequence]` with symbolic dimensions) and the
one small data tensor whose values matter for importing: the causal-mask buffer (bool
[1, 1, 1024, 1024], 1 MiB, inline, as GPT-2's `attn.bias`). Every parameter is an external-data
tensor in DIR/<stack>/weights.bin, a sparse file created by truncate() to its full size: the
weights are never materialised, in memory or on disk (the 12288 stack is 2.0e9 parameters,
8 GB as fp32, and takes a few hundred KB of disk). Planning reads shapes only; running the stacks
needs real weights, which these are not.

Needs only numpy and onnx (Debian's python3-onnx), no PyTorch.
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STACKS = [(1024, 24), (2048, 24), (3072, 24), (4096, 16), (6144, 16), (8192, 8), (12288, 4)]
VOCAB = 50257
SEQ = 1024
HEAD_DIM = 64
OPSET = 17
ALIGN = 4096  # external tensors start at page boundaries (as onnx's own writer can align them)


class Builder:
    def __init__(self, data_file):
        self.nodes = []
        self.inits = []
        self.offset = 0
        self.data_file = data_file
        self.counter = {}
        self.params = 0

    def name(self, scope, op):
        k = f"{scope}/{op}"
        i = self.counter.get(k, 0)
        self.counter[k] = i + 1
        return f"{k}_{i}" if i else k

    def node(self, op, ins, scope, n_out=1, **attrs):
        nm = self.name(scope, op)
        outs = [f"{nm}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=nm, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, scope, dtype=None):
        arr = np.asarray(value, dtype=dtype)
        nm = self.name(scope, "Constant")
        out = f"{nm}_output_0"
        self.nodes.append(helper.make_node("Constant", [], [out], name=nm, value=numpy_helper.from_array(arr, out)))
        return out

    def param(self, name, shape):
        """An fp32 parameter stored as external data at the next aligned offset (no bytes written)."""
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(shape)
        n = int(np.prod(shape)) * 4
        self.offset = (self.offset + ALIGN - 1) // ALIGN * ALIGN
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.data_file), ("offset", str(self.offset)), ("length", str(n))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.offset += n
        self.params += int(np.prod(shape))
        self.inits.append(t)
        return name


def build_stack(hidden, layers, data_file, vocab=VOCAB, seq=SEQ, eps=1e-5):
    heads = hidden // HEAD_DIM
    b = Builder(data_file)
    ids = "input_ids"
    # embeddings: token + learned position (positions 0..T-1 from the input's sequence length)
    wte = b.param("transformer.wte.weight", [vocab, hidden])
    wpe = b.param("transformer.wpe.weight", [seq, hidden])
    tok = b.node("Gather", [wte, ids], "/transformer/wte")
    shape_ids = b.node("Shape", [ids], "/transformer")
    t_len = b.node("Gather", [shape_ids, b.const(1, "/transformer", np.int64)], "/transformer", axis=0)
    pos = b.node("Range", [b.const(0, "/transformer", np.int64), t_len, b.const(1, "/transformer", np.int64)], "/transformer")
    pos = b.node("Unsqueeze", [pos, b.const([0], "/transformer", np.int64)], "/transformer")
    pe = b.node("Gather", [wpe, pos], "/transformer/wpe")
    x = b.node("Add", [tok, pe], "/transformer")
    # the causal-mask buffer, sliced to [.., :T, :T] as GPT-2 does
    mask_full = numpy_helper.from_array(np.tril(np.ones((seq, seq), dtype=bool)).reshape(1, 1, seq, seq), "transformer.attn_bias")
    b.inits.append(mask_full)
    t_1d = b.node("Unsqueeze", [t_len, b.const([0], "/transformer", np.int64)], "/transformer")
    ends = b.node("Concat", [t_1d, t_1d], "/transformer", axis=0)
    mask = b.node("Slice", [mask_full.name, b.const([0, 0], "/transformer", np.int64), ends,
                            b.const([2, 3], "/transformer", np.int64)], "/transformer")
    neg = b.const(np.float32(np.finfo(np.float32).min), "/transformer", np.float32)
    scale = b.const(np.float32(np.sqrt(HEAD_DIM)), "/transformer", np.float32)
    split_sizes = b.const([hidden] * 3, "/transformer", np.int64)
    shape_heads = b.const([0, 0, heads, HEAD_DIM], "/transformer", np.int64)
    shape_merge = b.const([0, 0, hidden], "/transformer", np.int64)
    for i in range(layers):
        s = f"/transformer/h.{i}"
        p = f"transformer.h.{i}"
        ln1 = b.node("LayerNormalization", [x, b.param(f"{p}.ln_1.weight", [hidden]), b.param(f"{p}.ln_1.bias", [hidden])],
                     f"{s}/ln_1", axis=-1, epsilon=eps)
        qkv = b.node("MatMul", [ln1, b.param(f"{p}.attn.c_attn.weight", [hidden, 3 * hidden])], f"{s}/attn/c_attn")
        qkv = b.node("Add", [qkv, b.param(f"{p}.attn.c_attn.bias", [3 * hidden])], f"{s}/attn/c_attn")
        q, k, v = b.node("Split", [qkv, split_sizes], f"{s}/attn", n_out=3, axis=2)
        q = b.node("Transpose", [b.node("Reshape", [q, shape_heads], f"{s}/attn")], f"{s}/attn", perm=[0, 2, 1, 3])
        k = b.node("Transpose", [b.node("Reshape", [k, shape_heads], f"{s}/attn")], f"{s}/attn", perm=[0, 2, 3, 1])
        v = b.node("Transpose", [b.node("Reshape", [v, shape_heads], f"{s}/attn")], f"{s}/attn", perm=[0, 2, 1, 3])
        w = b.node("MatMul", [q, k], f"{s}/attn")
        w = b.node("Div", [w, scale], f"{s}/attn")
        w = b.node("Where", [mask, w, neg], f"{s}/attn")
        w = b.node("Softmax", [w], f"{s}/attn", axis=-1)
        o = b.node("MatMul", [w, v], f"{s}/attn")
        o = b.node("Reshape", [b.node("Transpose", [o], f"{s}/attn", perm=[0, 2, 1, 3]), shape_merge], f"{s}/attn")
        o = b.node("MatMul", [o, b.param(f"{p}.attn.c_proj.weight", [hidden, hidden])], f"{s}/attn/c_proj")
        o = b.node("Add", [o, b.param(f"{p}.attn.c_proj.bias", [hidden])], f"{s}/attn/c_proj")
        x = b.node("Add", [x, o], s)
        ln2 = b.node("LayerNormalization", [x, b.param(f"{p}.ln_2.weight", [hidden]), b.param(f"{p}.ln_2.bias", [hidden])],
                     f"{s}/ln_2", axis=-1, epsilon=eps)
        h = b.node("MatMul", [ln2, b.param(f"{p}.mlp.c_fc.weight", [hidden, 4 * hidden])], f"{s}/mlp/c_fc")
        h = b.node("Add", [h, b.param(f"{p}.mlp.c_fc.bias", [4 * hidden])], f"{s}/mlp/c_fc")
        # gelu_new: 0.5 · h · (1 + tanh(√(2/π) · (h + 0.044715 · h³)))
        g = f"{s}/mlp/gelu_new"
        half = b.node("Mul", [h, b.const(np.float32(0.5), g, np.float32)], g)
        cube = b.node("Pow", [h, b.const(np.float32(3.0), g, np.float32)], g)
        inner = b.node("Add", [h, b.node("Mul", [cube, b.const(np.float32(0.044715), g, np.float32)], g)], g)
        th = b.node("Tanh", [b.node("Mul", [inner, b.const(np.float32(np.sqrt(2 / np.pi)), g, np.float32)], g)], g)
        h = b.node("Mul", [half, b.node("Add", [th, b.const(np.float32(1.0), g, np.float32)], g)], g)
        h = b.node("MatMul", [h, b.param(f"{p}.mlp.c_proj.weight", [4 * hidden, hidden])], f"{s}/mlp/c_proj")
        h = b.node("Add", [h, b.param(f"{p}.mlp.c_proj.bias", [hidden])], f"{s}/mlp/c_proj")
        x = b.node("Add", [x, h], s)
    x = b.node("LayerNormalization", [x, b.param("transformer.ln_f.weight", [hidden]), b.param("transformer.ln_f.bias", [hidden])],
               "/transformer/ln_f", axis=-1, epsilon=eps)
    # tied LM head: logits = x · wteᵀ
    wte_t = b.node("Transpose", [wte], "/lm_head", perm=[1, 0])
    logits = b.node("MatMul", [x, wte_t], "/lm_head")
    nodes = b.nodes
    nodes[-1].output[0] = "logits"
    graph = helper.make_graph(
        nodes, f"gpt_h{hidden}_l{layers}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])],
        initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="oases-models",
                              producer_version="make_oases_stacks.py")
    model.ir_version = 8
    return model, b.offset, b.params


def write_stack(out, hidden, layers, vocab=VOCAB, seq=SEQ):
    name = f"gpt_h{hidden}_l{layers}" + ("" if vocab == VOCAB else f"_v{vocab}") + ("" if seq == SEQ else f"_s{seq}")
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    data_file = "weights.bin"
    model, nbytes, params = build_stack(hidden, layers, data_file, vocab=vocab, seq=seq)
    path = os.path.join(d, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    data_path = os.path.join(d, data_file)
    with open(data_path, "wb") as f:  # zero-filled and sparse: nothing is written, only the size set
        f.truncate(nbytes)
    onnx.checker.check_model(path)  # by path: checks that the external data file is there; reads no weights
    heads = hidden // HEAD_DIM
    info = {"name": name, "family": "gpt2", "hidden": hidden, "layers": layers, "heads": heads, "head_dim": HEAD_DIM,
            "ffn": 4 * hidden, "sequence": seq, "vocab": vocab, "tied_head": True, "opset": OPSET, "ir_version": model.ir_version,
            "parameters": params, "weights_bytes": nbytes, "weights_file": data_file,
            "weights": "zero-filled sparse external data: shapes for planning, not values to run",
            "inputs": {"input_ids": ["batch", "sequence"]}, "import": f"oases-import {name}/model.onnx --dim batch=B --dim sequence={seq}"}
    with open(os.path.join(d, "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    disk = os.stat(data_path).st_blocks * 512
    print(f"{name}: {params / 1e9:.3f} G parameters, {nbytes / 2**30:.2f} GiB of weights as sparse external data "
          f"({disk} bytes on disk), model.onnx {os.path.getsize(path)} bytes, {len(model.graph.node)} nodes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder; each stack goes to OUT/gpt_h<hidden>_l<layers>/")
    ap.add_argument("--only", type=int, action="append", default=[], metavar="HIDDEN",
                    help="only the stack(s) with this hidden size (repeatable)")
    ap.add_argument("--stack", action="append", default=[], metavar="HIDDENxLAYERS",
                    help="write this stack instead of the paper's (e.g. 12288x96; repeatable)")
    ap.add_argument("--vocab", type=int, default=VOCAB,
                    help=f"vocabulary (default {VOCAB}, GPT-2's; Megatron pads it to 50304, a multiple of 128, so that "
                         "the vocabulary-parallel embedding and head divide over the tensor-parallel ranks)")
    ap.add_argument("--seq", type=int, default=SEQ, help=f"maximum positions (default {SEQ}; GPT-3 used 2048)")
    a = ap.parse_args()
    if a.stack:
        for s in a.stack:
            try:
                hidden, layers = (int(x) for x in s.lower().split("x"))
            except ValueError:
                sys.exit(f"make_oases_stacks: --stack {s}: expected HIDDENxLAYERS")
            if hidden % HEAD_DIM:
                sys.exit(f"make_oases_stacks: --stack {s}: hidden must be a multiple of {HEAD_DIM}")
            write_stack(a.out, hidden, layers, a.vocab, a.seq)
        return
    known = {h for h, _ in STACKS}
    for h in a.only:
        if h not in known:
            sys.exit(f"make_oases_stacks: no stack with hidden {h}; the stacks are {sorted(known)}")
    for hidden, layers in STACKS:
        if a.only and hidden not in a.only:
            continue
        write_stack(a.out, hidden, layers, a.vocab, a.seq)


if __name__ == "__main__":
    main()
