#!/usr/bin/env bash
# Every schedule and chunk count gives the gradients of the plain schedule: 5 schedules x
# K in {1, 2, 4} x tp in {2, 4}. With one chunk nothing changes the order of any sum, so the
# gradients must be bit-identical; with more chunks the parameter gradients are summed chunk by
# chunk, so they agree within 1e-6 relative. Also checks the activations each schedule keeps per
# block, and that overlap_checkpoint/oases hide communication behind compute on an emulated link.
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
M=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=(--data "$OASES_SOURCE_DIR/data/kjv_genesis.txt" --batch 8 --seq 32 --seed 3)

compare() {  # REF DIR LABEL EXACT
  /usr/bin/python3 - "$@" <<'PY'
import glob, os, sys
import numpy as np, onnx
from onnx import numpy_helper
ref, got, label, exact = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
def load(d):
    return {onnx.load_tensor(f).name: numpy_helper.to_array(onnx.load_tensor(f)) for f in glob.glob(os.path.join(d, "*.pb"))}
A, B = load(ref), load(got)
assert A.keys() == B.keys() and A, (label, sorted(set(A) ^ set(B)))
G = max(float(np.abs(v).max()) for v in A.values())
worst = 0.0
for k in A:
    if exact:
        assert np.array_equal(A[k], B[k]), f"{label}: {k} is not bit-identical (max diff {np.abs(A[k]-B[k]).max():.3e})"
    scale = max(float(np.abs(A[k]).max()), 1e-3 * G)
    worst = max(worst, float(np.abs(A[k] - B[k]).max()) / scale)
assert worst <= 1e-6, f"{label}: gradients differ by {worst:.2e} relative"
print(f"ok {label}: {len(A)} gradients, {'bit-identical' if exact else f'worst {worst:.1e} relative'}")
PY
}

for tp in 2 4; do
  "$T" "$M" "${DATA[@]}" --steps 0 --local-ranks $tp --tp $tp -q --dump-grads "$WORK/ref$tp" || fail "reference tp $tp"
  for sched in plain default_checkpoint optim_comm_checkpoint overlap_checkpoint oases; do
    for k in 1 2 4; do
      out="$WORK/g.$tp.$sched.$k"
      "$T" "$M" "${DATA[@]}" --steps 0 --local-ranks $tp --tp $tp --schedule $sched --chunks $k -q --dump-grads "$out" \
        || { fail "$sched K=$k tp=$tp did not run"; continue; }
      compare "$WORK/ref$tp" "$out" "$sched K=$k tp=$tp" $([[ $k == 1 ]] && echo 1 || echo 0) || fail "$sched K=$k tp=$tp differs"
    done
  done
done
# under MPI as well
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$T" "$M" "${DATA[@]}" --steps 0 --tp 2 --schedule oases --chunks 2 -q \
  --dump-grads "$WORK/mpi_oases" || fail "oases over MPI"
compare "$WORK/ref2" "$WORK/mpi_oases" "oases K=2 tp=2 mpi" 0 || fail "oases over MPI differs"

# activations kept per block ([B, T, C] tensors): all of them (plain), the block's output
# (default_checkpoint), the block's output and the residual between its sub-layers (optim_comm)
for sched in plain default_checkpoint optim_comm_checkpoint; do
  "$T" "$M" "${DATA[@]}" --steps 1 --local-ranks 2 --tp 2 --schedule $sched --chunks 1 --memory-report -q 2> "$WORK/mem.$sched" \
    || fail "$sched memory report"
done
/usr/bin/python3 - "$WORK" <<'PY' || fail "activations kept per block"
import re, sys
def counts(s):
    txt = open(f"{sys.argv[1]}/mem.{s}").read()
    return {int(l): (int(n), float(kb)) for l, n, kb in re.findall(r"layer (\d+): (\d+) tensors, ([\d.]+) KiB", txt)}
block = 8 * 32 * 64 * 4 / 1024  # KiB of one [B, T, C] float tensor
d, o, p = counts("default_checkpoint"), counts("optim_comm_checkpoint"), counts("plain")
assert d == {0: (1, block), 1: (1, block)}, d
assert o == {0: (2, 2 * block), 1: (2, 2 * block)}, o
assert all(p[l][1] > 4 * block for l in (0, 1)), p
print("ok activations per block: plain", p, "default", d, "optim_comm", o)
PY

# overlap: on a slow emulated link the interleaved schedules hide communication
for sched in default_checkpoint oases; do
  "$T" "$M" "${DATA[@]}" --steps 4 --local-ranks 2 --tp 2 --schedule $sched --chunks 2 --emulate-link bw=0.2,latency=50 \
    --overlap-report --trace "$WORK/trace.$sched.json" -q 2> "$WORK/overlap.$sched" || fail "$sched overlap run"
done
/usr/bin/python3 - "$WORK" <<'PY' || fail "overlap report / trace"
import json, re, sys
w = sys.argv[1]
def hidden(s):
    m = re.search(r"communication ([\d.]+) ms: hidden ([\d.]+) ms", open(f"{w}/overlap.{s}").read())
    return float(m.group(1)), float(m.group(2))
comm, hid = hidden("oases")
assert comm > 0 and hid / comm >= 0.3, (comm, hid)
t = json.load(open(f"{w}/trace.oases.json"))
ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in ev} == {0, 1}
assert {e["cat"] for e in ev} >= {"compute", "comm"}
assert any("(chunk 1)" in e["name"] for e in ev)
# some collective interval on the comm thread overlaps a compute interval of the same rank
comm_iv = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["pid"] == 0 and e["tid"] == 1]
comp_iv = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["pid"] == 0 and e["tid"] == 0 and e["cat"] == "compute"]
overlap = sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in comm_iv for b0, b1 in comp_iv)
assert overlap > 0, "no collective ran beside compute in the trace"
print(f"ok overlap: oases hides {hid:.1f} of {comm:.1f} ms of communication; trace shows {overlap / 1000:.1f} ms of comm under compute")
PY
finish
