#!/usr/bin/env python3
"""The planner's memory per rank beside the built program's (issue 33 item 4).

For every schedule x chunks K x tp degree x sequence parallelism on a small stack, oases-plan is
made to choose exactly that layout (--schedules/--chunks/--degrees --uniform, no pipeline) and
--simulate builds the rank program oases-train would run: the cost model's memory per rank
("plan ... memory X" among the estimates) is printed beside the program's (parameters, gradients
and AdamW's moments kept by the trainer plus the executor's activation arena, the "plan ...
memory Y" line of the simulation). Prints the table and the worst ratio.

--pipelines: the same for pipeline stages with their micro-batches in flight. For every stage count
x tp x pipeline schedule (gpipe, 1f1b, eager-1f1b, zb-h1, interleaved 1f1b with 2 virtual stages)
x micro-batches x inner schedule (and ZeRO-1 where there is dp), oases-plan prices that pipeline
(--reference-pipeline) and --simulate builds and replays its stage programs: each stage's predicted
memory beside its program's (parameters and moments kept by the trainer plus the stage program's
arena: the micro-batches in flight, the gradients, the transfer buffers).

usage: bench/plan/memory_table.py [--bin build/bin] [--model M] [--gpus 4] [--batch 16] [--seq 64] [--pipelines]
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def mib(text):
    v, u = text.split()
    return float(v) * UNITS[u] / (1 << 20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(REPO, "models", "train", "gpt2_4l", "model.onnx"))
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--pipelines", action="store_true", help="pipeline stages instead of one mesh")
    a = ap.parse_args()
    if a.pipelines:
        return pipelines(a)
    rows = []
    for sched in ["plain", "default_checkpoint", "optim_comm_checkpoint", "overlap_checkpoint", "oases"]:
        for k in [1, 2, 4, 8]:
            for tp in [1, 2, 4]:
                for sp in [False, True]:
                    if sp and tp == 1:
                        continue
                    cmd = [os.path.join(a.bin, "oases-plan"), a.model, "--gpus", str(a.gpus), "--batch", str(a.batch), "--seq",
                           str(a.seq), "--schedules", sched, "--chunks", str(k), "--degrees", str(tp), "--uniform", "--no-pipeline",
                           "--no-collective-matmul", "--simulate", "--simulate-candidates", "1"]
                    if not sp:
                        cmd.append("--no-sequence-parallel")
                    out = subprocess.run(cmd, capture_output=True, text=True)
                    plan = re.findall(r"^  plan\s+step .*memory ([0-9.]+ [KMG]?i?B)", out.stdout, re.M)
                    if out.returncode != 0 or len(plan) < 2:
                        rows.append((sched, k, tp, sp, None, None, (out.stderr or out.stdout).strip().splitlines()[-1:]))
                        continue
                    rows.append((sched, k, tp, sp, mib(plan[0]), mib(plan[1]), ""))
    print(f"{'schedule':22} {'K':>2} {'tp':>2} {'sp':>3} {'model MiB':>10} {'program MiB':>12} {'model/program':>14}")
    worst = None
    for sched, k, tp, sp, m, p, why in rows:
        if m is None:
            print(f"{sched:22} {k:2} {tp:2} {'sp' if sp else '':>3} {'-':>10} {'-':>12}   not planned: {why}")
            continue
        r = m / p
        if worst is None or abs(r - 1) > abs(worst[0] - 1):
            worst = (r, sched, k, tp, sp)
        print(f"{sched:22} {k:2} {tp:2} {'sp' if sp else '':>3} {m:10.2f} {p:12.2f} {r:13.2f}x{'' if abs(r - 1) <= 0.15 else '  (off by more than 15%)'}")
    if worst:
        off = sum(1 for row in rows if row[4] is not None and abs(row[4] / row[5] - 1) > 0.15)
        print(f"worst: {worst[1]} K={worst[2]} tp {worst[3]}{' sp' if worst[4] else ''}: model/program {worst[0]:.2f}x; "
              f"{off} of {sum(1 for row in rows if row[4] is not None)} rows off by more than 15%")


def pipelines(a):
    rows = []
    layouts = []
    for pp in [2, 4]:
        if a.gpus % pp:
            continue
        for tp in sorted({a.gpus // pp, 1}):
            layouts.append((pp, tp, False))
            if a.gpus // pp // tp > 1:
                layouts.append((pp, tp, True))
    for pp, tp, zero in layouts:
        for sched in ["gpipe", "1f1b", "eager-1f1b", "zb-h1", "1f1b,v2"]:
            for m in [pp, 2 * pp]:
                for inner in ["plain", "default_checkpoint", "oases"]:
                    name, _, virt = sched.partition(",")
                    ref = f"{pp},{tp},{m},{name},{inner}" + (f",{virt}" if virt else "") + (",zero" if zero else "")
                    cmd = [os.path.join(a.bin, "oases-plan"), a.model, "--gpus", str(a.gpus), "--batch", str(a.batch), "--seq", str(a.seq),
                           "--no-pipeline", "--no-collective-matmul", "--simulate", "--simulate-candidates", "1", "--reference-pipeline", ref]
                    out = subprocess.run(cmd, capture_output=True, text=True)
                    stages = re.findall(r"^\s+stage (\d+) \(rank \d+\): forward .* memory ([0-9.]+ [KMG]?i?B) \(predicted ([0-9.]+ [KMG]?i?B)\)$",
                                        out.stdout[out.stdout.find("reference"):], re.M)
                    what = f"pp {pp} tp {tp}{' zero' if zero else ''} {sched.replace(',v2', ' V=2')} M={m} {inner}"
                    if out.returncode != 0 or not stages:
                        rows.append((what, None, (out.stderr or out.stdout).strip().splitlines()[-1:]))
                        continue
                    rows.append((what, [(int(k), mib(pr), mib(pg)) for k, pg, pr in stages], ""))
    print(f"{'pipeline':52} {'stage':>5} {'model MiB':>10} {'program MiB':>12} {'model/program':>14}")
    worst, off, n = None, 0, 0
    for what, stages, why in rows:
        if stages is None:
            print(f"{what:52} {'-':>5}   not planned: {why}")
            continue
        for k, m, p in stages:
            r = m / p
            n += 1
            off += abs(r - 1) > 0.15
            if worst is None or abs(r - 1) > abs(worst[0] - 1):
                worst = (r, what, k)
            print(f"{what:52} {k:5} {m:10.2f} {p:12.2f} {r:13.2f}x{'' if abs(r - 1) <= 0.15 else '  (off by more than 15%)'}")
    if worst:
        print(f"worst: {worst[1]} stage {worst[2]}: model/program {worst[0]:.2f}x; {off} of {n} stages off by more than 15%")


if __name__ == "__main__":
    sys.exit(main())
