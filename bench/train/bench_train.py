"""Training step time of oases-train against PyTorch on CPU, side by side: Debian's PyTorch 1.13 and a
current PyTorch 2.x from PyPI (eager and torch.compile), with each one's peak memory and GFLOP/s as
a share of the OpenBLAS sgemm roof measured in the same run (bench/roof.py on the model's forward
and backward matrix products, each round after the peers). See bench/README.md. Run through
bench/train/run.sh."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VENV2 = os.environ.get("OASES_BENCH_VENV") or os.path.join(common.REPO, "build", "bench-venv")

# (key, column title, python, torch_train.py mode); "oases" first
TORCH_PEERS = [("torch", "PyTorch 1.13", common.EXPORT_PY, "eager"),
               ("torch2", "PyTorch 2.x eager", None, "eager"),
               ("torch2_compile", "PyTorch 2.x compile", None, "compile")]


def last_json(text):
    """The last line of a peer's output that is a JSON object (warnings may come before it)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    raise ValueError("no JSON line in the output")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    common.add_common_args(ap, "PyTorch", rounds=2)
    ap.add_argument("--steps", type=int, default=0, help="timed steps per round and peer (default: 10, 4 for gpt2-small)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per round and peer")
    ap.add_argument("--torch-blas-threads", type=int, default=0,
                    help="OPENBLAS_NUM_THREADS of the PyTorch peers (default: --threads); 1 avoids OpenBLAS's threads "
                         "competing with PyTorch 1.13's OpenMP threads (PyTorch 2.x from PyPI uses MKL, not OpenBLAS)")
    ap.add_argument("--torch2-python", default=os.path.join(VENV2, "bin", "python"),
                    help="python of the PyTorch 2.x peer (bench/train/setup_torch2.sh makes build/bench-venv)")
    ap.add_argument("--no-torch2", action="store_true", help="without the PyTorch 2.x peers")
    ap.add_argument("--no-compile", action="store_true", help="without the PyTorch 2.x torch.compile peer")
    a = ap.parse_args()

    peers = [p for p in TORCH_PEERS if not (a.no_torch2 and p[0].startswith("torch2"))
             and not (a.no_compile and p[0] == "torch2_compile")]
    peers = [(k, t, py or a.torch2_python, mode) for k, t, py, mode in peers]
    if not a.no_torch2 and not os.access(a.torch2_python, os.X_OK):
        common.die(f"PyTorch 2.x peer: no {a.torch2_python} (bash bench/train/setup_torch2.sh, or --no-torch2)")
    cache = common.cache_dir(a.cache)
    env = common.peer_env(a.threads, a.keep_blas_env, a.blas_core)
    tenv = dict(env)
    if a.torch_blas_threads:
        tenv["OPENBLAS_NUM_THREADS"] = str(a.torch_blas_threads)
    lib = common.openblas_of(os.path.join(a.bin, "oases-train"))
    oases_core, oases_blas = common.oases_blas(os.path.join(a.bin, "oases-train"), env)
    renv = common.roof_env(env, oases_core)
    torch_core = common.detected_core(lib, tenv)  # PyTorch 1.13's (libblas.so.3: the same OpenBLAS build)
    results, roof_info, info = [], {}, {}
    load_start = common.load()
    for name in a.shapes.split(","):
        steps = a.steps or (4 if name == "gpt2-small" else 10)
        model = common.export(name, a.batch, a.seq, cache)
        work = os.path.join(os.path.dirname(model), "train")
        os.makedirs(work, exist_ok=True)
        gs = common.gemms(name, a.batch, a.seq, train=True)
        flops = common.gemm_flops(gs)
        print(f"{common.describe(name, a.batch, a.seq)}: {a.rounds} rounds x {steps} steps each ...", file=sys.stderr,
              flush=True)
        times = {k: [] for k in ["oases"] + [p[0] for p in peers]}
        rss = {k: 0.0 for k in times}
        failed, first_ms, roofs = {}, {}, []
        for r in range(a.rounds):
            log = os.path.join(work, "oases_steps.jsonl")
            if os.path.exists(log):
                os.remove(log)
            cmd = [os.path.join(a.bin, "oases-train"), model, "--synthetic", "--steps", str(a.warmup + steps), "--batch",
                   str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads), "--optimizer", "adamw", "--lr", "1e-4",
                   "--clip", "1.0", "--val-fraction", "0", "--log-json", log, "-q"]
            if a.profile and r == a.rounds - 1:
                cmd += ["--profile"]
            text, peak = common.run_rss(cmd, env, os.path.join(work, "oases.log"))
            rss["oases"] = max(rss["oases"], peak)
            ms = [json.loads(line)["ms"] for line in open(log)]
            times["oases"] += ms[a.warmup:]
            if a.profile and r == a.rounds - 1 and "profile" in text:
                print(text[text.index("profile"):], file=sys.stderr)
            for key, title, py, mode in peers:
                if key in failed:
                    continue
                cmd = [py, os.path.join(HERE, "torch_train.py"), json.dumps(dict(common.SHAPES[name])), str(a.batch),
                       str(a.seq), str(a.threads), str(a.warmup), str(steps), mode]
                try:
                    text, peak = common.run_rss(cmd, tenv, os.path.join(work, f"{key}.log"))
                    j = last_json(text)
                except (RuntimeError, ValueError) as e:
                    if key == "torch":  # Debian's PyTorch is the reference peer: its failure stops the bench
                        raise
                    failed[key] = (str(e).strip().splitlines() or ["?"])[0][:300]
                    continue
                info[key] = {k: j.get(k) for k in ("version", "blas", "threads")}
                if "error" in j:
                    failed[key] = j["error"]
                    continue
                rss[key] = max(rss[key], peak)
                times[key] += j["times_ms"]
                first_ms.setdefault(key, j.get("first_step_ms"))
            roof_info = common.measure_roof(lib, gs, renv, os.path.join(work, "roof.log"))
            roofs.append(roof_info["gflops"])
        roof = max(roofs)
        res = dict(model=name, config=common.SHAPES[name], batch=a.batch, seq=a.seq, threads=a.threads, gflop=flops / 1e9,
                   roof_gflops=roof, roof_rounds=roofs, roof_shapes=roof_info["shapes"], failed=failed, first_step_ms=first_ms)
        for key in times:
            if key in failed or not times[key]:
                continue
            m = common.median(times[key])
            res[f"{key}_ms"] = m
            res[f"{key}_steps"] = times[key]
            res[f"{key}_rss_mib"] = rss[key]
            res[f"{key}_gflops"] = flops / m / 1e6
            res[f"{key}_roof_pct"] = 100 * flops / m / 1e6 / roof
            if key != "oases":
                res["ratio" if key == "torch" else f"{key}_ratio"] = res["oases_ms"] / m
        res["torch_version"] = info.get("torch", {}).get("version", "?")
        results.append(res)

    blas_note = f", PyTorch's OpenBLAS {a.torch_blas_threads} thread(s)" if a.torch_blas_threads else ""
    versions = "; ".join(f"{title} = {info[k]['version']} (BLAS {info[k]['blas']})" for k, title, _, _ in peers
                         if k in info and k != "torch2_compile")
    print(f"\ntraining step (forward + backward + AdamW), {a.threads} threads{blas_note}, median over {a.rounds} rounds "
          f"per peer ({common.stamp()}); {versions}; Oases: {oases_blas}; PyTorch 1.13: OpenBLAS core {torch_core}; "
          f"load average {load_start} -> {common.load()}")
    print(f"roof: cblas_sgemm of {roof_info['lib']} ({roof_info['core']}; {roof_info['threads']} OpenBLAS threads or as many single-threaded calls on blocks, the "
          f"faster per product) on the model's "
          f"forward and backward products, the best of {a.rounds} rounds; GFLOP/s = GFLOP of the products / median ms "
          "(bench/README.md)")
    keys = ["oases"] + [p[0] for p in peers]
    titles = dict([("oases", "Oases")] + [(p[0], p[1]) for p in peers])
    short = {"oases": "Oases", "torch": "1.13", "torch2": "2.x eager", "torch2_compile": "2.x compile"}
    rows = []
    for r in results:
        ms = lambda k: f"{r[k + '_ms']:.1f}" if k + "_ms" in r else "n/a"  # noqa: E731
        row = [r["model"], f"{r['batch']}x{r['seq']}"] + [ms(k) for k in keys]
        row += [f"{r['oases_ms'] / r[k + '_ms']:.2f}" if k + "_ms" in r else "n/a" for k in keys[1:]]
        row += [f"{r['gflop']:.1f}", f"{r['roof_gflops']:.1f}",
                " / ".join(f"{r[k + '_roof_pct']:.0f}%" if k + "_ms" in r else "n/a" for k in keys),
                " / ".join(f"{r[k + '_rss_mib']:.0f}" if k + "_ms" in r else "n/a" for k in keys)]
        rows.append(row)
    header = (["model", "batch x seq"] + [f"{titles[k]} ms/step" for k in keys]
              + [f"Oases/{titles[k]}" for k in keys[1:]]
              + ["GFLOP/step", "roof GFLOP/s", "of roof " + " / ".join(short[k] for k in keys),
                 "peak RSS MiB " + " / ".join(short[k] for k in keys)])
    common.print_table(header, rows)
    for r in results:
        for k, why in r["failed"].items():
            print(f"{r['model']}: {titles[k]} n/a: {why}")
        if "torch2_compile" in r["first_step_ms"] and r["first_step_ms"]["torch2_compile"] is not None:
            print(f"{r['model']}: PyTorch 2.x compile: first step (compiling) "
                  f"{r['first_step_ms']['torch2_compile'] / 1e3:.1f} s in the first round")
    if oases_core == torch_core:
        warnings = [common.blas_warning(oases_core, "Oases, PyTorch 1.13 and the roof")]
    else:
        warnings = [common.blas_warning(oases_core, "Oases and the roof"), common.blas_warning(torch_core, "PyTorch 1.13")]
    for w in filter(None, warnings):
        print(w)
    if oases_core != roof_info["core"]:
        print(f"WARNING: Oases ran OpenBLAS core {oases_core}, the roof {roof_info['core']}")
    if a.json:
        json.dump(dict(blas=oases_blas, torch_blas_core=torch_core, roof_core=roof_info["core"], roof_lib=roof_info["lib"], peers=info,
                       results=results), open(a.json, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
