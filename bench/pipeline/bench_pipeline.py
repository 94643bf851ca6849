"""Pipeline stages on MPI ranks emulating hosts (bench/pipeline/run.sh).

Four MPI ranks as two emulated hosts (oases-train --hosts 2): each stage of pp 2 x tp 2 on its own
host, its tensor-parallel group at the machine's speed, the stages joined by the emulated link.
For each link and pipeline schedule (gpipe, 1f1b, eager-1f1b):
  * measured: the median step (ms) with the link, and without any emulation (the same schedule);
  * exposed transfer time: the difference; the transfer time it is set against: every
    micro-batch's activation and gradient crossing the link one after the other,
    2 M x (latency + bytes / bandwidth); hidden = 1 - exposed / that;
  * predicted: oases-plan's pipeline simulator for the same pipeline (--reference-pipeline), its op
    times from oases-profile on this machine.
Then the planner's own pipeline plan (oases-plan --pp 2) against its best one-mesh plan
(--no-pipeline) on the slow link, each predicted and then run with --plan.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(MPI_ENV)
    if env:
        e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=e)
    if p.returncode != 0:
        sys.exit(f"bench_pipeline: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def train(a, work, extra, tag):
    log = os.path.join(work, f"{tag}.jsonl")
    if os.path.exists(log):
        os.remove(log)
    cmd = ["mpirun", "--bind-to", "none", "-np", str(a.ranks), os.path.join(a.bin, "oases-train"), a.model, "--synthetic", "--steps",
           str(a.steps), "--batch", str(a.batch), "--seq", str(a.seq), "-q", "--log-json", log] + extra
    run(cmd)
    ms = [json.loads(l)["ms"] for l in open(log)][a.warmup:]
    # the median, and the noise of one median: the steps' spread over the root of their count
    return statistics.median(ms), (statistics.stdev(ms) / len(ms) ** 0.5 if len(ms) > 1 else 0.0)


def plan(a, work, prof, link, extra):
    cmd = [os.path.join(a.bin, "oases-plan"), a.model, "--gpus", str(a.ranks), "--batch", str(a.batch), "--seq", str(a.seq), "--profile",
           prof, "--hosts", str(a.hosts), "--emulate-link", link] + extra
    return run(cmd)


def step_of(text, label):
    m = re.search(rf"^  {label}\s+step\s+([0-9.]+) ms", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(REPO, "models", "train", "gpt2_4l", "model.onnx"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64, help="the model's hidden size (the activation's bytes)")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--links", default="bw=1.25,latency=50;bw=0.02,latency=50",
                    help="';'-separated --emulate-link values (default: 10 Gbit/s, and 160 Mbit/s where a transfer is about half a "
                         "micro-batch's stage compute on this CPU)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="oases_bench_pipeline_")
    pp, tp = 2, a.ranks // 2
    prof = os.path.join(work, "profile.json")
    run([os.path.join(a.bin, "oases-profile"), "--backend", "cpu", "--out", prof, "--model", a.model, "--ranks", str(a.ranks), "--batch",
         str(a.batch), "--seq", str(a.seq), "--chunks", f"1,{a.micro}", "--degrees", f"1,{tp}"])
    print(f"model {a.model}, batch {a.batch} x {a.seq}, {a.ranks} MPI ranks on {a.hosts} emulated hosts, pp {pp} x tp {tp}, "
          f"{a.micro} micro-batches, {a.steps} steps (median after {a.warmup}), {os.cpu_count()} cores")
    bytes_per = a.batch // a.micro * a.seq * a.hidden * 4
    rows = []
    base = {}
    for sched in ["gpipe", "1f1b", "eager-1f1b"]:
        base[sched] = train(a, work, ["--pp", str(pp), "--tp", str(tp), "--micro-batches", str(a.micro), "--pipeline", sched], f"base_{sched}")
    for link in a.links.split(";"):
        bw = float(re.search(r"bw=([0-9.]+)", link).group(1))
        lat = float(re.search(r"latency=([0-9.]+)", link).group(1))
        per = lat * 1e-6 + bytes_per / (bw * 1e9)
        serial = 2 * a.micro * per * 1e3
        for sched in ["gpipe", "1f1b", "eager-1f1b"]:
            (got, noise) = train(a, work, ["--pp", str(pp), "--tp", str(tp), "--micro-batches", str(a.micro), "--pipeline", sched, "--hosts",
                                  str(a.hosts), "--emulate-link", link], f"{sched}_{bw}")
            pred = step_of(plan(a, work, prof, link, ["--no-pipeline", "--reference-pipeline", f"{pp},{tp},{a.micro},{sched},plain"]),
                           "reference")
            b, bnoise = base[sched]
            exposed = got - b
            # the difference of two medians is only known to about their noises together
            resolvable = serial > 3 * (noise ** 2 + bnoise ** 2) ** 0.5
            rows.append(dict(link=link, schedule=sched, measured_ms=got, no_emulation_ms=b, transfers_ms=serial,
                             noise_ms=(noise ** 2 + bnoise ** 2) ** 0.5,
                             hidden=(1 - exposed / serial) if resolvable else None, predicted_ms=pred, prediction_error=pred / got - 1))
    print(f"\n{'link':22} {'schedule':11} {'measured':>9} {'no link':>9} {'transfers':>10} {'noise':>6} {'hidden':>7} {'predicted':>10} "
          f"{'pred/meas':>9}")
    for r in rows:
        hidden = f"{100 * r['hidden']:5.0f}%" if r["hidden"] is not None else "  n/a "
        print(f"{r['link']:22} {r['schedule']:11} {r['measured_ms']:8.1f}  {r['no_emulation_ms']:8.1f}  {r['transfers_ms']:9.1f}  "
              f"{r['noise_ms']:5.1f}  {hidden}  {r['predicted_ms']:9.1f}  {r['predicted_ms'] / r['measured_ms']:8.2f}x")
    print("(ms per step; transfers: every activation and gradient over the link one after the other; hidden: 1 - (measured - no link)"
          " / transfers, n/a where the transfers are within 3 noises of the two medians)")
    # the planner's pipeline plan against its best one-mesh plan, on the slowest link
    link = a.links.split(";")[-1]
    plans = []
    for label, extra in [("pipeline plan", ["--pp", "2"]), ("one-mesh plan", ["--no-pipeline"])]:
        path = os.path.join(work, label.replace(" ", "_") + ".json")
        text = plan(a, work, prof, link, extra + ["--out", path])
        pred = step_of(text, "pipeline" if "--pp" in extra else "plan")
        what = [l.strip() for l in text.splitlines() if l.startswith("                  ")]
        got, _ = train(a, work, ["--plan", path, "--hosts", str(a.hosts), "--emulate-link", link], label.replace(" ", "_"))
        plans.append(dict(plan=label, link=link, measured_ms=got, predicted_ms=pred, layout=what[-1] if what else ""))
    print(f"\nthe planner's plans on {link}:")
    for r in plans:
        print(f"  {r['plan']:14} measured {r['measured_ms']:8.1f} ms   predicted {r['predicted_ms']:8.1f} ms "
              f"({r['predicted_ms'] / r['measured_ms']:.2f}x)   {r['layout']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "plans": plans}, f, indent=2)


if __name__ == "__main__":
    main()
