#!/usr/bin/env python3
"""Table of bench/gpu/run.sh: tokens/s and MFU of oases-train (OUT/oases.jsonl, one JSON object per
step with "ms") and of PyTorch (OUT/torch.json, "median_ms"), and their ratio.

MFU = tokens/s x model FLOPs per token / peak FLOP/s, model FLOPs per token = 6 N + 12 L T C with
N = 12 L C^2 + V C (see run.sh). Both sides' medians skip two warm-up steps."""
import argparse
import json
import statistics
import sys

# Dense peak TFLOP/s: (bf16/fp16 tensor cores, fp32 without TF32). Longer names first: "H100 PCIe"
# must win over "H100".
PEAKS = [("H100 PCIe", (756.0, 51.0)), ("H100", (989.0, 67.0)), ("H200", (989.0, 67.0)), ("GH200", (989.0, 67.0)),
         ("A100", (312.0, 19.5)), ("L40S", (362.0, 91.6)), ("A10", (125.0, 31.2))]


def model_flops_per_token(C, L, T, V):
    N = 12 * L * C * C + V * C
    return 6 * N + 12 * L * T * C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    for k in ("hidden", "layers", "batch", "seq", "vocab"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--device-name", required=True)
    ap.add_argument("--peak-tflops", default="")
    a = ap.parse_args()
    if a.peak_tflops:
        peak_tf = float(a.peak_tflops)
    else:
        hit = [v for k, v in PEAKS if k in a.device_name]
        if not hit:
            print(f"error: unknown device '{a.device_name}': give --peak-tflops", file=sys.stderr)
            sys.exit(2)
        peak_tf = hit[0][1 if a.dtype == "fp32" else 0]
    steps = [json.loads(line) for line in open(f"{a.out}/oases.jsonl") if line.strip()]
    if len(steps) < 3:
        print(f"error: {a.out}/oases.jsonl has {len(steps)} steps, need at least 3", file=sys.stderr)
        sys.exit(2)
    oases_ms = statistics.median(s["ms"] for s in steps[2:])
    torch_ms = json.load(open(f"{a.out}/torch.json"))["median_ms"]
    fpt = model_flops_per_token(a.hidden, a.layers, a.seq, a.vocab)
    B, T = a.batch, a.seq
    print(f"GPT stack hidden {a.hidden}, {a.layers} layers, {a.hidden // 64} heads, vocabulary {a.vocab}, "
          f"batch {B} x {T} tokens, {a.dtype}, {a.device_name} (peak {peak_tf:g} TFLOP/s), "
          f"{fpt / 1e9:.2f} GFLOP/token")
    print(f"{'':10} {'ms/step':>10} {'tokens/s':>12} {'MFU':>7}")
    for who, ms in (("oases", oases_ms), ("pytorch", torch_ms)):
        tps = B * T / (ms / 1000)
        print(f"{who:10} {ms:10.1f} {tps:12.0f} {100 * tps * fpt / (peak_tf * 1e12):6.1f}%")
    print(f"oases / pytorch throughput: {torch_ms / oases_ms:.2f}x")


if __name__ == "__main__":
    main()
