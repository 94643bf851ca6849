#!/usr/bin/env python3
"""Tables of bench/gpu/run.sh. For one stack (--out DIR), from what run.sh left in DIR:

  oases.jsonl, oases.rc, oases.log  oases-train's --log-json (one object per step: "ms", "run_ms",
                                    "update_ms", and "device_peak_mib" where the build writes it),
                                    its exit code and its output
  torch.json                        bench/gpu/pytorch_ref.py's modes (eager, compile, ...)
  profile.txt, profile.jsonl        a short oases-train --profile run of the same stack (optional)

prints one table: oases, torch eager (SDPA + fused AdamW), torch compile: ms/step, tokens/s, MFU,
peak device memory, and oases's throughput over each PyTorch mode's; then the --profile breakdown:
kernels (the sum of the per-instruction CUDA event times), the rest of the graph run (parameter and
input uploads, gradient copies back, launch gaps, the host's wait), the host update (optimizer,
gradient norm: --log-json's update_ms), and the op types that take longest. Writes the same as
JSON to DIR/summary.json. `report.py --combine OUT.json DIR...` joins the stacks' summaries into one
file (bench.json).

MFU = tokens/s x model FLOPs per token / peak FLOP/s, model FLOPs per token = 6 N + 12 L T C with
N = 12 L C^2 + V C (see run.sh). Medians skip the warm-up steps (oases: --warmup, default 2)."""
import argparse
import json
import math
import os
import re
import statistics
import sys

# Dense peak TFLOP/s: (bf16/fp16 tensor cores, fp32 without TF32). Longer names first: "H100 PCIe"
# must win over "H100".
PEAKS = [("H100 PCIe", (756.0, 51.0)), ("H100", (989.0, 67.0)), ("H200", (989.0, 67.0)), ("GH200", (989.0, 67.0)),
         ("A100", (312.0, 19.5)), ("L40S", (362.0, 91.6)), ("A10", (125.0, 31.2))]
LABELS = {"eager": "torch-eager", "compile": "torch-compile", "manual": "torch-manual"}


def model_flops_per_token(C, L, T, V):
    N = 12 * L * C * C + V * C
    return 6 * N + 12 * L * T * C


def last_line(path):
    try:
        lines = [ln.strip() for ln in open(path, errors="replace") if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def read_jsonl(path):
    try:
        return [json.loads(ln) for ln in open(path) if ln.strip()]
    except (OSError, ValueError):
        return []


def oases_row(d, warmup):
    rc_path = os.path.join(d, "oases.rc")
    rc = open(rc_path).read().strip() if os.path.exists(rc_path) else ""
    steps = read_jsonl(os.path.join(d, "oases.jsonl"))
    if os.path.exists(os.path.join(d, "oases.reason")):
        return {"status": "failed", "reason": open(os.path.join(d, "oases.reason")).read().strip()}
    if not os.path.exists(rc_path):
        return {"status": "not run", "reason": "the bench stopped before oases-train ran"}
    if rc != "0":
        return {"status": "failed", "reason": f"oases-train exited {rc}: {last_line(os.path.join(d, 'oases.log'))}"}
    if len(steps) <= warmup:
        return {"status": "failed", "reason": f"oases.jsonl has {len(steps)} steps, need more than the {warmup} warm-up steps"}
    timed = steps[warmup:]
    r = {"status": "ok", "median_ms": statistics.median(s["ms"] for s in timed), "steps_timed": len(timed), "warmup": warmup,
         "min_ms": min(s["ms"] for s in timed), "max_ms": max(s["ms"] for s in timed),
         "median_run_ms": statistics.median(s.get("run_ms", 0) for s in timed),
         "median_update_ms": statistics.median(s.get("update_ms", 0) for s in timed),
         "final_loss": steps[-1].get("loss"), "device": all(s.get("device") for s in timed)}
    peaks = [s["device_peak_mib"] for s in steps if isinstance(s.get("device_peak_mib"), (int, float))]
    r["device_peak_mib"] = max(peaks) if peaks else None
    fallback = os.path.join(d, "oases.fallback")
    if os.path.exists(fallback):  # run.sh's second run, without the newest device fusions
        r["fallback"] = open(fallback).read().strip()
    return r


PROF_ROW = re.compile(r"^  (.+?)\s+(\d+) nodes\s+(-?[\d.]+) ms\s+(-?[\d.]+)%$")
SLOW_NODE = re.compile(r"^\s+([\d.]+) ms\s+\[([^\]]+)\] node '([^']*)' -> '([^']*)'")  # a --profile "slowest nodes" line


def profile_summary(d):
    """oases-train --profile's table (ms per step by op type, '(the rest of the step)') with the same
    run's --log-json: kernels, the rest of the graph run, the host update."""
    path = os.path.join(d, "profile.txt")
    if not os.path.exists(path):
        return None
    rc_path = os.path.join(d, "profile.rc")
    rc = open(rc_path).read().strip() if os.path.exists(rc_path) else "0"
    if rc != "0":
        return {"status": "failed", "reason": f"oases-train --profile exited {rc}: {last_line(path)}"}
    ops, rest, steps_n, arena, slowest = [], None, 0, None, []
    for ln in open(path, errors="replace"):
        ln = ln.rstrip("\n")
        m = SLOW_NODE.match(ln)
        if m:
            slowest.append({"ms": float(m.group(1)), "op": m.group(2), "node": m.group(3), "output": m.group(4)})
            continue
        m = re.match(r"^profile \(ms per step, by op type, over (\d+) steps\)", ln)
        if m:
            steps_n = int(m.group(1))
            continue
        m = PROF_ROW.match(ln)
        if m:
            name, nodes, ms = m.group(1), int(m.group(2)), float(m.group(3))
            if name.startswith("(the rest"):
                rest = ms
            else:
                ops.append({"op": name, "nodes": nodes, "ms": ms})
            continue
        m = re.match(r"^activation arena ([\d.]+) MiB", ln)
        if m:
            arena = float(m.group(1))
    if not ops:
        return {"status": "failed", "reason": f"no profile table in {path}: {last_line(path)}"}
    kernels = sum(o["ms"] for o in ops)
    steps = read_jsonl(os.path.join(d, "profile.jsonl"))[1:]  # --profile leaves the first step out too
    s = {"status": "ok", "steps": steps_n, "kernels_ms": kernels, "activation_arena_mib": arena,
         "top_ops": sorted(ops, key=lambda o: -o["ms"])[:8], "ops": sorted(ops, key=lambda o: -o["ms"]),
         "slowest_nodes": sorted(slowest, key=lambda o: -o["ms"])[:20]}
    if steps and all(x.get("device") for x in steps):
        # training state on the device: run_ms and update_ms are device times (CUDA events)
        step = statistics.mean(x["ms"] for x in steps)
        run = statistics.mean(x.get("run_ms", 0) for x in steps)
        upd = statistics.mean(x.get("update_ms", 0) for x in steps)
        s.update(device=True, step_ms=step, programs_ms=run, launch_gaps_ms=run - kernels, device_update_ms=upd,
                 host_ms=step - run - upd)
    elif steps:
        step = statistics.mean(x["ms"] for x in steps)
        run = statistics.mean(x.get("run_ms", 0) for x in steps)
        s.update(step_ms=step, run_outside_kernels_ms=run - kernels, update_ms=step - run)
    elif rest is not None:
        s.update(step_ms=kernels + rest, rest_ms=rest)
    return s


def summarise(a):
    d = a.out
    if a.peak_tflops:
        peak_tf = float(a.peak_tflops)
    else:
        hit = [v for k, v in PEAKS if k in a.device_name]
        if not hit:
            print(f"error: unknown device '{a.device_name}': give --peak-tflops", file=sys.stderr)
            sys.exit(2)
        peak_tf = hit[0][1 if a.dtype == "fp32" else 0]
    fpt = model_flops_per_token(a.hidden, a.layers, a.seq, a.vocab)
    tokens = a.batch * a.seq
    try:
        tj = json.load(open(os.path.join(d, "torch.json")))
    except (OSError, ValueError) as e:
        tj = {"modes": {}, "error": f"no PyTorch results: {e}"}
    rows = {"oases": oases_row(d, a.warmup)}
    for mode, r in tj.get("modes", {}).items():
        rows[LABELS.get(mode, "torch-" + mode)] = r
    for r in rows.values():
        if r.get("status") == "ok":
            r["tokens_per_s"] = tokens / (r["median_ms"] / 1000)
            r["mfu"] = r["tokens_per_s"] * fpt / (peak_tf * 1e12)
    ratios = {}
    o = rows["oases"]
    for name, r in rows.items():
        if name != "oases" and o.get("status") == "ok" and r.get("status") == "ok":
            ratios[name] = r["median_ms"] / o["median_ms"]
    return {"stack": {"hidden": a.hidden, "layers": a.layers, "heads": a.hidden // 64, "batch": a.batch, "seq": a.seq,
                      "vocab": a.vocab, "dtype": a.dtype},
            "device": a.device_name, "peak_tflops": peak_tf, "flops_per_token": fpt, "tokens_per_step": tokens,
            "torch": {k: tj.get(k) for k in ("torch", "cuda", "cudnn", "nccl", "device", "error") if tj.get(k) is not None},
            "rows": rows, "oases_throughput_over": ratios, "profile": profile_summary(d), "seconds": seconds(a)}


def seconds(a):
    """Wall seconds of each part of the stack's bench (what run.sh left in *.s files)."""
    def num(path):
        try:
            return float(open(path).read().strip())
        except (OSError, ValueError):
            return None
    s = {"export": num(os.path.join(a.model_dir, "export.s")) if a.model_dir else None,
         "oases_train": num(os.path.join(a.out, "oases.s")), "oases_profile": num(os.path.join(a.out, "profile.s"))}
    try:
        for mode, r in json.load(open(os.path.join(a.out, "torch.json")))["modes"].items():
            s[f"torch_{mode}"] = r.get("wall_s")
    except (OSError, ValueError, KeyError):
        pass
    return s


def fmt_mib(x):
    return f"{x:.0f}" if isinstance(x, (int, float)) else "n/a"


def print_table(s):
    st = s["stack"]
    print(f"GPT stack hidden {st['hidden']}, {st['layers']} layers, {st['heads']} heads, vocabulary {st['vocab']}, "
          f"batch {st['batch']} x {st['seq']} tokens, {st['dtype']}, {s['device']} (peak {s['peak_tflops']:g} TFLOP/s), "
          f"{s['flops_per_token'] / 1e9:.2f} GFLOP/token")
    print(f"{'':14} {'ms/step':>10} {'tokens/s':>12} {'MFU':>7} {'peak MiB':>10} {'reserved MiB':>13} {'oases/this':>11}")
    for name, r in s["rows"].items():
        if r.get("status") != "ok":
            print(f"{name:14} {r.get('status', 'failed')}: {r.get('reason', '')}")
            continue
        peak = r.get("device_peak_mib") if name == "oases" else r.get("max_allocated_mib")
        ratio = s["oases_throughput_over"].get(name)
        print(f"{name:14} {r['median_ms']:10.1f} {r['tokens_per_s']:12.0f} {100 * r['mfu']:6.1f}% {fmt_mib(peak):>10} "
              f"{fmt_mib(r.get('max_reserved_mib')):>13} {f'{ratio:.2f}x' if ratio else '':>11}")
    for name, ratio in s["oases_throughput_over"].items():
        print(f"oases / {name} throughput: {ratio:.2f}x")
    t = s["torch"]
    notes = []
    for name, r in s["rows"].items():
        if name == "oases" or r.get("status") != "ok":
            continue
        bits = [f"attention {r.get('swapped', {}).get('attention', '?')}"]
        if r.get("sdpa_kernel"):
            bits[0] += f" [{r['sdpa_kernel']}]"
        bits.append(r.get("optimizer", "?"))
        if r.get("compile"):
            bits.append(f"{r['compile']}, compile step {r.get('compile_s', 0):.1f} s")
        notes.append(f"{name}: " + ", ".join(bits))
    losses = [f"{n} {r['final_loss']:.3f}" for n, r in s["rows"].items()
              if r.get("status") == "ok" and isinstance(r.get("final_loss"), (int, float))]
    if losses:
        print("last step's loss (random tokens, ln V = %.2f at the start): %s" % (math.log(st["vocab"]), ", ".join(losses)))
    ver = f"torch {t.get('torch', '?')}" + (f" (CUDA {t['cuda']}, cuDNN {t.get('cudnn')})" if t.get("cuda") else "")
    print(ver + ("; " + "; ".join(notes) if notes else ""))
    o = s["rows"]["oases"]
    if o.get("status") == "ok" and o.get("device"):
        print(f"oases: programs {o['median_run_ms']:.1f} ms + update {o['median_update_ms']:.1f} ms on the device, the rest of the "
              f"{o['median_ms']:.1f} ms step on the host (median); device peak {fmt_mib(o.get('device_peak_mib'))} MiB")
    elif o.get("status") == "ok":
        print(f"oases: graph run {o['median_run_ms']:.1f} ms + host update {o['median_update_ms']:.1f} ms a step (median); "
              f"device peak {fmt_mib(o.get('device_peak_mib'))} MiB")
    if o.get("fallback"):
        print(f"oases: NOTE {o['fallback']}")
    p = s["profile"]
    if p is None:
        return
    if p.get("status") != "ok":
        print(f"oases --profile: {p.get('status')}: {p.get('reason', '')}")
        return
    step = p["step_ms"]
    pct = lambda x: f"{100 * x / step:.0f}%" if step > 0 else "-"
    if p.get("device"):
        print(f"oases --profile ({p['steps']} steps, per-instruction events; profiling adds to the step): "
              f"{step:.1f} ms a step = programs on the device {p['programs_ms']:.1f} ms ({pct(p['programs_ms'])}: kernels "
              f"{p['kernels_ms']:.1f} ms, gaps between launches {p['launch_gaps_ms']:.1f} ms) + update on the device "
              f"{p['device_update_ms']:.1f} ms ({pct(p['device_update_ms'])}) + host {p['host_ms']:.1f} ms ({pct(p['host_ms'])})")
    elif "run_outside_kernels_ms" in p:
        print(f"oases --profile ({p['steps']} steps, per-instruction times; profiling adds to the step): "
              f"{step:.1f} ms a step = kernels {p['kernels_ms']:.1f} ms ({pct(p['kernels_ms'])}) + graph run outside kernels "
              f"{p['run_outside_kernels_ms']:.1f} ms ({pct(p['run_outside_kernels_ms'])}: parameter/input uploads, copies back, "
              f"launch gaps) + host update {p['update_ms']:.1f} ms ({pct(p['update_ms'])}: optimizer, gradient norm)")
    else:
        print(f"oases --profile ({p['steps']} steps): {step:.1f} ms a step = kernels {p['kernels_ms']:.1f} ms + "
              f"the rest {p.get('rest_ms', 0):.1f} ms")
    print("  longest op types (ms a step, nodes): " + ", ".join(f"{o['op']} {o['ms']:.1f} ({o['nodes']})" for o in p.get("ops", p["top_ops"])[:12]))
    for o in p.get("slowest_nodes", [])[:5]:
        print(f"  slow node: {o['ms']:.2f} ms [{o['op']}] {o['node']} -> {o['output']}")


def print_seconds(s):
    sec = s.get("seconds") or {}
    f = lambda k: f"{sec[k]:.0f}" if isinstance(sec.get(k), (int, float)) else "-"
    torch_parts = ", ".join(f"{k[6:]} {f(k)}" for k in sec if k.startswith("torch_"))
    print(f"seconds: export {f('export') if sec.get('export') is not None else 'cached'}, oases-train {f('oases_train')}, "
          f"--profile {f('oases_profile')}, PyTorch {torch_parts or '-'}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--combine":
        if len(sys.argv) < 3:
            print("error: --combine OUT.json DIR...", file=sys.stderr)
            sys.exit(2)
        stacks = []
        for d in sys.argv[3:]:
            try:
                stacks.append(json.load(open(os.path.join(d, "summary.json"))))
            except (OSError, ValueError) as e:
                stacks.append({"dir": d, "error": str(e)})
        extra = json.loads(os.environ.get("OASES_BENCH_META", "{}") or "{}")
        with open(sys.argv[2], "w") as f:
            json.dump({**extra, "stacks": stacks}, f, indent=1)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    for k in ("hidden", "layers", "batch", "seq", "vocab"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--model-dir", default="", help="the exported model's folder (export.s: the export's seconds)")
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--device-name", required=True)
    ap.add_argument("--peak-tflops", default="")
    a = ap.parse_args()
    s = summarise(a)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    print_table(s)
    print_seconds(s)


if __name__ == "__main__":
    main()
