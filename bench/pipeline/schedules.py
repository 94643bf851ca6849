"""Pipeline schedules beyond 1F1B, measured (issue 34 item 6): pp 4 (--pp) with M = 8 micro-batches on
4 thread ranks, each its own emulated host (oases-train --hosts 4, stages joined by --emulate-link).

For 1f1b, 1f1b with 2 virtual stages a rank (interleaved, --virtual-stages 2) and zb-h1:
  * measured: over the steps after the first, the median step (ms) and the median bubble share, per
    step 1 - (the busiest rank's compute in the step) / step, from the run's --trace (each rank's step
    span and its compute thread's compute spans in it, the optimizer's update included);
  * predicted: oases-plan's pipeline simulator for the same pipeline (--reference-pipeline), op
    times from oases-profile on this machine, and its bubble;
  * memory: the largest stage arena (--memory-report) of each schedule;
  * the step ratios from --rounds untraced runs taking the schedules in turn (median over rounds of
    each round's ratio to 1f1b): one run after the other, the machine's drift decided them;
then the optimizer state a rank holds at pp 2 x dp 2 with and without --zero 1.

Ranks share this machine's cores: a stage's idle time is another's compute time here, so the
measured bubble is what the ranks' own threads left idle, not what idle GPUs would show.

  /usr/bin/python3 bench/pipeline/schedules.py [--bin build/bin] [--steps 8] [--rounds 3] [--link bw=1.25,latency=50] [--json out.json]
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

from bench_pipeline import REPO, run  # (beside this file) a command's output, or the run stops naming it


def step_bubbles(trace_path):
    """Per traced step: (step ms, bubble) with step = the longest rank's step span and bubble = 1 - the
    busiest rank's compute in its step / step. Compute: every compute span of a rank's compute thread
    inside its step span, the optimizer's update included."""
    d = json.load(open(trace_path))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    steps, compute = {}, {}  # pid -> [(start, end)], pid -> [(start, dur)]
    for e in ev:
        if e.get("ph") != "X" or e.get("tid") != 0:
            continue
        kind = e.get("args", {}).get("kind", "compute")
        if kind == "step":
            steps.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
        elif kind == "compute":
            compute.setdefault(e["pid"], []).append((e["ts"], e["dur"]))
    counts = {len(v) for v in steps.values()}
    if len(counts) != 1:
        sys.exit(f"schedules: {trace_path}: the ranks traced {sorted(counts)} steps (a step span each, from oases-train --trace)")
    for v in steps.values():
        v.sort()
    out = []
    for k in range(counts.pop()):
        span = {pid: v[k] for pid, v in steps.items()}
        busy = {pid: sum(dur for t, dur in compute.get(pid, []) if span[pid][0] <= t < span[pid][1]) for pid in span}
        step = max(b - a for a, b in span.values())
        out.append((step / 1000.0, 1 - max(busy.values()) / step))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--stack", default="256x8", help="models/make_oases_stacks.py --stack (hidden x layers)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4, help="stages, one thread rank and one emulated host each")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--link", default="bw=1.25,latency=50")
    ap.add_argument("--rounds", type=int, default=3,
                    help="untraced runs of each schedule, in turn (1f1b, V=2, zb-h1, 1f1b, ...): the step ratios from them")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("schedules: --steps must be at least 2 (the first is left out)")
    work = tempfile.mkdtemp(prefix="oases_bench_schedules_")
    run([sys.executable, os.path.join(REPO, "models", "make_oases_stacks.py"), "--out", work, "--stack", a.stack, "--vocab", "256",
         "--seq", str(a.seq)])
    h, l = a.stack.split("x")
    model = os.path.join(work, f"gpt_h{h}_l{l}_v256_s{a.seq}", "model.onnx")
    if not os.path.exists(model):
        sys.exit(f"schedules: no model at {model}")
    prof = os.path.join(work, "profile.json")
    run([os.path.join(a.bin, "oases-profile"), "--backend", "cpu", "--out", prof, "--model", model, "--ranks", str(a.pp), "--batch", str(a.batch),
         "--seq", str(a.seq), "--chunks", f"1,{a.micro}", "--degrees", "1"])
    common = ["--synthetic", "--batch", str(a.batch), "--seq", str(a.seq), "-q"]
    print(f"model {a.stack} (vocabulary 256), batch {a.batch} x {a.seq}, pp {a.pp} on {a.pp} thread ranks, each its own emulated host joined by "
          f"{a.link}, {a.micro} micro-batches, {a.steps} steps, {os.cpu_count()} cores")
    rows = []
    for sched, v in [("1f1b", 1), ("1f1b", 2), ("zb-h1", 1)]:
        name = sched if v == 1 else f"{sched} V={v}"
        tag = name.replace(" ", "_").replace("=", "")
        trace = os.path.join(work, f"{tag}.trace.json")
        out = run([os.path.join(a.bin, "oases-train"), model] + common +
                  ["--steps", str(a.steps), "--local-ranks", str(a.pp), "--pp", str(a.pp), "--micro-batches", str(a.micro), "--pipeline", sched,
                   "--virtual-stages", str(v), "--hosts", str(a.pp), "--emulate-link", a.link, "--trace", trace,
                   "--trace-steps", str(a.steps - 1), "--memory-report"])
        per_step = step_bubbles(trace)  # the steps after the first
        step = statistics.median(ms for ms, _ in per_step)
        bubble = statistics.median(b for _, b in per_step)
        arenas = [float(x) for x in re.findall(r"^stage \d \([\w-]+\): .* arena ([\d.]+) KiB", out, re.M)]
        ptext = run([os.path.join(a.bin, "oases-plan"), model, "--gpus", str(a.pp), "--batch", str(a.batch), "--seq", str(a.seq), "--profile", prof,
                     "--hosts", str(a.pp), "--emulate-link", a.link, "--no-pipeline", "--reference-pipeline",
                     f"{a.pp},1,{a.micro},{sched},plain" + (f",v{v}" if v > 1 else "")])
        m = re.search(r"^  reference\s+step\s+([0-9.]+) ms\s+\(bubble (\d+)%\)", ptext, re.M)
        rows.append(dict(schedule=name, measured_ms=step, bubble=bubble, predicted_ms=float(m.group(1)) if m else float("nan"),
                         predicted_bubble=int(m.group(2)) / 100 if m else float("nan"), largest_arena_kib=max(arenas) if arenas else 0))
    # The step, untraced, in rounds that take the schedules in turn: this machine's speed drifts
    # over a minute by more than the schedules differ, so each round's ratios compare runs made
    # side by side, and the medians over rounds are reported (a traced run is also slower).
    untraced = {r["schedule"]: [] for r in rows}
    for _ in range(max(0, a.rounds)):
        for sched, v in [("1f1b", 1), ("1f1b", 2), ("zb-h1", 1)]:
            name = sched if v == 1 else f"{sched} V={v}"
            out = run([os.path.join(a.bin, "oases-train"), model, "--synthetic", "--batch", str(a.batch), "--seq", str(a.seq), "--steps",
                       str(a.steps), "--local-ranks", str(a.pp), "--pp", str(a.pp), "--micro-batches", str(a.micro), "--pipeline", sched,
                       "--virtual-stages", str(v), "--hosts", str(a.pp), "--emulate-link", a.link])
            steps = [float(x) for x in re.findall(r"([0-9.]+) ms/step", out)][1:]  # the first step left out
            if not steps:
                sys.exit(f"schedules: no 'ms/step' in the progress lines of {name}")
            untraced[name].append(statistics.median(steps))
    for r in rows:
        r["untraced_ms"] = untraced[r["schedule"]]
    print(f"\n{'schedule':10} {'measured':>9} {'bubble':>7} {'predicted':>10} {'bubble':>7} {'largest arena':>14}  untraced (rounds)")
    for r in rows:
        rounds = ", ".join(f"{x:.0f}" for x in r["untraced_ms"])
        print(f"{r['schedule']:10} {r['measured_ms']:8.1f}  {100 * r['bubble']:5.1f}%  {r['predicted_ms']:9.1f}  {100 * r['predicted_bubble']:5.0f}%"
              f"  {r['largest_arena_kib']:10.0f} KiB  {rounds}")
    one, v2, zb = rows

    def step_ratio(x):
        """Median over rounds of x's untraced step / 1f1b's in the same round (else the traced steps' ratio)."""
        if x["untraced_ms"]:
            per = [p / q for p, q in zip(x["untraced_ms"], one["untraced_ms"])]
            return statistics.median(per), f" (rounds {', '.join(f'{p:.2f}' for p in per)})"
        return x["measured_ms"] / one["measured_ms"], " (traced)"

    for x, label in ((v2, "1f1b V=2"), (zb, "zb-h1")):
        ratio, detail = step_ratio(x)
        x["step_ratio"] = ratio
        print(f"{label} / 1f1b: step {ratio:.2f}x{detail}, bubble {x['bubble'] / one['bubble']:.2f}x measured "
              f"({x['predicted_ms'] / one['predicted_ms']:.2f}x, {x['predicted_bubble'] / one['predicted_bubble']:.2f}x predicted), "
              f"largest arena {x['largest_arena_kib'] / one['largest_arena_kib']:.2f}x")
    # the distributed optimizer's saving at pp 2 x dp 2
    zero = {}
    for z in (0, 1):
        out = run([os.path.join(a.bin, "oases-train"), model] + common +
                  ["--steps", "1", "--local-ranks", "4", "--pp", "2", "--dp", "2", "--micro-batches", "2", "--zero", str(z), "--memory-report"])
        zero[z] = [float(x) for x in re.findall(r"optimizer state ([\d.]+) MiB", out)]
    print(f"\noptimizer state per rank at pp 2 x dp 2 (stage 0, stage 1): without --zero {zero[0]} MiB, with --zero 1 {zero[1]} MiB "
          f"({', '.join(f'{x / y:.2f}x' for x, y in zip(zero[0], zero[1]))} less)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": dict(stack=a.stack, batch=a.batch, seq=a.seq, pp=a.pp, micro=a.micro, steps=a.steps, link=a.link,
                                      rounds=a.rounds, cores=os.cpu_count()), "rows": rows, "zero": zero}, f, indent=2)


if __name__ == "__main__":
    main()
