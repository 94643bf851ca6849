"""The OpenBLAS sgemm roof of bench/forward and bench/train: times cblas_sgemm of the given OpenBLAS
library (the file oases-run / oases-train load, found by the bench with ldd) on a model's matrix
products, in the environment of the peers (OPENBLAS_NUM_THREADS = T threads) with OPENBLAS_CORETYPE
set to the core Oases runs (which Oases may have chosen itself: bench/common.py roof_env). Called through ctypes on that very library file, so neither numpy's BLAS nor another
copy of OpenBLAS takes part; numpy only holds the (random) operands.
  roof.py LIBOPENBLAS SPEC_JSON
SPEC_JSON: {"gemms": [{what, count, batch, m, n, k, ta, tb}, ...], "min_time": seconds}.

Each shape is timed two ways with the same T threads, and the faster counts (a roof is the best the
library does on these shapes):
  blas   one cblas_sgemm per product with OpenBLAS's own T threads (how PyTorch calls it);
  split  T threads each calling a single-threaded cblas_sgemm on its share: column blocks of the
         output (row blocks when it is narrow), or its share of a batch of products (how Oases
         calls it, kernels/cpu/gemm.cpp). Each thread loops over its share R times, so the time is
         the sustained rate, without the per-product hand-off a framework pays.
A shape with batch > 1 (the attention products, one per sequence and head) is that many products.
Each way: one untimed run, then timed runs until at least 3 and min_time seconds (at most 50); the
fastest counts (other processes on a shared machine only ever slow a run down: a roof is a best case). Prints one JSON line: the library, its core and T, each shape's ms both ways and
GFLOP/s, and "gflops" = all FLOPs (x count) / all best times (x count): the rate at which OpenBLAS
alone computes this model's products on T threads."""
import ctypes
import json
import math
import os
import sys
import threading
import time

try:
    import numpy as np
except ImportError:
    print("roof.py: needs numpy (Debian: apt-get install python3-numpy)", file=sys.stderr)
    sys.exit(2)

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def timed(run, min_time):
    """Fastest seconds of run() (which returns its own time) after one untimed run."""
    run()
    times, start = [], time.perf_counter()
    while len(times) < 50 and (len(times) < 3 or time.perf_counter() - start < min_time):
        times.append(run())
    return min(times)


def main():
    path, spec = sys.argv[1], json.loads(sys.argv[2])
    lib = ctypes.CDLL(path)
    lib.openblas_get_corename.restype = ctypes.c_char_p
    lib.openblas_get_config.restype = ctypes.c_char_p
    config = lib.openblas_get_config().decode()
    threads = lib.openblas_get_num_threads()
    # blasint is 64-bit in an ILP64 build (USE64BITINT in its configuration)
    bi = ctypes.c_int64 if "USE64BITINT" in config else ctypes.c_int
    sgemm = lib.cblas_sgemm  # a ctypes.CDLL call releases the GIL: the split threads run in parallel
    sgemm.restype = None
    sgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, bi, bi, bi, ctypes.c_float, ctypes.c_void_p, bi,
                      ctypes.c_void_p, bi, ctypes.c_float, ctypes.c_void_p, bi]
    rng = np.random.default_rng(0)
    shapes, total_flops, total_s = [], 0.0, 0.0
    for g in spec["gemms"]:
        m, n, k, nb, ta, tb = g["m"], g["n"], g["k"], g["batch"], g["ta"], g["tb"]
        a = rng.standard_normal((nb,) + ((k, m) if ta else (m, k)), dtype=np.float32)
        b = rng.standard_normal((nb,) + ((n, k) if tb else (k, n)), dtype=np.float32)
        c = np.zeros((nb, m, n), dtype=np.float32)
        lda, ldb, f4 = a.shape[2], b.shape[2], 4
        opa, opb = TRANS if ta else NO_TRANS, TRANS if tb else NO_TRANS

        def call(i, m0, m1, n0, n1):
            """Arguments of the sgemm computing rows m0:m1, columns n0:n1 of product i."""
            pa = a[i].ctypes.data + f4 * (m0 if ta else m0 * lda)
            pb = b[i].ctypes.data + f4 * (n0 * ldb if tb else n0)
            pc = c[i].ctypes.data + f4 * (m0 * n + n0)
            return (ROW_MAJOR, opa, opb, m1 - m0, n1 - n0, k, 1.0, pa, lda, pb, ldb, 0.0, pc, n)

        whole = [call(i, 0, m, 0, n) for i in range(nb)]

        def run_blas():
            t0 = time.perf_counter()
            for args in whole:
                sgemm(*args)
            return time.perf_counter() - t0

        lib.openblas_set_num_threads(threads)
        s_blas = timed(run_blas, spec["min_time"])
        s_split = None
        if threads > 1:
            if nb >= threads:
                shares = [[whole[i] for i in range(t, nb, threads)] for t in range(threads)]
            elif n >= 64 * threads:
                step = max(16, math.ceil(n / threads / 16) * 16)
                shares = [[call(0, 0, m, j, min(n, j + step))] for j in range(0, n, step)]
            else:
                step = max(8, math.ceil(m / threads / 8) * 8)
                shares = [[call(0, i, min(m, i + step), 0, n)] for i in range(0, m, step)]
            reps = max(1, min(1000, math.ceil(0.02 / max(s_blas, 1e-6))))
            go = threading.Barrier(len(shares) + 1)

            def worker(share):
                go.wait()
                for _ in range(reps):
                    for args in share:
                        sgemm(*args)

            def run_split():
                ts = [threading.Thread(target=worker, args=(sh,)) for sh in shares]
                for t in ts:
                    t.start()
                go.wait()
                t0 = time.perf_counter()
                for t in ts:
                    t.join()
                return (time.perf_counter() - t0) / reps

            lib.openblas_set_num_threads(1)
            s_split = timed(run_split, spec["min_time"])
        s = min(s_blas, s_split) if s_split is not None else s_blas
        flops = 2.0 * m * n * k * nb
        shapes.append(dict(g, ms=s * 1e3, ms_blas=s_blas * 1e3, ms_split=None if s_split is None else s_split * 1e3,
                           gflops=flops / s / 1e9))
        total_flops += flops * g["count"]
        total_s += s * g["count"]
    maps = open("/proc/self/maps").read()
    loaded = sorted({ln.split()[-1] for ln in maps.splitlines() if "openblas" in ln and ln.split()[-1].startswith("/")})
    print(json.dumps(dict(lib=os.path.realpath(path), loaded=loaded, core=lib.openblas_get_corename().decode(), config=config,
                          threads=threads, gflops=total_flops / total_s / 1e9, total_ms=total_s * 1e3, shapes=shapes)))


if __name__ == "__main__":
    main()
