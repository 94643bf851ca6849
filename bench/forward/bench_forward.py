"""Forward time of oases-run's executor against ONNX Runtime on GPT-2-family models, side by side,
and each one's GFLOP/s as a share of the OpenBLAS sgemm roof measured in the same run (bench/roof.py
on the model's matrix products, each round after the peers). See bench/README.md. Run through
bench/forward/run.sh."""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np
from onnx import TensorProto, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    common.add_common_args(ap, "ONNX Runtime", rounds=3)
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per round and peer")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per round and peer")
    a = ap.parse_args()

    cache = common.cache_dir(a.cache)
    env = common.peer_env(a.threads, a.keep_blas_env, a.blas_core)
    lib = common.openblas_of(os.path.join(a.bin, "oases-run"))
    oases_core, blas = common.oases_blas(os.path.join(a.bin, "oases-run"), env)
    renv = common.roof_env(env, oases_core)
    results = []
    roof_info = {}
    load_start = common.load()
    for name in a.shapes.split(","):
        model = common.export(name, a.batch, a.seq, cache)
        work = os.path.join(os.path.dirname(model), "forward")
        os.makedirs(work, exist_ok=True)
        ids = np.random.RandomState(0).randint(0, common.SHAPES[name]["vocab"], size=(a.batch, a.seq)).astype(np.int64)
        with open(os.path.join(work, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(ids, "input_ids").SerializeToString())
        gs = common.gemms(name, a.batch, a.seq)
        flops = common.gemm_flops(gs)
        oases_t, ort_t, rss, roofs = [], [], {"oases": 0.0, "ort": 0.0}, []
        max_diff, ort_version = None, "?"
        print(f"{common.describe(name, a.batch, a.seq)}: {a.rounds} rounds x {a.repeat} runs each ...", file=sys.stderr,
              flush=True)
        for r in range(a.rounds):
            first = r == 0
            cmd = [os.path.join(a.bin, "oases-run"), model, "--data-set", work, "--threads", str(a.threads), "--warmup",
                   str(a.warmup), "--repeat", str(a.repeat), "-v"]
            if first:
                cmd += ["--write-outputs", os.path.join(work, "oases_out")]
            if a.profile and r == a.rounds - 1:
                cmd += ["--profile"]
            text, peak = common.run_rss(cmd, env, os.path.join(work, "oases.log"))
            rss["oases"] = max(rss["oases"], peak)
            m = re.search(r"runs:([ 0-9.]+)", text)
            oases_t += [float(x) for x in m.group(1).split()]
            m = re.search(r"^blas: OpenBLAS core (\S+)", text, re.M)
            if not m or m.group(1) != oases_core:
                common.die(f"oases-run ran OpenBLAS core {m.group(1) if m else '?'}, its --version said {oases_core}")
            if a.profile and r == a.rounds - 1:
                print(text[text.index("profile"):], file=sys.stderr)
            cmd = [common.VENV_PY, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_forward.py"), model, work,
                   str(a.threads), str(a.warmup), str(a.repeat)]
            if first:
                cmd += [os.path.join(work, "ort_out.npy")]
            text, peak = common.run_rss(cmd, env, os.path.join(work, "ort.log"))
            rss["ort"] = max(rss["ort"], peak)
            j = json.loads(text.strip().splitlines()[-1])
            ort_t += j["times_ms"]
            ort_version = j["version"]
            if first:
                tp = TensorProto()
                tp.ParseFromString(open(os.path.join(work, "oases_out", "output_0.pb"), "rb").read())
                mine = numpy_helper.to_array(tp)
                ref = np.load(os.path.join(work, "ort_out.npy"))
                max_diff = float(np.abs(mine - ref).max())
                scale = float(np.abs(ref).max())
                os.remove(os.path.join(work, "ort_out.npy"))
                shutil.rmtree(os.path.join(work, "oases_out"), ignore_errors=True)
            roof_info = common.measure_roof(lib, gs, renv, os.path.join(work, "roof.log"))
            roofs.append(roof_info["gflops"])
        mo, mr, roof = common.median(oases_t), common.median(ort_t), max(roofs)
        results.append(dict(model=name, config=common.SHAPES[name], batch=a.batch, seq=a.seq, threads=a.threads,
                            oases_ms=mo, ort_ms=mr, ratio=mo / mr, oases_runs=oases_t, ort_runs=ort_t,
                            gflop=flops / 1e9, roof_gflops=roof, roof_rounds=roofs, roof_shapes=roof_info["shapes"],
                            oases_gflops=flops / mo / 1e6, ort_gflops=flops / mr / 1e6,
                            oases_roof_pct=100 * flops / mo / 1e6 / roof, ort_roof_pct=100 * flops / mr / 1e6 / roof,
                            oases_rss_mib=rss["oases"], ort_rss_mib=rss["ort"], max_abs_diff=max_diff,
                            max_abs_logit=scale, ort_version=ort_version))
    print(f"\nforward, {a.threads} threads, median of {a.rounds}x{a.repeat} runs per peer ({common.stamp()}); "
          f"onnxruntime {results[0]['ort_version']}; Oases: {blas}; load average {load_start} -> {common.load()}")
    print(f"roof: cblas_sgemm of {roof_info['lib']} ({roof_info['core']}; {roof_info['threads']} OpenBLAS threads or as many single-threaded calls on blocks, the "
          f"faster per product) on the model's "
          f"products, the best of {a.rounds} rounds; GFLOP/s = GFLOP of the products / median ms (bench/README.md)")
    rows = []
    for r in results:
        rows.append([r["model"], f"{r['batch']}x{r['seq']}", f"{r['oases_ms']:.1f}", f"{r['ort_ms']:.1f}", f"{r['ratio']:.2f}",
                     f"{r['gflop']:.2f}", f"{r['roof_gflops']:.1f}", f"{r['oases_gflops']:.1f} / {r['ort_gflops']:.1f}",
                     f"{r['oases_roof_pct']:.0f}% / {r['ort_roof_pct']:.0f}%",
                     f"{r['oases_rss_mib']:.0f} / {r['ort_rss_mib']:.0f}", f"{r['max_abs_diff']:.1e}"])
    common.print_table(["model", "batch x seq", "Oases ms", "ORT ms", "ratio Oases/ORT", "GFLOP", "roof GFLOP/s",
                        "GFLOP/s Oases / ORT", "of roof Oases / ORT", "peak RSS MiB Oases / ORT", "max abs logit diff"], rows)
    w = common.blas_warning(oases_core, "Oases and the roof")
    if w:
        print(w)
    if oases_core != roof_info["core"]:
        print(f"WARNING: Oases ran OpenBLAS core {oases_core}, the roof {roof_info['core']}")
    if a.json:
        json.dump(dict(blas=blas, roof_core=roof_info["core"], roof_lib=roof_info["lib"], results=results), open(a.json, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
