#!/usr/bin/env python3
"""Reproduction by simulation of the Oases paper's Table (throughput normalised to Megatron-LM) on
the two 32-GPU RTX 3090 clusters of 4-GPU servers (clusters/rtx3090_nvlink_32.json,
clusters/rtx3090_pcie_32.json: the link figures and their sources are in the files).

For each of the seven GPT stacks (models/make_oases_stacks.py, vocabulary padded to 50304 as
Megatron pads GPT-2's, weights never materialised) it runs `oases-plan --gpus 32 --cluster FILE`
at a global batch of B x 1024 tokens and reads the plan file's predictions: the chosen plan and the
Megatron baseline (one tp degree for every op, tp x dp, plain or default checkpointing, no chunks,
the best such under the memory limit) on the same cluster. Predicted Oases/Megatron =
Megatron step time / chosen plan step time.

  /usr/bin/python3 bench/plan/reproduce.py --bin build/bin [--batch 32] [--markdown table.md]
"""
import argparse
import json
import os
import subprocess
import sys

STACKS = [(1024, 24), (2048, 24), (3072, 24), (4096, 16), (6144, 16), (8192, 8), (12288, 4)]
PAPER = {"nvlink": [1.06, 1.62, 1.45, 1.39, 1.59, 1.63, 1.58], "pcie": [1.53, 1.95, 1.78, 1.73, 1.67, 1.71, 1.81]}
CLUSTERS = {"nvlink": "clusters/rtx3090_nvlink_32.json", "pcie": "clusters/rtx3090_pcie_32.json"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--work", default="build/bench/repro")
    ap.add_argument("--batch", type=int, default=32, help="global batch in sequences of 1024 tokens (default 32: one per GPU under pure data parallelism)")
    ap.add_argument("--markdown", help="also write the table here")
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    os.chdir(root)
    rows = []
    for i, (h, layers) in enumerate(STACKS):
        model = os.path.join(a.work, f"gpt_h{h}_l{layers}_v50304", "model.onnx")
        if not os.path.exists(model):
            subprocess.run(["/usr/bin/python3", "models/make_oases_stacks.py", "--out", a.work, "--only", str(h), "--vocab", "50304"],
                           check=True, stdout=subprocess.DEVNULL)
        row = {"hidden": h, "layers": layers}
        for name, cluster in CLUSTERS.items():
            out = os.path.join(a.work, f"plan_h{h}_{name}.json")
            p = subprocess.run([os.path.join(a.bin, "oases-plan"), model, "--gpus", "32", "--cluster", cluster, "--batch", str(a.batch),
                                "--seq", "1024", "--out", out], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"reproduce: oases-plan failed on {model} / {cluster}: {p.stderr.strip()}")
            pred = json.load(open(out))["prediction"]
            plan, meg = pred["plan"], pred.get("megatron")
            parts = json.load(open(out))["parts"]
            degrees = sorted({q["tp"] for q in parts})
            sched = json.load(open(out))["schedule"]
            row[name] = {"ratio": meg["step_ms"] / plan["step_ms"] if meg else None, "plan_ms": plan["step_ms"],
                         "megatron_ms": meg["step_ms"] if meg else None, "paper": PAPER[name][i],
                         "plan": f"{sched['name']} K={sched['chunks']} tp{'/'.join(map(str, degrees))}",
                         "megatron": "tp{} {}".format(meg["choice"]["parts"][1]["tp"], meg["choice"]["schedule"]["name"]) if meg else "-"}
        rows.append(row)
        fmt_r = lambda x: "Megatron does not fit" if x is None else f"{x:.2f}"
        print(f"hidden {h:5d} x {layers:2d}: NVLink {fmt_r(row['nvlink']['ratio'])} (paper {row['nvlink']['paper']:.2f}), "
              f"no NVLink {fmt_r(row['pcie']['ratio'])} (paper {row['pcie']['paper']:.2f})", flush=True)
    lines = [f"Global batch {a.batch} x 1024 tokens, 32 GPUs; predicted step times from `oases-plan` (roofline of the RTX 3090 row of the device table).",
             "",
             "| hidden, layers | NVLink: predicted Oases/Megatron | paper | plan (Megatron) | no NVLink: predicted | paper | plan (Megatron) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    def cell(c):
        if c["ratio"] is None:
            return f"Megatron does not fit (Oases {c['plan_ms'] / 1e3:.2f} s)"
        return f"**{c['ratio']:.2f}** ({c['megatron_ms'] / 1e3:.2f} s / {c['plan_ms'] / 1e3:.2f} s)"
    for r in rows:
        n, p = r["nvlink"], r["pcie"]
        lines.append(f"| {r['hidden']}, {r['layers']} | {cell(n)} | {n['paper']:.2f} | {n['plan']} ({n['megatron']}) | "
                     f"{cell(p)} | {p['paper']:.2f} | {p['plan']} ({p['megatron']}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
