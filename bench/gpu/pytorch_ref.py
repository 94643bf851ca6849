#!/usr/bin/env python3
"""The PyTorch side of bench/gpu/run.sh: the same GPT (models/transformer.py, the definition that
models/export.py exports) trained on random tokens at the same shapes, dtype and optimizer as the
oases-train side (AdamW, no weight decay, global-norm clip 1; bf16/fp16 through autocast with fp32
master weights, fp16 with a dynamic loss scaler). Writes the median step time after two warm-up
steps as JSON. --device cpu is the pipeline's smoke test. Exits 2 when the device is not usable."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))


def main():
    ap = argparse.ArgumentParser()
    for k, v in (("hidden", 1024), ("layers", 24), ("heads", 16), ("batch", 8), ("seq", 1024), ("vocab", 50257),
                 ("steps", 14)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.steps < 3:
        print("error: --steps must be at least 3 (two warm-up steps are not timed)", file=sys.stderr)
        sys.exit(2)
    import torch
    from transformer import Config, TransformerLM
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("error: PyTorch sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    if dev == "cpu" and a.dtype == "fp16":
        print("error: fp16 autocast is GPU-only in PyTorch; use bf16 or fp32 with --device cpu", file=sys.stderr)
        sys.exit(2)
    if dev == "cuda" and hasattr(torch, "set_default_device"):
        torch.set_default_device("cuda")  # the model makes its position ids with torch.arange
    torch.manual_seed(0)
    cfg = Config(family="gpt2", vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, max_pos=a.seq)
    model = TransformerLM(cfg).to(dev)
    kw = {"fused": True} if dev == "cuda" and int(torch.__version__.split(".")[0]) >= 2 else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, **kw)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.dtype)
    scaler = torch.cuda.amp.GradScaler(enabled=a.dtype == "fp16")
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = []
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=amp or torch.bfloat16, enabled=amp is not None):
            logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1000)
    with open(a.out, "w") as f:
        json.dump({"median_ms": statistics.median(times[2:]), "torch": torch.__version__, "device": dev,
                   "final_loss": float(loss)}, f)


if __name__ == "__main__":
    main()
