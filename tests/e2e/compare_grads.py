"""Compares two --dump-grads folders (and optionally two --log-json loss logs) for the end-to-end
tests; exits non-zero with the worst difference when they differ.

  compare_grads.py REF_DIR DIR LABEL [--rtol R] [--exact] [--losses REF.jsonl GOT.jsonl --steps N [--loss-rtol R]]

Losses are compared step by step relative to the reference loss, within --loss-rtol (default: --rtol).

Gradients are compared relative to each gradient's scale, floored at 1e-3 of the largest gradient:
some gradients are zero in exact arithmetic (a key bias shifts every score of a row alike, which
softmax ignores) and hold only rounding noise (~1e-12) that no layout reproduces bit for bit.
--exact also requires every gradient to be bit-identical."""
import argparse
import glob
import json
import os

import numpy as np
import onnx
from onnx import numpy_helper


def load(d):
    out = {}
    for f in glob.glob(os.path.join(d, "*.pb")):
        t = onnx.load_tensor(f)
        out[t.name] = numpy_helper.to_array(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("label")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--losses", nargs=2, metavar=("REF", "GOT"))
    ap.add_argument("--steps", type=int, default=0, help="steps each loss log must hold")
    ap.add_argument("--loss-rtol", type=float, default=None, help="tolerance of the losses (default: --rtol)")
    a = ap.parse_args()
    label = a.label
    lworst = None
    if a.losses:
        la = [json.loads(l)["loss"] for l in open(a.losses[0])]
        lb = [json.loads(l)["loss"] for l in open(a.losses[1])]
        assert len(la) == len(lb) and (a.steps == 0 or len(la) == a.steps), (label, len(la), len(lb))
        lworst = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
        loss_rtol = a.rtol if a.loss_rtol is None else a.loss_rtol
        assert lworst <= loss_rtol, f"{label}: losses differ by {lworst:.2e} relative (more than {loss_rtol:g}): {list(zip(la, lb))}"
    A, B = load(a.ref), load(a.got)
    assert A.keys() == B.keys() and A, (label, sorted(set(A) ^ set(B)))
    G = max(float(np.abs(v).max()) for v in A.values())
    worst = 0.0
    for k in A:
        assert A[k].shape == B[k].shape, (label, k, A[k].shape, B[k].shape)
        if a.exact:
            assert np.array_equal(A[k], B[k]), f"{label}: {k} is not bit-identical (max diff {np.abs(A[k] - B[k]).max():.3e})"
        worst = max(worst, float(np.abs(A[k] - B[k]).max()) / max(float(np.abs(A[k]).max()), 1e-3 * G))
    assert worst <= a.rtol, f"{label}: gradients differ by {worst:.2e} relative (more than {a.rtol:g})"
    what = "bit-identical" if a.exact else f"worst {worst:.1e} relative"
    losses = f" and {len(la)} losses (worst {lworst:.1e} relative)" if a.losses else ""
    print(f"ok {label}: {len(A)} gradients, {what}{losses}")


if __name__ == "__main__":
    main()
