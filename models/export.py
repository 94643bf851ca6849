#!/usr/bin/env python3
"""Exports a transformer of models/transformer.py to ONNX with PyTorch reference data in the ONNX
test-data layout (test_data_set_0/input_N.pb, output_N.pb, and grads/ with d(loss)/d(param)).

  /usr/bin/python3 models/export.py --family gpt2 --hidden 64 --layers 2 --heads 4 --vocab 256 \
      --seq 16 --batch 2 --out models/tiny_gpt2

Exports with do_constant_folding=False and keep_initializers_as_inputs=False so that every
parameter keeps its name (and tied weights stay one initializer).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer import Config, TransformerLM  # noqa: E402


def save_tensor(arr, name, path):
    t = numpy_helper.from_array(np.ascontiguousarray(arr), name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="gpt2", choices=["gpt2", "bert", "llama"])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--ffn", type=int, default=0)
    ap.add_argument("--max-pos", type=int, default=128)
    ap.add_argument("--positions", default="", choices=["", "learned", "rotary"])
    ap.add_argument("--norm", default="", choices=["", "layernorm", "rmsnorm"])
    ap.add_argument("--act", default="", choices=["", "gelu", "gelu_tanh", "swiglu", "relu"])
    ap.add_argument("--tied", default="", choices=["", "yes", "no"])
    ap.add_argument("--loss-inside", action="store_true", help="take labels, return the loss")
    ap.add_argument("--attention-mask", action="store_true", help="take an attention_mask input (padding)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--dynamic", action="store_true", help="symbolic batch and sequence dimensions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-data", action="store_true", help="write the model only")
    ap.add_argument("--out", required=True, help="output folder (model.onnx and test_data_set_0/)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    cfg = Config(family=a.family, vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                 ffn=a.ffn, max_pos=a.max_pos, positions=a.positions, norm=a.norm, act=a.act,
                 tied=None if a.tied == "" else a.tied == "yes", loss_inside=a.loss_inside)
    model = TransformerLM(cfg).eval()
    os.makedirs(a.out, exist_ok=True)
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg.vocab, (a.batch, a.seq), generator=g)
    inputs = [ids]
    names = ["input_ids"]
    if a.attention_mask:
        am = torch.ones(a.batch, a.seq, dtype=torch.long)
        am[0, a.seq * 3 // 4:] = 0  # padding at the end of the first sequence
        inputs.append(am)
        names.append("attention_mask")
    labels = torch.randint(0, cfg.vocab, (a.batch, a.seq), generator=g)
    if a.loss_inside:
        inputs.append(labels)
        names.append("labels")

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *xs):
            kw = dict(zip(names, xs))
            return self.m(kw["input_ids"], kw.get("attention_mask"), kw.get("labels"))

    wrap = Wrap(model)
    out_name = "loss" if a.loss_inside else "logits"
    dyn = None
    if a.dynamic:
        dyn = {n: {0: "batch", 1: "sequence"} for n in names}
        if not a.loss_inside:
            dyn[out_name] = {0: "batch", 1: "sequence"}
    path = os.path.join(a.out, "model.onnx")
    torch.onnx.export(wrap, tuple(inputs), path, input_names=names, output_names=[out_name], opset_version=a.opset,
                      do_constant_folding=False, dynamic_axes=dyn)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    info = {"config": cfg.resolved().__dict__, "opset": a.opset, "torch": torch.__version__, "batch": a.batch, "seq": a.seq,
            "inputs": names, "output": out_name, "parameters": sum(p.numel() for p in model.parameters())}
    if a.no_data:
        json.dump(info, open(os.path.join(a.out, "info.json"), "w"), indent=2)
        return
    ds = os.path.join(a.out, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    for i, (n, t) in enumerate(zip(names, inputs)):
        save_tensor(t.numpy(), n, os.path.join(ds, f"input_{i}.pb"))
    with torch.no_grad():
        out = wrap(*inputs)
    save_tensor(out.detach().numpy().astype(np.float32), out_name, os.path.join(ds, "output_0.pb"))

    # gradients of the training loss: the model's own loss, or next-token cross-entropy of the logits
    # (targets = input_ids shifted left, the last position ignored), as oases-train computes it.
    wrap.zero_grad()
    o = wrap(*inputs)
    if a.loss_inside:
        loss = o
    else:
        tgt = torch.cat([ids[:, 1:], torch.full((a.batch, 1), -100, dtype=torch.long)], dim=1)
        loss = torch.nn.functional.cross_entropy(o.reshape(-1, cfg.vocab), tgt.reshape(-1), ignore_index=-100)
    loss.backward()
    gd = os.path.join(a.out, "grads")
    os.makedirs(gd, exist_ok=True)
    # map parameter names to initializer names: export keeps the state-dict names ("m." prefix)
    init_names = {i.name for i in m.graph.initializer}
    written = 0
    for pname, p in wrap.named_parameters():
        if p.grad is None:
            continue
        if pname not in init_names:
            continue
        save_tensor(p.grad.numpy(), pname, os.path.join(gd, f"grad_{written}.pb"))
        written += 1
    info["loss"] = float(loss)
    info["grads"] = written
    json.dump(info, open(os.path.join(a.out, "info.json"), "w"), indent=2)
    print(f"wrote {path} ({os.path.getsize(path)} bytes), loss {float(loss):.6f}, {written} gradients")


if __name__ == "__main__":
    main()
