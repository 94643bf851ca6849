"""Shared parts of the benchmarks in bench/: the model shapes, cached exports, child processes
measured with their peak memory, the environment every peer runs in, and table printing.

Every peer runs as its own child process, one after the other (never two at once), with the same
thread settings. The peak resident memory of a child comes from wait4(2)'s rusage (ru_maxrss).
"""
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT_PY = "/usr/bin/python3"  # Debian's torch 1.13 (models/export.py, the PyTorch peer of bench/train)
VENV_PY = os.path.join(REPO, ".venv", "bin", "python")  # scripts/setup_python.sh: onnxruntime

# GPT-2 family models (models/transformer.py). "gpt2-small" is GPT-2 small (124 M parameters).
SHAPES = {
    "gpt-mini": dict(family="gpt2", vocab=8192, hidden=256, layers=4, heads=4, max_pos=128),
    "gpt2-small": dict(family="gpt2", vocab=50257, hidden=768, layers=12, heads=12, max_pos=1024),
}


def describe(name, batch, seq):
    c = SHAPES[name]
    return (f"{name}: {c['layers']} layers, hidden {c['hidden']}, {c['heads']} heads, vocab {c['vocab']}, "
            f"batch {batch} x seq {seq}")


def cache_dir(args_cache):
    d = args_cache or os.environ.get("OASES_BENCH_CACHE") or os.path.join(REPO, "build", "bench-models")
    os.makedirs(d, exist_ok=True)
    return d


def export(name, batch, seq, cache):
    """models/export.py --no-data into CACHE/NAME_bBxT (fixed input shape [batch, seq]); reused when
    the configuration file written beside it matches."""
    cfg = dict(SHAPES[name], batch=batch, seq=seq)
    out = os.path.join(cache, f"{name}_b{batch}x{seq}")
    stamp = os.path.join(out, "bench_config.json")
    model = os.path.join(out, "model.onnx")
    if os.path.exists(model) and os.path.exists(stamp) and json.load(open(stamp)) == cfg:
        return model
    shutil.rmtree(out, ignore_errors=True)
    cmd = [EXPORT_PY, os.path.join(REPO, "models", "export.py"), "--no-data", "--out", out, "--batch", str(batch),
           "--seq", str(seq)]
    for k, v in SHAPES[name].items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    print(f"exporting {name} (once, cached in {out}) ...", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    json.dump(cfg, open(stamp, "w"))
    return model


def peer_env(threads, keep_blas_env=False):
    """The environment of every peer: T threads for OpenMP, OpenBLAS (the PyTorch peer's BLAS) and
    ONNX Runtime (set through its session options). OPENBLAS_CORETYPE is removed unless asked to
    keep it, so OpenBLAS uses the kernels it detects for this CPU (a forced older core, e.g.
    Haswell on an AVX-512 machine, slows every OpenBLAS user: Oases and PyTorch alike)."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    if not keep_blas_env:
        env.pop("OPENBLAS_CORETYPE", None)
    return env


def run_rss(cmd, env, log_path):
    """Runs cmd with stdout and stderr into log_path; returns (text, peak RSS MiB of that child)."""
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    text = open(log_path).read()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{text[-4000:]}")
    return text, ru.ru_maxrss / 1024.0


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def print_table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def stamp():
    return time.strftime("%Y-%m-%d %H:%M:%S")


def load():
    """1-minute load average: other processes on the machine share the cores the peers run on."""
    return f"{os.getloadavg()[0]:.1f}"
