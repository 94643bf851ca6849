#!/usr/bin/env python3
"""Exports a transformer of models/transformer.py to ONNX with PyTorch reference data in the ONNX
test-data layout:

  OUT/model.onnx
  OUT/test_data_set_0/input_N.pb, output_N.pb   (and test_data_set_1/ at other shapes with --dynamic)
  OUT/grads/grad_N.pb   one TensorProto per parameter, named by its *initializer*, holding
                        d(loss)/d(param): the graph's own loss with --loss-inside, else the
                        next-token cross-entropy of the logits (targets = input_ids shifted left,
                        the last position ignored), as oases-train computes it
  OUT/info.json         configuration, exporter and versions, inputs/outputs, the parameter →
                        initializer mapping, the loss, the list of gradient files

Two exporters, chosen with --exporter, under whichever Python runs this script:
  torchscript  torch.onnx.export(..., dynamo=False), do_constant_folding=False so that every
               parameter keeps its name (tied weights stay one initializer). Debian's torch 1.13
               (opset <= 17) and the TorchScript path of a current torch (opset up to 20).
  dynamo       torch.onnx.export(..., dynamo=True) of a current torch (opset 18+, IR 10), with its
               default graph optimisation, as users run it. Initializer names are recovered from the
               exported program's signature and checked against the parameter values.

  /usr/bin/python3 models/export.py --family gpt2 --out /tmp/gpt2
  models/.venv-torch/bin/python models/export.py --exporter dynamo --family llama --kv-heads 2 \
      --dynamic --out /tmp/llama
"""
import argparse
import inspect
import json
import os
import sys
import warnings

import logging

import numpy as np
import torch
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer import Config, TransformerLM  # noqa: E402


# the current exporter logs a warning per torchvision op it cannot register; not our concern
logging.getLogger("torch.onnx").setLevel(logging.ERROR)


def save_tensor(arr, name, path):
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would turn a 0-d loss into shape [1])
    t = numpy_helper.from_array(arr, name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


# One wrapper per input combination, so that every exporter sees plain named positional inputs.
# The model is held as `m`, so parameters are named "m.<state-dict name>" in the exported graph.
class _LM(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m


class LMIds(_LM):
    def forward(self, input_ids):
        return self.m(input_ids)


class LMMask(_LM):
    def forward(self, input_ids, attention_mask):
        return self.m(input_ids, attention_mask)


class LMLoss(_LM):
    def forward(self, input_ids, labels):
        return self.m(input_ids, None, labels)


class LMMaskLoss(_LM):
    def forward(self, input_ids, attention_mask, labels):
        return self.m(input_ids, attention_mask, labels)


WRAPPERS = {
    ("input_ids",): LMIds,
    ("input_ids", "attention_mask"): LMMask,
    ("input_ids", "labels"): LMLoss,
    ("input_ids", "attention_mask", "labels"): LMMaskLoss,
}


def make_inputs(cfg, names, batch, seq, seed):
    """Deterministic token ids, a padding mask (the first sequence padded at its last quarter) and labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab, (batch, seq), generator=g)
    labels = torch.randint(0, cfg.vocab, (batch, seq), generator=g)
    out = [ids]
    if "attention_mask" in names:
        am = torch.ones(batch, seq, dtype=torch.long)
        am[0, seq * 3 // 4:] = 0
        out.append(am)
    if "labels" in names:
        out.append(labels)
    return out


def kwargs_supported(fn, kw):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


def export_torchscript(wrap, inputs, names, out_name, path, opset, dynamic, training=False):
    dyn = None
    if dynamic:
        dyn = {n: {0: "batch", 1: "sequence"} for n in names}
        if out_name == "logits":
            dyn[out_name] = {0: "batch", 1: "sequence"}
    kw = dict(input_names=names, output_names=[out_name], opset_version=opset, do_constant_folding=False,
              dynamic_axes=dyn)
    if training:  # keep Dropout nodes (training_mode = true) in the graph
        kw["training"] = torch.onnx.TrainingMode.TRAINING
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = False  # current torch defaults to the dynamo exporter
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrap, tuple(inputs), path, **kw)


def export_dynamo(wrap, inputs, names, out_name, path, opset, dynamic, max_pos):
    dyn = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=1024)
        seq = torch.export.Dim("sequence", min=2, max=max_pos)
        dyn = {n: {0: batch, 1: seq} for n in names}
    kw = dict(input_names=names, output_names=[out_name], opset_version=opset, dynamo=True, dynamic_shapes=dyn,
              external_data=False, verbose=False, report=False)
    kw = kwargs_supported(torch.onnx.export, kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(wrap, tuple(inputs), **kw)
    prog.save(path, **kwargs_supported(prog.save, dict(external_data=False)))
    # The only change to what the exporter wrote: drop its per-node Python stack traces, which hold
    # absolute paths of this checkout (the files would differ by where they were made). The other
    # metadata (name scopes, class hierarchy, FX node, graph-signature kinds) stays.
    m = onnx.load(path)
    for n in m.graph.node:
        keep = [p for p in n.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del n.metadata_props[:]
        n.metadata_props.extend(keep)
    onnx.save(m, path)
    return prog


def all_parameters(module):
    """(qualified name, parameter) for every use of a parameter, tied ones under each name."""
    for mn, mod in module.named_modules(remove_duplicate=False):
        for pn, p in mod._parameters.items():
            if p is not None:
                yield (f"{mn}.{pn}" if mn else pn), p


def short(pname):
    return pname[2:] if pname.startswith("m.") else pname


def initializer_map(wrap, model_onnx, prog):
    """Maps each parameter (state-dict name of the wrapped model, tied weights under each name) to
    the initializer that holds it, checking the values. Returns (mapping, transforms):
      mapping     {parameter: initializer}
      transforms  {initializer: how it derives from its parameter}, only where it is not the
                  parameter itself. The dynamo exporter's optimiser folds constant subgraphs of
                  parameters into new initializers named val_N / embedding_N:
                    "transpose"                      nn.Linear's Wᵀ (initializer = weight.T)
                    {"rows": [0, T], "shape": [..]}  a Gather of constant indices, e.g. learned
                                                     positions at a static sequence length
    Gradients in grads/ are d(loss)/d(initializer), i.e. transformed the same way."""
    inits = {i.name: numpy_helper.to_array(i) for i in model_onnx.graph.initializer}
    sig = {}
    if prog is not None and getattr(prog, "exported_program", None) is not None:
        for ph, fqn in prog.exported_program.graph_signature.inputs_to_parameters.items():
            sig.setdefault(fqn, []).append(ph)
    mapping, transforms, owner = {}, {}, {}

    def claim(init, p, pname):
        o = owner.setdefault(init, p)
        if o is not p:  # tied weights are one parameter object; anything else is a merge
            raise SystemExit(f"export: initializer '{init}' holds two distinct parameters ('{pname}' and another; "
                             "merged by the exporter because they were byte-identical)")

    for pname, p in all_parameters(wrap):
        ref = p.detach().numpy()
        found, how = None, None
        for n in [pname] + sig.get(pname, []) + [pname.replace(".", "_"), "p_" + pname.replace(".", "_")]:
            if n in inits and inits[n].shape == ref.shape and np.array_equal(inits[n], ref):
                found, how = n, None
                break
        if found is None:  # renamed: find it by value (exact, then transposed, then a row prefix)
            for n, arr in inits.items():
                if arr.dtype != ref.dtype or arr.size == 0:
                    continue
                if arr.shape == ref.shape and np.array_equal(arr, ref):
                    found, how = n, None
                elif ref.ndim == 2 and arr.shape == ref.T.shape and np.array_equal(arr, ref.T):
                    found, how = n, "transpose"
                elif ref.ndim >= 1 and arr.size < ref.size and arr.size % ref[0].size == 0:
                    rows = arr.size // ref[0].size
                    if np.array_equal(arr.reshape(rows, *ref.shape[1:]), ref[:rows]):
                        found, how = n, {"rows": [0, rows], "shape": list(arr.shape)}
                if found is not None:
                    break
        if found is None:
            raise SystemExit(f"export: parameter '{pname}' {tuple(p.shape)} has no initializer holding its values")
        claim(found, p, pname)
        mapping[short(pname)] = found
        if how is not None:
            transforms[found] = how
    return mapping, transforms


def grad_for_initializer(grad, how):
    if how is None:
        return grad
    if how == "transpose":
        return grad.T
    return grad[how["rows"][0]:how["rows"][1]].reshape(how["shape"])


def expectations(c, loss_inside, dynamic, batch, seq):
    """What `oases-import` must find in the model, derived from the PyTorch configuration (not from
    the importer): read by tests/e2e/test_small_models.sh."""
    L = c.layers
    hd = c.hidden // c.heads
    norm_op = "LayerNormalization" if c.norm == "layernorm" else "oases.RMSNormalization"
    act_op = {"gelu": "Gelu", "gelu_tanh": "Gelu", "swiglu": "oases.SwiGLU", "relu": "Relu"}[c.act]
    attn = f"attention {c.heads} heads x {hd}" + (f" ({c.kv_heads} kv)" if c.kv_heads != c.heads else "")
    attn += (" causal" if c.causal else "") + ", qkv " + ("fused" if c.family == "gpt2" else "separate")
    norm_kind = "layernorm" if c.norm == "layernorm" else "rmsnorm"
    lines = [
        "# What oases-import must find in model.onnx, derived from the PyTorch configuration by export.py.",
        "# Read by tests/e2e/test_small_models.sh: dims = bindings for symbolic dimensions; op NAME N = count",
        "# in the canonical graph; block TEXT = every block's summary line contains TEXT; head tied|untied.",
        "dims" + (f" --dim batch={batch} --dim sequence={seq}" if dynamic else ""),
        f"blocks {L} (hidden {c.hidden}, vocabulary {c.vocab})",
        f"op oases.Attention {L}",
        f"op {norm_op} {2 * L + 1}",
        f"op {act_op} {L}",
    ]
    if loss_inside:
        lines.append("op SoftmaxCrossEntropyLoss 1")
    lines += [
        f"block {attn};",
        f"block ; mlp {c.act} {c.ffn};",
        f"block ; norms {norm_kind}, {norm_kind}",
        f"head {'tied' if c.tied else 'untied'}",
    ]
    return "\n".join(lines) + "\n"


def value_infos(vis):
    out = []
    for vi in vis:
        tt = vi.type.tensor_type
        dims = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tt.shape.dim]
        out.append({"name": vi.name, "dtype": onnx.TensorProto.DataType.Name(tt.elem_type).lower(), "shape": dims})
    return out


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
    ap.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    ap.add_argument("--opset", type=int, default=0, help="default: 17 (torchscript), 18 (dynamo)")
    ap.add_argument("--dynamic", action="store_true",
                    help="symbolic batch and sequence dimensions; also writes test_data_set_1 at other sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="export in training mode with Dropout(p) nodes (TorchScript exporter; implies --no-data)")
    ap.add_argument("--no-data", action="store_true", help="write the model only")
    ap.add_argument("--out", required=True, help="output folder")
    a = ap.parse_args()
    opset = a.opset or (18 if a.exporter == "dynamo" else 17)

    torch.manual_seed(a.seed)
    cfg = Config(family=a.family, vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                 ffn=a.ffn, max_pos=a.max_pos, positions=a.positions, norm=a.norm, act=a.act,
                 tied=None if a.tied == "" else a.tied == "yes", loss_inside=a.loss_inside, dropout=a.dropout)
    if a.dropout:
        if a.exporter != "torchscript":
            sys.exit("export.py: --dropout needs the TorchScript exporter")
        a.no_data = True  # outputs are random: no reference data
    model = TransformerLM(cfg).eval()
    names = ["input_ids"] + (["attention_mask"] if a.attention_mask else []) + (["labels"] if a.loss_inside else [])
    wrap = WRAPPERS[tuple(names)](model).eval()
    inputs = make_inputs(cfg, names, a.batch, a.seq, a.seed + 1)
    out_name = "loss" if a.loss_inside else "logits"

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "model.onnx")
    prog = None
    if a.exporter == "torchscript":
        export_torchscript(wrap, inputs, names, out_name, path, opset, a.dynamic, training=a.dropout > 0)
    else:
        prog = export_dynamo(wrap, inputs, names, out_name, path, opset, a.dynamic, cfg.max_pos)
    m = onnx.load(path)
    try:
        onnx.checker.check_model(m)
        checked = True
    except Exception as e:  # an older onnx does not know the newest IR/opsets
        checked = f"not checked: {str(e).splitlines()[0]}"
    mapping, transforms = initializer_map(wrap, m, prog)

    versions = {"torch": torch.__version__, "onnx": onnx.__version__}
    try:
        import onnxscript
        versions["onnxscript"] = onnxscript.__version__
    except ImportError:
        pass
    info = {
        "config": cfg.resolved().__dict__,
        "exporter": a.exporter,
        "exporter_call": (f"torch.onnx.export(dynamo=True, opset_version={opset}); node metadata "
                          "pkg.torch.onnx.stack_trace removed" if a.exporter == "dynamo" else
                          f"torch.onnx.export(opset_version={opset}, do_constant_folding=False)"),
        "versions": versions,
        "torch": torch.__version__,
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "ir_version": m.ir_version,
        "producer": f"{m.producer_name} {m.producer_version}",
        "onnx_checker": checked,
        "dynamic": a.dynamic,
        "batch": a.batch,
        "seq": a.seq,
        "seed": a.seed,
        "inputs": names,
        "graph_inputs": value_infos(m.graph.input),
        "output": out_name,
        "graph_outputs": value_infos(m.graph.output),
        "parameters": sum(p.numel() for p in model.parameters()),
        "initializers": len(m.graph.initializer),
        "param_to_initializer": mapping,
        "initializer_transforms": transforms,
        "nodes": len(m.graph.node),
    }
    with open(os.path.join(a.out, "expect.txt"), "w") as f:
        f.write(expectations(cfg.resolved(), a.loss_inside, a.dynamic, a.batch, a.seq))
    if a.no_data:
        json.dump(info, open(os.path.join(a.out, "info.json"), "w"), indent=2)
        return

    # forward reference data: the export shape, and with --dynamic a second shape
    shapes = [(a.batch, a.seq)]
    if a.dynamic:
        shapes.append((a.batch + 1, max(2, a.seq // 2 + 3)))
    data_sets = []
    for k, (b, t) in enumerate(shapes):
        xs = inputs if k == 0 else make_inputs(cfg, names, b, t, a.seed + 1 + k)
        ds = os.path.join(a.out, f"test_data_set_{k}")
        os.makedirs(ds, exist_ok=True)
        for i, (n, x) in enumerate(zip(names, xs)):
            save_tensor(x.numpy(), n, os.path.join(ds, f"input_{i}.pb"))
        with torch.no_grad():
            out = wrap(*xs)
        save_tensor(out.detach().numpy().astype(np.float32), out_name, os.path.join(ds, "output_0.pb"))
        data_sets.append({"folder": f"test_data_set_{k}", "batch": b, "seq": t})
    info["data_sets"] = data_sets

    # gradients of the training loss at the export shape
    wrap.zero_grad()
    o = wrap(*inputs)
    if a.loss_inside:
        loss = o
        info["loss_definition"] = "the graph's output: mean cross-entropy of the logits against labels"
    else:
        ids = inputs[0]
        tgt = torch.cat([ids[:, 1:], torch.full((a.batch, 1), -100, dtype=torch.long)], dim=1)
        loss = torch.nn.functional.cross_entropy(o.reshape(-1, cfg.vocab), tgt.reshape(-1), ignore_index=-100)
        info["loss_definition"] = ("mean next-token cross-entropy of the logits: targets input_ids[:, 1:], "
                                   "the last position ignored")
    loss.backward()
    gd = os.path.join(a.out, "grads")
    os.makedirs(gd, exist_ok=True)
    grads = []
    for pname, p in wrap.named_parameters():  # tied weights once, with the sum of both uses' gradients
        if p.grad is None:
            continue
        key = short(pname)
        fname = f"grad_{len(grads)}.pb"
        init = mapping[key]
        how = transforms.get(init)
        gr = grad_for_initializer(p.grad.numpy(), how)
        grads.append({"file": f"grads/{fname}", "initializer": init, "parameter": key})
        if how is not None:
            grads[-1]["transform"] = how
        save_tensor(gr, init, os.path.join(gd, fname))
    info["loss"] = loss.item()
    info["grads"] = grads
    json.dump(info, open(os.path.join(a.out, "info.json"), "w"), indent=2)
    print(f"wrote {path} ({os.path.getsize(path)} bytes, opset {info['opset']}, IR {m.ir_version}, "
          f"{a.exporter} exporter, torch {torch.__version__}), loss {loss.item():.6f}, {len(grads)} gradients")


if __name__ == "__main__":
    main()
