"""Training step time of oases-train against PyTorch on CPU, side by side, with each one's peak
memory. See bench/README.md. Run through bench/train/run.sh."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="gpt-mini,gpt2-small", help=f"comma-separated, of {list(common.SHAPES)}")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of Oases and PyTorch")
    ap.add_argument("--steps", type=int, default=0, help="timed steps per round and peer (default: 10, 4 for gpt2-small)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per round and peer")
    ap.add_argument("--cache", default="", help="folder for exported models (default build/bench-models)")
    ap.add_argument("--bin", default=os.path.join(common.REPO, "build", "bin"))
    ap.add_argument("--keep-blas-env", action="store_true", help="keep OPENBLAS_CORETYPE from the environment")
    ap.add_argument("--torch-blas-threads", type=int, default=0,
                    help="OPENBLAS_NUM_THREADS of the PyTorch peer (default: --threads); 1 avoids OpenBLAS's threads "
                         "competing with PyTorch's OpenMP threads")
    ap.add_argument("--profile", action="store_true", help="also print Oases' time per op type")
    ap.add_argument("--json", default="", help="write the results here")
    a = ap.parse_args()

    cache = common.cache_dir(a.cache)
    env = common.peer_env(a.threads, a.keep_blas_env)
    results = []
    load_start = common.load()
    for name in a.shapes.split(","):
        steps = a.steps or (4 if name == "gpt2-small" else 10)
        model = common.export(name, a.batch, a.seq, cache)
        work = os.path.join(os.path.dirname(model), "train")
        os.makedirs(work, exist_ok=True)
        print(f"{common.describe(name, a.batch, a.seq)}: {a.rounds} rounds x {steps} steps each ...", file=sys.stderr,
              flush=True)
        oases_t, torch_t, rss = [], [], {"oases": 0.0, "torch": 0.0}
        torch_version = "?"
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
            oases_t += ms[a.warmup:]
            if a.profile and r == a.rounds - 1 and "profile" in text:
                print(text[text.index("profile"):], file=sys.stderr)
            cfg = dict(common.SHAPES[name])
            cmd = [common.EXPORT_PY, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_train.py"),
                   json.dumps(cfg), str(a.batch), str(a.seq), str(a.threads), str(a.warmup), str(steps)]
            tenv = dict(env)
            if a.torch_blas_threads:
                tenv["OPENBLAS_NUM_THREADS"] = str(a.torch_blas_threads)
            text, peak = common.run_rss(cmd, tenv, os.path.join(work, "torch.log"))
            rss["torch"] = max(rss["torch"], peak)
            j = json.loads(text.strip().splitlines()[-1])
            torch_t += j["times_ms"]
            torch_version = j["version"]
        mo, mt = common.median(oases_t), common.median(torch_t)
        results.append(dict(model=name, config=common.SHAPES[name], batch=a.batch, seq=a.seq, threads=a.threads,
                            oases_ms=mo, torch_ms=mt, ratio=mo / mt, oases_steps=oases_t, torch_steps=torch_t,
                            oases_rss_mib=rss["oases"], torch_rss_mib=rss["torch"], torch_version=torch_version))
    blas_note = f", PyTorch's OpenBLAS {a.torch_blas_threads} thread(s)" if a.torch_blas_threads else ""
    print(f"\ntraining step (forward + backward + AdamW), {a.threads} threads{blas_note}, median over {a.rounds} rounds "
          f"per peer ({common.stamp()}); PyTorch {results[0]['torch_version']}; load average {load_start} -> {common.load()}")
    rows = []
    for r in results:
        rows.append([r["model"], f"{r['batch']}x{r['seq']}", f"{r['oases_ms']:.1f}", f"{r['torch_ms']:.1f}", f"{r['ratio']:.2f}",
                     f"{r['oases_rss_mib']:.0f}", f"{r['torch_rss_mib']:.0f}"])
    common.print_table(["model", "batch x seq", "Oases ms/step", "PyTorch ms/step", "ratio Oases/PyTorch",
                        "peak RSS MiB Oases", "peak RSS MiB PyTorch"], rows)
    if a.json:
        json.dump(dict(results=results), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
