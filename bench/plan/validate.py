#!/usr/bin/env python3
"""Validation of the simulator on this machine: predicted against measured step times of
`oases-train` (CPU, --local-ranks, --emulate-link), for the five schedules at tp 2 and 4.

For each tp degree and schedule: `oases-profile --model M --ranks tp --emulate-link L` measures op,
collective and executor times just before (the machine's other load changes within seconds); then `oases-plan M --gpus tp --profile P --emulate-link L --degrees tp
--uniform --schedules S --chunks K --simulate --out plan.json` predicts the step (the simulator
replays the rank's program on the profile), and `oases-train M --synthetic --plan plan.json
--local-ranks tp --emulate-link L --steps N` measures it (median of the steps after the first).
Error = (predicted - measured) / measured.

  /usr/bin/python3 bench/plan/validate.py --bin build/bin [--steps 12] [--link bw=1,latency=50] [--markdown t.md]
Model: GPT-2-style, hidden 256, 4 layers, 8 heads, byte vocabulary, batch 8 x 128 (models/export.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

SCHEDULES = ["plain", "default_checkpoint", "optim_comm_checkpoint", "overlap_checkpoint", "oases"]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"validate: {' '.join(cmd)} failed: {p.stderr.strip()[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--work", default="build/bench/validate")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--link", default="bw=1,latency=50")
    ap.add_argument("--tp", type=int, action="append", default=[])
    ap.add_argument("--markdown")
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, "h256", "model.onnx")
    if not os.path.exists(model):
        subprocess.run(["/usr/bin/python3", "models/export.py", "--family", "gpt2", "--dynamic", "--hidden", "256", "--layers", "4",
                        "--heads", "8", "--vocab", "256", "--max-pos", "128", "--no-data", "--out", os.path.dirname(model)],
                       check=True, stdout=subprocess.DEVNULL)
    rows = []
    loads = []
    for tp in a.tp or [2, 4]:
        for s in SCHEDULES:
            k = 1 if s == "plain" else a.chunks
            # The cores are shared with whatever else runs on the machine, and that changes within
            # seconds: each prediction uses a profile taken just before its measurement.
            prof = os.path.join(a.work, f"profile_tp{tp}_{s}.json")
            loads.append(os.getloadavg()[0])
            run([os.path.join(a.bin, "oases-profile"), "--backend", "cpu", "--model", model, "--ranks", str(tp), "--batch", "8", "--seq",
                 "128", "--emulate-link", a.link, "--degrees", str(tp), "--chunks", str(k), "--reps", "2", "--sizes",
                 "65536,262144,1048576,4194304", "--out", prof])
            plan = os.path.join(a.work, f"plan_tp{tp}_{s}.json")
            run([os.path.join(a.bin, "oases-plan"), model, "--gpus", str(tp), "--profile", prof, "--emulate-link", a.link, "--batch", "8",
                 "--seq", "128", "--degrees", str(tp), "--uniform", "--no-sequence-parallel", "--schedules", s, "--chunks", str(k),
                 "--simulate", "--out", plan])
            sim = json.load(open(plan))["simulation"]["plan"]
            log = os.path.join(a.work, f"log_tp{tp}_{s}.jsonl")
            if os.path.exists(log):
                os.remove(log)
            run([os.path.join(a.bin, "oases-train"), model, "--synthetic", "--plan", plan, "--local-ranks", str(tp), "--emulate-link", a.link,
                 "--steps", str(a.steps), "-q", "--log-json", log])
            ms = [json.loads(l)["ms"] for l in open(log)][1:]
            measured = statistics.median(ms)
            err = (sim["step_ms"] - measured) / measured * 100
            rows.append((tp, s, k, sim["step_ms"], measured, err, min(ms), max(ms)))
            print(f"tp {tp} {s:22s} K={k}: predicted {sim['step_ms']:8.1f} ms, measured {measured:8.1f} ms "
                  f"(steps {min(ms):.0f}..{max(ms):.0f}), error {err:+.1f}%", flush=True)
    lines = [f"Link emulated `{a.link}`; batch 8 x 128; {a.steps} steps, median of all but the first; {os.cpu_count()} cores; "
             f"1-minute load average {min(loads):.1f}..{max(loads):.1f} during the runs.", "",
             "| tp | schedule | K | predicted ms | measured ms (range) | error |", "| --- | --- | --- | --- | --- | --- |"]
    for tp, s, k, p, m, e, lo, hi in rows:
        lines.append(f"| {tp} | {s} | {k} | {p:.1f} | {m:.1f} ({lo:.0f}..{hi:.0f}) | {e:+.1f}% |")
    within = sum(1 for r in rows if abs(r[5]) <= 10)
    lines.append("")
    lines.append(f"{within} of {len(rows)} within ±10%; mean |error| {statistics.mean(abs(r[5]) for r in rows):.1f}%.")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        open(a.markdown, "w").write(text)


if __name__ == "__main__":
    main()
