#!/usr/bin/env python3
"""Step time of the five schedules on scaled-down versions of the Oases paper's seven GPT stacks,
tp = 2 and 4, with collectives slowed by an emulated link calibrated to a PCIe RTX 3090 server.

Run through bench/overlap/run.sh (which builds and sets up first). For each stack and tp degree:

1. calibrate: train a few steps with the `plain` schedule and no link emulation; that step time
   Tc is this CPU's compute time for the scaled stack;
2. the emulated link dilates time by s = Tc / T3, where T3 is what as many full-size layers take
   for a training step (3 x forward FLOPs per rank) on an RTX 3090 at the paper's measured rate; each
   collective then takes s times what the full-size message takes on the 3090 server's link:
       bw_emulated = bw_3090 * (bytes_scaled / bytes_full) / s,   latency_emulated = s * latency_3090
   so the scaled stack on this CPU sees the full stack's ratio of communication to computation;
3. run every schedule with that link and read the step time and the overlap report: --repeat rounds
   (default 2), each running every configuration once, so a slow spell of the machine falls on all
   of them; a configuration's figure is the median of all its timed steps. The emulated link ends
   a collective its modelled time after the last rank arrived, on every rank (ranks that share cores
   cannot hide one rank's link time behind another's computation);
4. the same link with sequence parallelism (all-gather + reduce-scatter instead of all-reduce):
   `oases` (sp), `oases` with collective matmuls (cm: each gather and scatter decomposed into tp ring
   steps beside the partial products), and collective matmuls alone with one chunk (cm K1: the
   overlap inside the op, for batches too small to chunk); "best" is the fastest of oases, sp, cm
   and cm K1, the choice the planner makes per part (--no-sp skips the sequence-parallel runs).

RTX 3090 server figures (state them, they decide the result):
  F3 = 22.5 TFLOP/s  fp32 effective: the paper's profiled point (hidden 3072, micro-batch 4, tp 4)
                     runs attention + MLP forward, 244.8 GFLOP, in 5.6 + 5.3 ms;
  bw3 = 6.2 GB/s     ring link bandwidth: the same point's all-reduce of [1024, 4, 3072] fp32
                     (48 MiB) over 4 GPUs takes 12.2 ms, i.e. 2 (p-1)/p x 50.3 MB / 12.2 ms;
                     PCIe 4.0 x16 without NVLink through the host, well below its 32 GB/s peak;
  a3 = 10 us         per ring step (NCCL over PCIe; small all-reduces take tens of microseconds).
Full-size shapes: micro-batch 4, sequence 1024 (the paper's profiled micro-batch and sequence),
GPT-2's vocabulary of 50257. Layers are divided by --layer-scale, but no stack keeps fewer than
--min-layers (2): hidden 12288's 4 layers would otherwise become one block, with no block boundary
for the schedules to overlap across, and the step's fill and drain (the first chunk's embedding
all-reduce, the last block's backward all-reduce) would weigh 4 times what they do in the paper's
4-layer stack (with 2 layers: twice). The scaled stack's vocabulary is scaled like its hidden size
and its layer count (50257 x scaled layers / (--scale x full layers), rounded down to a multiple of
64: 768, and 1536 for hidden 12288's 2 of 4 layers), so its LM head keeps the full stack's share of
the forward FLOPs (7.8% at hidden 12288 over 4 layers, 13% at 1024 over 24) and the head's and the
loss's collectives have the compute beside them that they would have at full size.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

STACKS = [(1024, 24), (2048, 24), (3072, 24), (4096, 16), (6144, 16), (8192, 8), (12288, 4)]
SCHEDULES = ["plain", "default_checkpoint", "optim_comm_checkpoint", "overlap_checkpoint", "oases"]
# (column, schedule, chunks: None = --chunks, extra flags)
SP_VARIANTS = [("sp", "oases", None, ["--sequence-parallel"]),
               ("cm", "oases", None, ["--sequence-parallel", "--collective-matmul"]),
               ("cm K1", "optim_comm_checkpoint", 1, ["--sequence-parallel", "--collective-matmul"])]
F3, BW3, A3 = 22.5e12, 6.2e9, 10e-6
FULL_B, FULL_T, FULL_V = 4, 1024, 50257


def stack_fwd_flops(h, layers, b, t, vocab):
    """Forward FLOPs of a GPT stack: 24 b t h^2 per layer in the projections and MLP, 4 b t^2 h in
    attention scores and weighted sum, and 2 b t h vocab in the LM head."""
    return layers * (24 * b * t * h * h + 4 * b * t * t * h) + 2 * b * t * h * vocab


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_overlap: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p


def train(a, model, tp, schedule, chunks, link, steps, workdir, env, extra=()):
    log = os.path.join(workdir, "log.jsonl")
    if os.path.exists(log):
        os.remove(log)
    cmd = [os.path.join(a.bin, "oases-train"), model, "--synthetic", "--batch", str(a.batch), "--seq", str(a.seq),
           "--steps", str(steps), "--local-ranks", str(tp), "-q", "--log-json", log] + list(extra)
    if schedule:  # else a plan (in extra) gives the split, schedule and chunks
        cmd += ["--tp", str(tp), "--schedule", schedule, "--chunks", str(chunks)]
    if link:
        cmd += ["--emulate-link", link, "--overlap-report"]
    p = run(cmd, env)
    ms = [json.loads(l)["ms"] for l in open(log)][a.warmup:]
    out = {"ms": statistics.median(ms), "ms_all": ms, "runs": 1}
    m = re.search(r"communication ([\d.]+) ms: hidden ([\d.]+) ms", p.stderr)
    if m:
        out["comm_ms"], out["hidden_ms"] = float(m.group(1)), float(m.group(2))
    # per collective: the compute its order put between its start and its wait (what could hide)
    m = re.search(r"all: ([\d.]+) ms of collectives; could hide ([\d.]+) \(\d+%\), hid ([\d.]+)", p.stderr)
    if m:
        out["groups_comm_ms"], out["could_ms"], out["groups_hid_ms"] = float(m.group(1)), float(m.group(2)), float(m.group(3))
    # the room the channel's queue took: compute between a collective's issue and start that hid the one ahead
    m = re.search(r"the channel's queue took ([\d.]+) ms", p.stderr)
    if m:
        out["queued_ms"] = float(m.group(1))
    return out


def pooled(runs):
    """One figure from repeated runs of the same configuration: the median of every timed step of
    every run, the overlap report's figures averaged."""
    out = {"ms_all": [m for r in runs for m in r["ms_all"]], "runs": len(runs)}
    out["ms"] = statistics.median(out["ms_all"])
    out["ms_runs"] = [r["ms"] for r in runs]
    for k in ("comm_ms", "hidden_ms", "groups_comm_ms", "could_ms", "groups_hid_ms", "queued_ms"):
        if all(k in r for r in runs):
            out[k] = statistics.mean(r[k] for r in runs)
    return out


def make_plan(a, model, tp, link, workdir, env):
    """The planner's choice for this row: oases-profile measures the ops and the emulated link with tp
    thread ranks, oases-plan searches tp = the row's degree (per part layout, schedule, chunks,
    sequence parallelism, collective matmuls) and re-ranks its candidates by simulation. Returns
    the plan's file and its schedule and chunks in words (oases-train --plan runs it)."""
    prof, plan = os.path.join(workdir, f"prof_tp{tp}.json"), os.path.join(workdir, f"plan_tp{tp}.json")
    run([os.path.join(a.bin, "oases-profile"), "--backend", "cpu", "--model", model, "--ranks", str(tp), "--degrees", str(tp),
         "--batch", str(a.batch), "--seq", str(a.seq), "--chunks", "1,2,4", "--emulate-link", link, "--out", prof], env)
    run([os.path.join(a.bin, "oases-plan"), model, "--gpus", str(tp), "--degrees", str(tp), "--profile", prof, "--emulate-link", link,
         "--batch", str(a.batch), "--seq", str(a.seq), "--chunks", "1,2,4", "--simulate", "--out", plan], env)
    p = json.load(open(plan))
    sched, parts = p.get("schedule", {}), p.get("parts", [])
    names = {"default_checkpoint": "dflt", "optim_comm_checkpoint": "optim", "overlap_checkpoint": "overlap"}
    choice = (f"{names.get(sched.get('name'), sched.get('name', '?'))} K{sched.get('chunks', '?')}"
              + ("+cm" if any(x.get("collective_matmul") for x in parts) else "+sp" if any(x.get("sequence_parallel") for x in parts) else ""))
    return plan, choice


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--scale", type=int, default=16, help="hidden divided by this (default 16)")
    ap.add_argument("--layer-scale", type=int, default=4, help="layers divided by this (default 4)")
    ap.add_argument("--min-layers", type=int, default=2,
                    help="no scaled stack has fewer layers (default 2: hidden 12288's 4 layers / 4 would leave one block, "
                         "with no block boundary to overlap across and the step's fill and drain weighed 4x)")
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--vocab", type=int, help="every scaled stack's vocabulary (default: per stack, 50257 x its scaled layers / "
                    "(--scale x its full layers), a multiple of 64: 768 where the layers are divided by --layer-scale 4)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs of every configuration, one round after the other; its figure is the median of all their timed steps (default 2)")
    ap.add_argument("--tp", type=int, action="append", default=[])
    ap.add_argument("--only", type=int, action="append", default=[], metavar="HIDDEN", help="full-size hidden of a stack")
    ap.add_argument("--no-sp", action="store_true", help="skip the sequence-parallel and collective-matmul runs")
    ap.add_argument("--no-plan", action="store_true", help="skip the planner's column (oases-profile, oases-plan --simulate, its plan trained)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    tps = a.tp or [2, 4]
    env = dict(os.environ)
    stacks = [s for s in STACKS if not a.only or s[0] in a.only]
    results = []
    print(f"emulated RTX 3090 PCIe server: {F3 / 1e12:.1f} TFLOP/s, link {BW3 / 1e9:.1f} GB/s, {A3 * 1e6:.0f} us per ring step; "
          f"full stacks at micro-batch {FULL_B} x {FULL_T}; scaled: hidden / {a.scale}, layers / {a.layer_scale}, "
          f"head dim {a.head_dim}, batch {a.batch} x {a.seq}, K = {a.chunks}, median of {a.repeat} x {a.steps - a.warmup} steps "
          f"({a.repeat} interleaved rounds), {os.cpu_count()} cores",
          flush=True)
    variants = [] if a.no_sp else SP_VARIANTS
    hdr = (f"{'stack (full)':>14} {'scaled':>10} {'tp':>3} {'link GB/s':>10} {'lat ms':>7} "
           + " ".join(f"{s[:12]:>12}" for s in SCHEDULES) + "".join(f" {v[0]:>7}" for v in variants)
           + f" {'comm %':>7} {'oases/dflt':>10} {'oases/plain':>11} {'hidden':>7} {'bound':>6} {'could':>6} {'hid/could':>9} {'hid/order':>9}"
           + (f" {'best/dflt':>9} {'best':>7}" if variants else "")
           + (f" {'plan':>7} {'plan/dflt':>9} {'plan is':>14}" if not a.no_plan else ""))
    print(hdr)
    for h, layers in stacks:
        hs, ls = h // a.scale, min(layers, max(a.min_layers, layers // a.layer_scale))
        heads = hs // a.head_dim
        # the head's share of the stack's FLOPs kept: 2 b t h V over ls layers as over the full stack's
        vocab = a.vocab or max(64, FULL_V * ls // (a.scale * layers) // 64 * 64)
        name = f"gpt_h{hs}_l{ls}_v{vocab}"
        mdir = os.path.join(a.work, name)
        model = os.path.join(mdir, "model.onnx")
        if not os.path.exists(model):
            run(["/usr/bin/python3", "models/export.py", "--family", "gpt2", "--dynamic", "--hidden", str(hs), "--layers", str(ls),
                 "--heads", str(heads), "--vocab", str(vocab), "--max-pos", str(a.seq), "--no-data", "--out", mdir], env)
        for tp in tps:
            # the calibration sets the link of the whole row: twice the steps (they are fast without it)
            base = train(a, model, tp, "plain", 1, None, 2 * a.steps, mdir, env)
            tc = base["ms"] / 1e3
            # the full-size stack's share for as many layers as the scaled stack has: per-layer proportions are what count
            t3 = 3 * stack_fwd_flops(h, layers, FULL_B, FULL_T, FULL_V) * ls / layers / tp / F3
            s = tc / t3
            bytes_ratio = (a.batch * a.seq * hs) / (FULL_B * FULL_T * h)
            bw = BW3 * bytes_ratio / s
            lat = A3 * s
            link = f"bw={bw / 1e9:.6g},latency={lat * 1e6:.6g}"
            row = {"stack": f"h{h}_l{layers}", "scaled": name, "tp": tp, "compute_ms": base["ms"], "dilation": s,
                   "link_gbps": bw / 1e9, "latency_us": lat * 1e6, "schedules": {}}
            # every configuration once per round, the rounds one after the other: a slow spell of the
            # machine (minutes) then falls on every configuration alike, not on one
            configs = [(sched, sched, 1 if sched in ("plain", "default_checkpoint", "optim_comm_checkpoint") else a.chunks, [])
                       for sched in SCHEDULES] + [(col, sched, k or a.chunks, extra) for col, sched, k, extra in variants]
            if not a.no_plan:
                plan, choice = make_plan(a, model, tp, link, mdir, env)
                configs.append(("plan", None, None, ["--plan", plan]))  # no schedule: the plan's
            runs = {c[0]: [] for c in configs}
            for _ in range(a.repeat):
                for col, sched, k, extra in configs:
                    runs[col].append(train(a, model, tp, sched, k, link, a.steps, mdir, env, extra))
            S = row["schedules"]
            for col in runs:
                S[col] = pooled(runs[col])
            if not a.no_plan:
                row["plan_choice"] = choice
                row["plan_vs_default"] = S["default_checkpoint"]["ms"] / S["plan"]["ms"]
            if variants:
                best = min(["oases"] + [v[0] for v in variants], key=lambda c: S[c]["ms"])
                row["best"] = best
                row["best_vs_default"] = S["default_checkpoint"]["ms"] / S[best]["ms"]
            plain_comm = S["plain"].get("comm_ms", 0.0)
            row["comm_share_plain"] = plain_comm / S["plain"]["ms"] if S["plain"]["ms"] else 0.0
            row["speedup_vs_default"] = S["default_checkpoint"]["ms"] / S["oases"]["ms"]
            row["speedup_vs_plain"] = S["plain"]["ms"] / S["oases"]["ms"]
            oc = S["oases"].get("comm_ms", 0.0)
            row["oases_hidden"] = S["oases"].get("hidden_ms", 0.0) / oc if oc else 0.0
            # communication can only hide behind the compute thread's own time: at most
            # (step - exposed communication) / communication of it
            exposed = oc - S["oases"].get("hidden_ms", 0.0)
            row["oases_hidden_bound"] = min(1.0, max(0.0, S["oases"]["ms"] - exposed) / oc) if oc else 1.0
            gc, could = S["oases"].get("groups_comm_ms", 0.0), S["oases"].get("could_ms", 0.0)
            row["oases_could"] = could / gc if gc else 0.0
            row["oases_hid_of_could"] = S["oases"].get("groups_hid_ms", 0.0) / could if could else 0.0
            # the same counting the compute between issue and wait even where it hid the collective ahead
            order = could + S["oases"].get("queued_ms", 0.0)
            row["oases_hid_of_order"] = S["oases"].get("groups_hid_ms", 0.0) / order if order else 0.0
            results.append(row)
            print(f"{row['stack']:>14} {name:>10} {tp:>3} {bw / 1e9:>10.4f} {lat * 1e3:>7.2f} "
                  + " ".join(f"{S[s]['ms']:>12.1f}" for s in SCHEDULES) + "".join(f" {S[v[0]]['ms']:>7.1f}" for v in variants)
                  + f" {100 * row['comm_share_plain']:>6.0f}% {row['speedup_vs_default']:>10.2f} {row['speedup_vs_plain']:>11.2f}"
                  f" {100 * row['oases_hidden']:>6.0f}% {100 * row['oases_hidden_bound']:>5.0f}%"
                  f" {100 * row['oases_could']:>5.0f}% {100 * row['oases_hid_of_could']:>8.0f}% {100 * row['oases_hid_of_order']:>8.0f}%"
                  + (f" {row['best_vs_default']:>9.2f} {row['best']:>7}" if variants else "")
                  + (f" {S['plan']['ms']:>7.1f} {row['plan_vs_default']:>9.2f} {row['plan_choice']:>14}" if not a.no_plan else ""), flush=True)
    print("columns: ms/step (median) per schedule; comm % = communication share of the plain step; "
          "oases/dflt and oases/plain = speed-up of oases; hidden = share of oases' communication hidden behind compute; "
          "bound = the most that could hide: the compute thread's time in the oases step (step - exposed comm) over its comm; "
          "could = per collective (--overlap-report), the compute its order put between its issue and its wait while no other collective held "
          "its channel, over all collectives' time; hid/could = what hid of that; hid/order = the same counting also the compute that hid "
          "the collective ahead on the channel (the report before 2026-11-24); sp / cm / cm K1 = oases with sequence parallelism, oases with collective matmuls, "
          "collective matmuls with one chunk (optim_comm_checkpoint); best = the fastest of oases, sp, cm, cm K1; "
          "plan = the planner's choice at the row's tp (oases-profile + oases-plan --simulate, the plan trained), plan is = its schedule and chunks")
    g = [r for r in results if r["comm_share_plain"] >= 0.3]
    if g:
        print(f"where comm >= 30% of the plain step ({len(g)} of {len(results)}): oases over default_checkpoint "
              f"{min(r['speedup_vs_default'] for r in g):.2f}-{max(r['speedup_vs_default'] for r in g):.2f}x "
              f"(geomean {statistics.geometric_mean([r['speedup_vs_default'] for r in g]):.2f}x), hidden "
              f"{100 * min(r['oases_hidden'] for r in g):.0f}-{100 * max(r['oases_hidden'] for r in g):.0f}% "
              f"(>= 80% in {sum(r['oases_hidden'] >= 0.8 for r in g)}; where the bound allows 80% "
              f"({sum(r['oases_hidden_bound'] >= 0.8 for r in g)} rows): {sum(r['oases_hidden'] >= 0.8 for r in g if r['oases_hidden_bound'] >= 0.8)} reach it)")
        print(f"  hid/could in every row: {100 * min(r['oases_hid_of_could'] for r in results):.0f}-{100 * max(r['oases_hid_of_could'] for r in results):.0f}% "
              f"(>= 90% in {sum(r['oases_hid_of_could'] >= 0.9 for r in results)} of {len(results)})")
        if variants:
            print(f"  best of oases / sp / cm / cm K1 over default_checkpoint: {min(r['best_vs_default'] for r in g):.2f}-"
                  f"{max(r['best_vs_default'] for r in g):.2f}x (>= 1.3x in {sum(r['best_vs_default'] >= 1.3 for r in g)} of {len(g)}); "
                  f"chosen: {', '.join(sorted(set(r['best'] for r in g)))}")
        if not a.no_plan:
            ok = sum(max(r["speedup_vs_default"], r["plan_vs_default"]) >= 1.3 for r in g)
            print(f"  the planner's choice over default_checkpoint: {min(r['plan_vs_default'] for r in g):.2f}-"
                  f"{max(r['plan_vs_default'] for r in g):.2f}x; oases or the planner's choice >= 1.3x in {ok} of {len(g)}")
    if a.json:
        json.dump({"figures": {"tflops_3090": F3 / 1e12, "link_gbps_3090": BW3 / 1e9, "latency_us_3090": A3 * 1e6},
                   "results": results}, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
