#!/usr/bin/python3
"""Writes tests/data/activation_refs.csv: PyTorch's float32 forward values and gradients (dy = 1)
of every activation the importer fuses or has a gradient rule for, at points from -1e4 to 1e4,
where naive formulas overflow (exp(-2u) at x <= -12 in tanh-GELU) and produce inf*0 = NaN.
tests/unit/activation_stability_test.cpp checks the CPU kernels against it.

Run with Debian's python3-torch (1.13): /usr/bin/python3 tests/data/make_activation_refs.py
"""
import os

import torch
import torch.nn.functional as F

# 16 points (two 8-lane vectors), none at a kink (0 for LeakyRelu, +-3 for HardSwish), where the
# derivative is a convention rather than a value
POINTS = [-1e4, -1e2, -20.0, -12.0, -5.0, -1.0, -0.5, 0.25, 0.5, 1.0, 2.0, 5.0, 12.0, 20.0, 1e2, 1e4]
UP = 0.75  # SwiGLU's up operand: y = silu(g) * UP

OPS = {
    "Gelu": lambda x: F.gelu(x),
    "GeluTanh": lambda x: F.gelu(x, approximate="tanh"),
    "Silu": F.silu,
    "Sigmoid": torch.sigmoid,
    "Tanh": torch.tanh,
    "Softplus": F.softplus,  # beta 1, threshold 20, as ONNX's (which has no threshold) in float32
    "Softsign": F.softsign,
    "Mish": F.mish,
    "Elu": F.elu,
    "Selu": F.selu,
    "Celu": F.celu,
    "HardSwish": F.hardswish,
    "LeakyRelu": F.leaky_relu,
    "Erf": torch.erf,
    "SwiGLU": lambda g: F.silu(g) * UP,
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "activation_refs.csv")
    with open(out, "w") as f:
        f.write("# op,x,y,dy/dx (float32, PyTorch %s); SwiGLU: x is the gate, up = %r\n" % (torch.__version__, UP))
        for name, fn in OPS.items():
            x = torch.tensor(POINTS, dtype=torch.float32, requires_grad=True)
            y = fn(x)
            y.sum().backward()
            for xi, yi, gi in zip(x.tolist(), y.tolist(), x.grad.tolist()):
                f.write("%s,%r,%r,%r\n" % (name, xi, yi, gi))
    print("wrote", out)


if __name__ == "__main__":
    main()
