#!/usr/bin/env bash
# oases-train --device cuda: without a usable GPU it must refuse with one line and exit 2 (built
# without CUDA, or no CUDA device found), and then this test reports SKIPPED (exit 77): nothing
# ran on a GPU. With a GPU, 30 steps of the byte-level GPT on the GPU (fp32, then bf16) must
# follow the CPU's losses, and --trace / --overlap-report must time the device's streams (kernels on
# the compute stream, within the steps' wall time). Thread ranks on the GPU (ranks sharing it where
# the machine has fewer GPUs: executor/device_local_comm.h; NCCL where it has one each) must follow
# the CPU run of the same plan within 1e-5 relative in fp32 (20 losses and the gathered gradients):
# tp 2, dp 2, tp 2 x dp 2 with sequence parallelism, collective matmuls, the oases schedule with K 2,
# and pipelines (their Reshard kernels on the GPU's channel stream): pp 2 with the tied embedding
# across stages (1F1B), pp 2 x tp 2 under eager 1F1B, stage meshes 2x1:oases,1x2.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=$OASES_SOURCE_DIR/data/kjv_genesis.txt
count=$("$OASES_BIN/oases-gpu-info" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"]["count"])')
if [[ "$count" == "0" ]]; then
  expect_error "cuda without a device" "built without CUDA|no CUDA device found" \
    "$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 2 --device cuda
  expect_error "bad --dtype" "dtype" "$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 2 --dtype fp8
  [[ $FAILURES -ne 0 ]] && finish
  echo "SKIPPED: no CUDA device here; the GPU training test did not run"
  exit 77
fi
for dtype in fp32 bf16; do
  "$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 30 --batch 8 --seq 64 --lr 3e-3 --seed 1 -q --dtype $dtype \
    --log-json "$WORK/cpu_$dtype.jsonl" || fail "cpu $dtype training failed"
  "$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 30 --batch 8 --seq 64 --lr 3e-3 --seed 1 -q --dtype $dtype \
    --device cuda --log-json "$WORK/gpu_$dtype.jsonl" || fail "gpu $dtype training failed"
done
/usr/bin/python3 - "$WORK" <<'PY' || fail "GPU losses do not follow the CPU's"
import json, sys
for dtype, tol in (("fp32", 1e-3), ("bf16", 3e-2)):
    cpu = [json.loads(l)["loss"] for l in open(f"{sys.argv[1]}/cpu_{dtype}.jsonl")]
    gpu = [json.loads(l)["loss"] for l in open(f"{sys.argv[1]}/gpu_{dtype}.jsonl")]
    assert len(cpu) == len(gpu) == 30
    worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
    print(dtype, "worst relative loss difference", worst)
    assert worst < tol, (dtype, worst)
PY
"$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 4 --batch 8 --seq 64 --seed 1 --device cuda --trace "$WORK/gpu_trace.json" \
  --trace-steps 2 --overlap-report >"$WORK/gpu_overlap.txt" 2>&1 || fail "gpu --trace --overlap-report: $(tail -1 "$WORK/gpu_overlap.txt")"
grep -q "^overlap report" "$WORK/gpu_overlap.txt" || fail "gpu --overlap-report printed no report"
/usr/bin/python3 - "$WORK/gpu_trace.json" <<'PY' || fail "gpu trace"
import json, sys
doc = json.load(open(sys.argv[1]))
ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
kernels = [e for e in ev if e["tid"] == 0 and e["cat"] == "compute"]
assert len(kernels) > 50, len(kernels)
assert all(e["dur"] > 0 for e in kernels)
span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
busy = sum(e["dur"] for e in kernels)
# two steps' kernels on one stream: they do not overlap each other, so their sum fits the span
assert busy <= span * 1.001, (busy, span)
print(f"gpu trace: {len(kernels)} kernels, {busy / 1000:.1f} ms busy in {span / 1000:.1f} ms")
PY
G4=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
# the report's arithmetic on the GPU's own spans, with collectives (two ranks, tp 2, oases K 2): the
# layers' communication sums to the step's, the groups' to it too, what the groups did not hide is
# could not + did not, and they hid no more than they could
"$OASES_BIN/oases-train" "$G4" --synthetic --batch 8 --seq 32 --steps 4 --local-ranks 2 --tp 2 --schedule oases --chunks 2 --device cuda \
  --overlap-report -q >"$WORK/gpu_tp2_overlap.txt" 2>&1 || fail "gpu tp 2 --overlap-report: $(tail -1 "$WORK/gpu_tp2_overlap.txt")"
/usr/bin/python3 - "$WORK/gpu_tp2_overlap.txt" <<'PY' || fail "gpu tp 2 overlap report arithmetic"
import re, sys
t = open(sys.argv[1]).read()
head = re.search(r"communication ([0-9.]+) ms: hidden ([0-9.]+) ms \([0-9]+%\), exposed ([0-9.]+) ms", t)
assert head, t[-2000:]
comm, hidden, exposed = map(float, head.groups())
assert comm > 0, "no collective timed on the GPU"
layers = [float(x) for x in re.findall(r"^  (?:other|layer \d+)\s+comm\s+([0-9.]+) ms", t, re.M)]
assert abs(sum(layers) - comm) <= 0.05 * len(layers) + 0.05, (layers, comm)
a = re.search(r"all: ([0-9.]+) ms of collectives; could hide ([0-9.]+) \(\d+%\), hid ([0-9.]+) .*could not ([0-9.]+) ms, did not (-?[0-9.]+) ms", t)
assert a, t[-2000:]
total, could, hid, could_not, did_not = map(float, a.groups())
assert abs(total - comm) <= 0.1, (total, comm)
assert abs((could_not + did_not) - (total - hid)) <= 0.2, (could_not, did_not, total, hid)
assert 0 <= exposed <= comm + 0.05, (exposed, comm)
assert hid <= could + 0.1 and could <= total + 0.1, (hid, could, total)
print(f"gpu tp 2 overlap report: {comm} ms of collectives, {hidden} hidden, {exposed} exposed")
PY
common=(--synthetic --batch 8 --seq 32 --lr 1e-3 --optimizer adamw --seed 3 -q)
while IFS='|' read -r label flags; do
  read -r -a f <<<"$flags"
  tag=${label// /_}
  for dev in cpu cuda; do
    "$OASES_BIN/oases-train" "$G4" "${common[@]}" "${f[@]}" --device $dev --steps 20 --log-json "$WORK/${tag}_$dev.jsonl" \
      >"$WORK/${tag}_$dev.txt" 2>&1 || fail "$label on $dev: $(tail -1 "$WORK/${tag}_$dev.txt")"
    "$OASES_BIN/oases-train" "$G4" "${common[@]}" "${f[@]}" --device $dev --steps 0 --dump-grads "$WORK/${tag}_$dev.grads" \
      >>"$WORK/${tag}_$dev.txt" 2>&1 || fail "$label gradients on $dev"
  done
  /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$WORK/${tag}_cpu.grads" "$WORK/${tag}_cuda.grads" "$label" \
    --losses "$WORK/${tag}_cpu.jsonl" "$WORK/${tag}_cuda.jsonl" --steps 20 --rtol 1e-5 --loss-rtol 1e-5 || fail "$label: GPU differs from the CPU"
done <<'CONFIGS'
tp 2|--local-ranks 2 --tp 2
dp 2|--local-ranks 2 --dp 2
tp 2 dp 2 sp|--local-ranks 4 --tp 2 --dp 2 --sequence-parallel
tp 2 sp collective matmul|--local-ranks 2 --tp 2 --sequence-parallel --collective-matmul
tp 2 oases K 2|--local-ranks 2 --tp 2 --schedule oases --chunks 2
pp 2 tied embedding 1f1b|--local-ranks 2 --pp 2 --micro-batches 4
pp 2 tp 2 eager 1F1B|--local-ranks 4 --pp 2 --tp 2 --pipeline eager-1f1b --micro-batches 4
stage meshes 2x1:oases,1x2|--local-ranks 4 --pp 2 --stage-meshes 2x1:oases,1x2 --chunks 2 --micro-batches 2
CONFIGS
finish
