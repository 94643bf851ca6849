#!/usr/bin/env python3
"""The PyTorch side of bench/gpu/run.sh: the GPT of models/transformer.py (the definition that
models/export.py exports to ONNX, left unchanged) trained on random tokens at the same shapes,
dtype and optimizer as the oases-train side: AdamW (lr 1e-4, no weight decay), global-norm clip 1,
constant lr; bf16/fp16 through autocast with fp32 master weights, fp16 with a dynamic loss scaler.

PyTorch runs in the modes a demanding user would compare with, each in its own child process
(so that one mode's failure, hang or memory does not touch the others):

  eager    eager mode with the same math through PyTorch's fast paths, swapped in here (the
           module classes of the built model are replaced; models/transformer.py is untouched):
           attention through torch.nn.functional.scaled_dot_product_attention (causal; torch picks
           the flash / cuDNN / memory-efficient kernel), GPT-2's gelu_new through
           F.gelu(approximate="tanh") (the same formula), Conv1D through torch.addmm (as Hugging
           Face's Conv1D computes it); AdamW with fused=True (foreach where fused is refused)
  compile  the same model and optimizer, the forward pass and the loss under torch.compile
           (--compile-scope blocks, the default: PyTorch's "regional compilation", each block
           compiled in place, one graph shared by all blocks, and the final norm + LM head +
           cross-entropy as a second region: a fraction of the compile time; model: the whole
           forward and loss as one graph, torch.compile(loss_fn), the longest compile)
  manual   models/transformer.py as written (hand-written attention), eager, fused AdamW: the
           baseline of the earlier runs (not run by default)

A torch without scaled_dot_product_attention (before 2.0, e.g. Debian's 1.13) keeps the
hand-written attention in eager mode and says so; a torch without torch.compile reports that mode
"unavailable". The eager child first checks on the device, in fp32 at a tiny shape, that the
swapped model computes the same logits and gradients as models/transformer.py ("same_math").

Per mode: median step time over --steps timed steps after --warmup untimed ones (compile has one
more: its first step, which compiles, is timed separately as compile_s),
tokens/s, peak device memory (torch.cuda.max_memory_allocated / max_memory_reserved), the
attention and optimizer actually used. Every step is synchronised and host-timed, as on the
oases-train side. Writes one JSON object to --out: {"torch": ..., "modes": {mode: {...}}}; each
mode has "status": "ok" | "failed" | "unavailable" and, unless ok, "reason". Exits 0 when the
JSON was written (whatever the modes' status), 2 on bad arguments or an unusable device.

  python3 bench/gpu/pytorch_ref.py --hidden 1024 --layers 24 --heads 16 --batch 8 --seq 1024 \
      --modes eager,compile --out /tmp/torch.json
"""
import argparse
import contextlib
import copy
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))

MODES = ("eager", "compile", "manual")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in (("hidden", 1024), ("layers", 24), ("heads", 16), ("batch", 8), ("seq", 1024), ("vocab", 50257),
                 ("steps", 10), ("warmup", 2)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--modes", default="eager,compile", help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile's mode (default, max-autotune-no-cudagraphs, reduce-overhead, ...)")
    ap.add_argument("--compile-scope", default="blocks", choices=["model", "blocks"])
    ap.add_argument("--mode-timeout", type=float, default=420.0, help="seconds a mode's child may run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 1:
        ap.error("--steps and --warmup must be at least 1")
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes: unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    a.mode_list = modes
    return a


# ---------------------------------------------------------------------------------------------
# the fast paths, swapped into a built TransformerLM (same parameters, same math)

def make_fast_classes():
    import torch
    import torch.nn.functional as F
    import transformer as T

    has_sdpa = hasattr(F, "scaled_dot_product_attention")

    class SDPAAttention(T.Attention):
        """models/transformer.py's Attention with its attend() (scores, masks, softmax, weighted sum)
        through F.scaled_dot_product_attention (scale 1/sqrt(head dim), as there)."""

        def attend(self, q, k, v, add_mask=None):
            c = self.c
            Tn = q.size(2)
            mask, causal = add_mask, bool(c.causal)
            if mask is not None and causal:  # SDPA takes a mask or is_causal, not both
                mask = mask + torch.full((Tn, Tn), torch.finfo(mask.dtype).min, dtype=mask.dtype,
                                         device=mask.device).triu(1)
                causal = False
            if mask is not None:
                mask = mask.to(q.dtype)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.drop.p if self.training else 0.0,
                                                  is_causal=causal)

    class FusedNewGELU(T.NewGELU):
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as one op."""

        def forward(self, x):
            return F.gelu(x, approximate="tanh")

    class AddmmConv1D(T.Conv1D):
        """x @ W + b as one addmm (Hugging Face's Conv1D)."""

        def forward(self, x):
            out = torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight)
            return out.view(*x.shape[:-1], self.weight.size(-1))

    return has_sdpa, SDPAAttention, FusedNewGELU, AddmmConv1D


def swap_fast(model):
    """Swaps the fast paths into `model` in place; returns a description of what was swapped."""
    import transformer as T
    has_sdpa, SDPAAttention, FusedNewGELU, AddmmConv1D = make_fast_classes()
    swapped = {"attention": "sdpa" if has_sdpa else "manual (this torch has no scaled_dot_product_attention)",
               "gelu_new": "F.gelu(approximate='tanh')", "conv1d": "torch.addmm"}
    for m in model.modules():
        if type(m) is T.Attention and has_sdpa:
            m.__class__ = SDPAAttention
        elif type(m) is T.NewGELU:
            m.__class__ = FusedNewGELU
        elif type(m) is T.Conv1D:
            m.__class__ = AddmmConv1D
    return swapped


def same_math(torch, dev):
    """The swapped model against models/transformer.py's, fp32 on `dev`, at a tiny shape: the largest
    difference of logits and gradients relative to the largest magnitude of each."""
    from transformer import Config, TransformerLM
    torch.manual_seed(1)
    cfg = Config(family="gpt2", vocab=128, hidden=64, layers=2, heads=4, max_pos=32)
    with device_ctx(torch, dev):
        ref = TransformerLM(cfg).to(dev)
    fast = copy.deepcopy(ref)
    swap_fast(fast)
    x = torch.randint(0, cfg.vocab, (2, 32), device=dev)

    def run(m):
        m.zero_grad(set_to_none=True)
        if m is ref and dev == "cuda":  # the original makes its position ids with torch.arange
            with device_ctx(torch, dev):
                logits = m(x)
        else:
            logits = m(x)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        loss.backward()
        return logits.detach(), {n: p.grad.detach() for n, p in m.named_parameters()}

    lr, gr = run(ref)
    lf, gf = run(fast)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    return {"logits_max_rel": rel(lf, lr), "grads_max_rel": max(rel(gf[n], gr[n]) for n in gr)}


def device_ctx(torch, dev):
    """Builds tensors on `dev` without a default device for the whole run (torch >= 2.0)."""
    if hasattr(torch.device(dev), "__enter__"):
        return torch.device(dev)
    return contextlib.nullcontext()


def sdpa_kernel_name(torch, a, dtype):
    """The CUDA kernel torch runs for causal SDPA at the bench's attention shape (forward), found with
    the profiler: flash, cuDNN or memory-efficient."""
    import torch.nn.functional as F
    hd = a.hidden // a.heads
    q = torch.randn(a.batch, a.heads, a.seq, hd, device="cuda", dtype=dtype)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.cuda.synchronize()
    names = [e.key for e in p.key_averages()]
    for key, label in (("cudnn", "cudnn"), ("flash", "flash"), ("fmha", "memory-efficient"), ("efficient", "memory-efficient")):
        hit = [n for n in names if key in n.lower()]
        if hit:
            return f"{label} ({hit[0][:80]})"
    return "unknown (" + "; ".join(n[:40] for n in names[:3]) + ")"


# ---------------------------------------------------------------------------------------------
# one mode, in a child process

def run_mode(a, mode):
    import torch
    from transformer import Config, TransformerLM
    dev = a.device
    res = {"mode": mode, "status": "ok"}
    if mode == "compile" and not hasattr(torch, "compile"):
        return {"mode": mode, "status": "unavailable", "reason": f"torch {torch.__version__} has no torch.compile"}
    if dev == "cuda" and not torch.cuda.is_available():
        return {"mode": mode, "status": "failed", "reason": "PyTorch sees no CUDA device"}
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.dtype)
    if mode == "eager":
        chk = same_math(torch, dev)
        res["same_math"] = chk
        if max(chk.values()) > 1e-4:
            return dict(res, status="failed",
                        reason=f"the swapped fast paths differ from models/transformer.py (fp32, relative {max(chk.values()):.2e})")
    torch.manual_seed(0)
    cfg = Config(family="gpt2", vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, max_pos=a.seq)
    with device_ctx(torch, dev):
        model = TransformerLM(cfg).to(dev)
    if mode == "manual":
        res["swapped"] = {"attention": "manual (models/transformer.py as written)"}
        if dev == "cuda" and hasattr(torch, "set_default_device"):
            torch.set_default_device("cuda")  # the original makes its position ids with torch.arange
    else:
        res["swapped"] = swap_fast(model)
    params = list(model.parameters())
    opt = None
    for kw, label in (({"fused": True}, "AdamW(fused=True)"), ({"foreach": True}, "AdamW(foreach=True)"), ({}, "AdamW")):
        try:
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, **kw)
            res["optimizer"] = label
            break
        except (TypeError, RuntimeError, ValueError) as e:
            res.setdefault("optimizer_fallbacks", []).append(f"{label}: {str(e).splitlines()[0][:120]}")
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler(dev, enabled=a.dtype == "fp16")
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=a.dtype == "fp16")

    def loss_of(x):
        with torch.autocast(dev, dtype=amp or torch.bfloat16, enabled=amp is not None):
            logits = model(x[:, :-1])
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))

    fwd = loss_of
    if mode == "compile":
        kw = {} if a.compile_mode == "default" else {"mode": a.compile_mode}
        what = "regional: each block, and head + loss" if a.compile_scope == "blocks" else "forward + loss as one graph"
        res["compile"] = f"torch.compile ({what}{', mode ' + a.compile_mode if kw else ''})"
        if a.compile_scope == "blocks":
            # regional compilation: every block in place (nn.Module.compile: one compiled graph
            # shared by all blocks), and the head with the loss (final norm, LM head, fp32 cast,
            # cross-entropy fused) as a second region; the embeddings stay eager
            for blk in model.h:
                blk.compile(**kw)

            def head_loss(h, y):
                with torch.autocast(dev, dtype=amp or torch.bfloat16, enabled=amp is not None):
                    logits = model.lm_head(model.ln_f(h))
                return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
            head_loss = torch.compile(head_loss, **kw)

            def fwd(x):
                with torch.autocast(dev, dtype=amp or torch.bfloat16, enabled=amp is not None):
                    h = model.body(x[:, :-1])
                return head_loss(h, x[:, 1:])
        else:
            fwd = torch.compile(loss_of, **kw)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = []
    warm = a.warmup + (1 if mode == "compile" else 0)  # compile: the compiling step is one more
    gen = torch.Generator(device=dev).manual_seed(0)
    for i in range(warm + a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev, generator=gen)
        sync()
        t0 = time.perf_counter()
        loss = fwd(x)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1000)
    med = statistics.median(times[warm:])
    res.update({"median_ms": med, "min_ms": min(times[warm:]), "max_ms": max(times[warm:]),
                "tokens_per_s": a.batch * a.seq / (med / 1000), "warmup": warm, "steps_timed": a.steps,
                "first_step_ms": times[0], "final_loss": float(loss.detach())})
    if mode == "compile":
        res["compile_s"] = times[0] / 1000
    if not math.isfinite(res["final_loss"]):
        res.update(status="failed", reason=f"the loss is {res['final_loss']}")
    if dev == "cuda":
        res["max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        res["max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        if res["swapped"]["attention"] == "sdpa":  # after the timed steps: the profiler stays out of them
            try:
                res["sdpa_kernel"] = sdpa_kernel_name(torch, a, amp or torch.float32)
            except Exception as e:  # only a label
                res["sdpa_kernel"] = f"unknown ({type(e).__name__})"
    return res


def versions():
    import torch
    v = {"torch": torch.__version__, "device": "cpu"}
    if torch.cuda.is_available():
        v.update(device=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                 cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
        try:
            v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    return v


def child(a):
    try:
        res = run_mode(a, a.child)
    except Exception as e:  # reported, not raised: the parent writes it into the table
        import traceback
        msg = str(e).strip().splitlines()
        res = {"mode": a.child, "status": "failed",
               "reason": f"{type(e).__name__}: {msg[0][:300] if msg else ''}",
               "traceback_tail": traceback.format_exc().splitlines()[-6:]}
        if "out of memory" in str(e).lower():
            res["reason"] = "out of memory: " + res["reason"]
    try:
        res["versions"] = versions()
    except Exception:
        pass
    with open(a.out, "w") as f:
        json.dump(res, f)


def parent(a, argv):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"error: {sys.executable} has no PyTorch: {e}", file=sys.stderr)
        sys.exit(2)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: PyTorch sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    if a.device == "cpu" and a.dtype == "fp16":
        print("error: fp16 autocast is GPU-only in PyTorch; use bf16 or fp32 with --device cpu", file=sys.stderr)
        sys.exit(2)
    # versions of the device side come from the children: this process stays off the GPU
    out = {"torch": torch.__version__, "device": a.device, "config": {k: getattr(a, k) for k in ("hidden", "layers", "heads", "batch", "seq", "vocab", "dtype",
                                                               "steps", "warmup", "compile_mode", "compile_scope")},
           "modes": {}}
    # the child gets the same arguments with its own mode and output
    args = []
    skip = False
    for x in argv:
        if skip:
            skip = False
            continue
        if x in ("--out", "--modes", "--child"):
            skip = True
            continue
        if x.startswith(("--out=", "--modes=", "--child=")):
            continue
        args.append(x)
    for mode in a.mode_list:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            path = tf.name
        t0 = time.perf_counter()
        cmd = [sys.executable, os.path.abspath(__file__), *args, "--child", mode, "--out", path]
        # its own process group, so that a timeout also ends what it started (torch.compile's workers);
        # that group is outside ours, so a SIGTERM to us (run.sh stopped by a timeout) is passed on
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def stop(signum, _frame, p=p, mode=mode):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            out["modes"][mode] = {"mode": mode, "status": "failed", "reason": f"stopped (signal {signum})"}
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)
            sys.exit(128 + signum)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            log, _ = p.communicate(timeout=a.mode_timeout)
            res = None
            if os.path.getsize(path) > 0:
                with open(path) as f:
                    res = json.load(f)
            if res is None:
                tail = [ln for ln in log.strip().splitlines() if ln.strip()][-1:] or [""]
                res = {"mode": mode, "status": "failed",
                       "reason": f"the child exited with {p.returncode} without a result: {tail[0][:300]}"}
            if log.strip():
                res["log_tail"] = log.strip().splitlines()[-8:]
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.communicate()
            res = {"mode": mode, "status": "failed", "reason": f"timed out after {a.mode_timeout:g} s"}
        finally:
            os.unlink(path)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        for k, v in res.pop("versions", {}).items():
            out.setdefault("versions_from", mode)
            if out.get("versions_from") == mode:
                out[k] = v
        out["modes"][mode] = res
        what = (f"{res['median_ms']:.1f} ms/step" if res["status"] == "ok" else f"{res['status']}: {res.get('reason', '')}")
        print(f"pytorch {mode}: {what} ({res['wall_s']:.0f} s)", file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.child:
        child(a)
    else:
        parent(a, argv)


if __name__ == "__main__":
    main()
