"""PyTorch peer of bench/train: the same model (models/transformer.py), batch and threads; one
step = forward, next-token cross-entropy over all positions, backward, global-norm clipping (1.0),
AdamW. Runs on torch 1.13 (Debian) and 2.x (PyPI). Prints one JSON line with the step times.
  torch_train.py CONFIG_JSON BATCH SEQ THREADS WARMUP STEPS [eager|compile]
compile: forward and loss under torch.compile (default mode, TorchInductor's CPU code; backward
through AOTAutograd), clipping and AdamW eager; the first warm-up step compiles. When compiling
fails, the JSON line holds {"error": reason} instead of times (exit status 0)."""
import json
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
from transformer import Config, TransformerLM  # noqa: E402

cfg, batch, seq, threads, warmup, steps = json.loads(sys.argv[1]), *map(int, sys.argv[2:7])
mode = sys.argv[7] if len(sys.argv) > 7 else "eager"
blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
info = {"version": torch.__version__, "threads": 0, "mode": mode, "blas": blas.group(1) if blas else "?"}
torch.set_num_threads(threads)
info["threads"] = torch.get_num_threads()
torch.manual_seed(0)
model = TransformerLM(Config(**cfg)).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def forward_loss(x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), y.reshape(-1))


if mode == "compile":
    if not hasattr(torch, "compile"):
        print(json.dumps(dict(info, error=f"torch.compile needs torch 2.x, this is {torch.__version__}")))
        sys.exit(0)
    forward_loss = torch.compile(forward_loss)
elif mode != "eager":
    sys.exit(f"torch_train.py: mode {mode!r}: eager or compile")

g = torch.Generator().manual_seed(1)
times, losses, first_ms = [], [], None
for step in range(warmup + steps):
    tokens = torch.randint(0, cfg["vocab"], (batch, seq + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    t0 = time.perf_counter()
    try:
        loss = forward_loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    except Exception as e:  # noqa: BLE001 (a compiler failure of any kind is reported, not raised)
        if mode != "compile":
            raise
        reason = (str(e).strip().splitlines() or [""])[0][:300]
        print(json.dumps(dict(info, error=f"{type(e).__name__}: {reason}", failed_step=step)))
        sys.exit(0)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    dt = (time.perf_counter() - t0) * 1e3
    if step == 0:
        first_ms = dt
    if step >= warmup:
        times.append(dt)
        losses.append(loss.item())
print(json.dumps(dict(info, times_ms=times, losses=losses, first_step_ms=first_ms)))
