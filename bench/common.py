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


def die(msg):
    """A missing dependency or an unusable setup: one line on stderr, exit status 2."""
    print(f"bench: {msg}", file=sys.stderr)
    sys.exit(2)


def gemms(name, batch, seq, train=False):
    """The matrix products of one forward (train: forward and backward) of SHAPES[name] at batch x
    seq, as dicts {what, count, batch, m, n, k, ta, tb}: C[m, n] = op(A)[m, k] @ op(B)[k, n] in
    row-major storage, A transposed when ta, B when tb, `batch` independent products per call (the
    attention products, one per sequence and head), `count` calls per step. GPT-2 family only:
    fused c_attn [H, 3H], c_proj [H, H], c_fc [H, F], MLP c_proj [F, H] (Conv1D, stored [in, out]),
    the LM head x @ wte^T, attention scores Q K^T and context P V; biases, norms, softmax and the
    embedding gather are not products and not counted. Backward: every product's two operand
    gradients (the token embedding is trained, so even the first layer's input gradient is needed),
    so a training step has exactly 3x the forward's product FLOPs."""
    c = SHAPES[name]
    if c["family"] != "gpt2":
        raise ValueError(f"gemms: {name} is not a GPT-2 model")
    H, L, V, nh = c["hidden"], c["layers"], c["vocab"], c["heads"]
    F, hd, M = c.get("ffn") or 4 * H, H // nh, batch * seq
    fwd = [("c_attn", L, 1, M, 3 * H, H, False, False), ("attn c_proj", L, 1, M, H, H, False, False),
           ("c_fc", L, 1, M, F, H, False, False), ("mlp c_proj", L, 1, M, H, F, False, False),
           ("lm_head", 1, 1, M, V, H, False, True),
           ("scores QK^T", L, batch * nh, seq, seq, hd, False, True), ("context PV", L, batch * nh, seq, hd, seq, False, False)]
    out = []
    for what, count, nb, m, n, k, ta, tb in fwd:
        out.append((what, count, nb, m, n, k, ta, tb))
        if not train:
            continue
        # d op(A) [m, k] = dC [m, n] @ op(B)^T; stored transposed (ta): dA [k, m] = op(B) @ dC^T
        out.append((f"{what} dA", count, nb) + ((k, m, n, tb, True) if ta else (m, k, n, False, not tb)))
        # d op(B) [k, n] = op(A)^T @ dC; stored transposed (tb): dB [n, k] = dC^T @ op(A)
        out.append((f"{what} dB", count, nb) + ((n, k, m, True, ta) if tb else (k, n, m, not ta, False)))
    return [dict(what=w, count=cn, batch=nb, m=m, n=n, k=k, ta=ta, tb=tb) for w, cn, nb, m, n, k, ta, tb in out]


def gemm_flops(gs):
    """2 m n k per product, summed over a gemms() list."""
    return sum(2.0 * g["m"] * g["n"] * g["k"] * g["batch"] * g["count"] for g in gs)


def openblas_of(binary):
    """The OpenBLAS library file the binary loads (ldd), symbolic links resolved."""
    try:
        text = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"ldd {binary} failed: {e}")
    for line in text.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and "openblas" in parts[0] and parts[1].split():
            path = parts[1].split()[0]
            if os.path.exists(path):
                return os.path.realpath(path)
    die(f"{binary} does not link OpenBLAS (ldd finds no libopenblas): no sgemm roof to measure")


def measure_roof(lib, gs, env, log_path, min_time=0.2):
    """bench/roof.py in its own process with the peers' environment: cblas_sgemm of LIB on every
    shape of gs; returns its JSON (per-shape times, 'gflops' = sum of FLOPs / sum of times)."""
    cmd = [EXPORT_PY, os.path.join(REPO, "bench", "roof.py"), lib, json.dumps(dict(gemms=gs, min_time=min_time))]
    text, _ = run_rss(cmd, env, log_path)
    return json.loads(text.strip().splitlines()[-1])


def describe(name, batch, seq):
    c = SHAPES[name]
    return (f"{name}: {c['layers']} layers, hidden {c['hidden']}, {c['heads']} heads, vocab {c['vocab']}, "
            f"batch {batch} x seq {seq}")


def add_common_args(ap, peer, rounds):
    """The options both side-by-side benchmarks take."""
    ap.add_argument("--shapes", default="gpt-mini,gpt2-small", help=f"comma-separated, of {list(SHAPES)}")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=rounds, help=f"alternating rounds of Oases and {peer}")
    ap.add_argument("--cache", default="", help="folder for exported models (default build/bench-models)")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--keep-blas-env", action="store_true", help="keep OPENBLAS_CORETYPE from the environment")
    ap.add_argument("--blas-core", default="", help="set OPENBLAS_CORETYPE for every peer and the roof (e.g. SkylakeX "
                    "where OpenBLAS does not know the CPU and falls back to its Prescott kernels)")
    ap.add_argument("--profile", action="store_true", help="also print Oases' time per op type")
    ap.add_argument("--json", default="", help="write the results here")


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


def peer_env(threads, keep_blas_env=False, blas_core=""):
    """The environment of every peer: T threads for OpenMP, OpenBLAS (the PyTorch peer's BLAS) and
    ONNX Runtime (set through its session options). OPENBLAS_CORETYPE is removed unless asked to
    keep it, so OpenBLAS uses the kernels it detects for this CPU (a forced older core, e.g.
    Haswell on an AVX-512 machine, slows every OpenBLAS user: Oases and PyTorch alike); blas_core
    sets it for all of them. Oases itself switches to the CPU's kernels where OpenBLAS falls back
    to a generic core (oases_blas); an OPENBLAS_CORETYPE set here it obeys."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    if not keep_blas_env:
        env.pop("OPENBLAS_CORETYPE", None)
    if blas_core:
        env["OPENBLAS_CORETYPE"] = blas_core
    return env


def oases_blas(binary, env):
    """(core, line): the OpenBLAS core an oases tool runs in env and how it chose it, from its
    --version line "OpenBLAS core SkylakeX (auto: detected Prescott on an AVX-512 CPU)"."""
    try:
        text = subprocess.run([binary, "--version"], env=env, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"{binary} --version failed: {e}")
    line = next((ln for ln in text.splitlines() if ln.startswith("OpenBLAS core ")), "")
    if not line:
        die(f"{binary} --version names no OpenBLAS core (an older build?): {text.strip()}")
    return line.split()[2], line


def roof_env(env, oases_core):
    """The roof's environment: the peers', with the OpenBLAS core Oases runs (which Oases may have
    chosen itself), so that "of roof" compares Oases with its own kernels."""
    return dict(env, OPENBLAS_CORETYPE=oases_core)


def detected_core(lib, env):
    """The core OpenBLAS (the file lib) picks by itself in env: what PyTorch 1.13 runs."""
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.openblas_get_corename.restype = ctypes.c_char_p; "
            "print(lib.openblas_get_corename().decode())")
    try:
        return subprocess.run([EXPORT_PY, "-c", code, lib], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def blas_warning(core, users="Oases and the roof"):
    """A line for the table's notes when OpenBLAS runs its generic Prescott (SSE3) kernels on a CPU
    with AVX2/AVX-512 for `users`: OpenBLAS does not know the CPU model (0.3.21 and e.g. Emerald
    Rapids, family 6 model 207) and falls back, which slows every OpenBLAS user several times that
    does not choose its core itself (Oases does, unless OASES_BLAS_AUTO=0)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return ""
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model\t")), "?")
    best = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else ""
    if core != "Prescott" or not best:
        return ""
    return (f"WARNING: OpenBLAS runs its Prescott (SSE3) kernels for {users}: it does not know this CPU (model {model}) "
            f"and fell back (--blas-core {best} forces its {best} kernels)")


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
