"""PyTorch peer of bench/train: the same model (models/transformer.py), batch and threads; one
step = forward, next-token cross-entropy over all positions, backward, global-norm clipping (1.0),
AdamW. Prints one JSON line with the step times.
  torch_train.py CONFIG_JSON BATCH SEQ THREADS WARMUP STEPS"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
from transformer import Config, TransformerLM  # noqa: E402

cfg, batch, seq, threads, warmup, steps = json.loads(sys.argv[1]), *map(int, sys.argv[2:7])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = TransformerLM(Config(**cfg)).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
g = torch.Generator().manual_seed(1)
times, losses = [], []
for step in range(warmup + steps):
    tokens = torch.randint(0, cfg["vocab"], (batch, seq + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    t0 = time.perf_counter()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    dt = (time.perf_counter() - t0) * 1e3
    if step >= warmup:
        times.append(dt)
        losses.append(loss.item())
print(json.dumps({"times_ms": times, "losses": losses, "version": torch.__version__, "threads": torch.get_num_threads()}))
