# Helpers for the end-to-end tests (sourced). OASES_BIN and OASES_SOURCE_DIR come from CTest.
set -uo pipefail
: "${OASES_BIN:?}" "${OASES_SOURCE_DIR:?}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILURES=0

FAILED_LINES=()
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); FAILED_LINES+=("$*"); }

# expect_error NAME PATTERN CMD...: CMD must exit 2 with one line on stderr `error: ...` matching PATTERN
expect_error() {
  local name=$1 pattern=$2
  shift 2
  local err
  err=$("$@" 2>&1 >/dev/null)
  local rc=$?
  if [[ $rc -ne 2 ]]; then fail "$name: exit code $rc, expected 2 (stderr: $err)"; return; fi
  if [[ $(printf '%s\n' "$err" | grep -c .) -ne 1 ]]; then fail "$name: expected one line on stderr, got: $err"; return; fi
  if [[ $err != error:* ]]; then fail "$name: stderr does not start with 'error:': $err"; return; fi
  if ! grep -qE -- "$pattern" <<<"$err"; then fail "$name: message does not match /$pattern/: $err"; return; fi
  echo "ok: $name -> $err"
}

# forward_within MODEL DATA_SET REL: oases-run's outputs must lie within REL of the largest
# magnitude of the expected output (oases-run --rtol 0 --atol REL*max|expected|, the smallest such
# bound over the outputs: a logit near zero makes an element's own relative error meaningless).
# Returns oases-run's exit code (0 within, 1 a mismatch, 2 an error); sets FORWARD_OUT to its output
# and FORWARD_WORST to the largest max abs error over max |expected| of the outputs.
forward_within() {
  local model=$1 ds=$2 rel=$3 scales atol rc
  scales=$(/usr/bin/python3 - "$ds" <<'PY'
import glob, sys
import numpy as np, onnx
from onnx import numpy_helper
files = sorted(glob.glob(sys.argv[1] + "/output_*.pb"), key=lambda f: int(f.rsplit("_", 1)[1][:-3]))
print(" ".join(repr(float(np.abs(numpy_helper.to_array(onnx.load_tensor(f))).max())) for f in files))
PY
  ) || return 2
  atol=$(/usr/bin/python3 -c 'import sys; print(float(sys.argv[1]) * min(map(float, sys.argv[2:])))' "$rel" $scales) || return 2
  FORWARD_OUT=$("$OASES_BIN/oases-run" "$model" --data-set "$ds" --rtol 0 --atol "$atol" 2>&1)
  rc=$?
  FORWARD_WORST=$(/usr/bin/python3 -c '
import re, sys
errs = [float(e) for e in re.findall(r"max abs err (\S+)", sys.argv[1])]
scales = list(map(float, sys.argv[2:]))
print(f"{max(e / s for e, s in zip(errs, scales)):.1e}" if errs and len(errs) == len(scales) else "?")' "$FORWARD_OUT" $scales)
  return $rc
}

# --- runs against one rank (test_pipeline.sh, test_zero.sh, test_pipeline_zb.sh) ------------------
# Each test sets `common` (the flags of every run) and may set RUN_FLAGS (added to each run_vs_one_rank).
# Each launch bounded (timeout signals its whole process group: mpirun and its ranks): on
# 2026-11-29 one rank of a launch in test_pipeline failed in MPI_Init ("OPAL ERROR: Unreachable in
# file ext3x_client.c": its PMIx client could not reach mpirun's server) and the test then sat until
# CTest's 600 s limit; a launch that stalls now fails by name after OASES_MPIRUN_TIMEOUT seconds.
MPIRUN=(timeout -k 10 "${OASES_MPIRUN_TIMEOUT:-300}" mpirun --allow-run-as-root --oversubscribe --bind-to none)
need_mpirun() {
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  command -v mpirun >/dev/null || { echo "mpirun missing: install openmpi-bin (scripts/setup.sh)"; exit 1; }
}
# 2e-6: a weight gradient summed over micro-batches and chunks adds its batch*seq terms in another
# order than one rank's whole-batch product; with OpenBLAS's AVX-512 kernels (SkylakeX, which the
# tools choose on these hosts) and its AVX2 ones (Haswell) that rounds up to 1.2e-6 apart (llama_4l,
# pp 2 x tp 2, 4 micro-batches, oases with 2 chunks: k_proj), with its SSE3 Prescott kernels up to
# 8.4e-7. The losses stay within 8.6e-8 of one rank's (all three, 2026-11-26): checked at 1e-6.
compare() {  # compare REF_LOG LOG REF_GRADS GRADS LABEL
  /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$3" "$4" "$5" --losses "$1" "$2" --steps 20 --rtol 2e-6 --loss-rtol 1e-6
}
RUN_FLAGS=()
# pipeline_tests: what test_pipeline*.sh share: T (oases-train), mpirun, `common` (the flags of
# every run) and run (run_vs_one_rank)
pipeline_tests() {
  T=$OASES_BIN/oases-train
  need_mpirun
  common=(--synthetic --batch 16 --seq 32 --lr 1e-3 --optimizer adamw -q)
}
run() { run_vs_one_rank "$@"; }
# one_rank_reference NAME MODEL: 20 steps of MODEL on one rank with "${common[@]}" ($WORK/NAME.jsonl)
# and its first step's gradients ($WORK/NAME.grads), what run_vs_one_rank compares against. One
# launch writes both: --dump-grads with steps writes the first step's gradients before its update,
# the same bits as --steps 0 --dump-grads (test_pipeline checks the two agree).
one_rank_reference() {
  "$OASES_BIN/oases-train" "$2" "${common[@]}" --steps 20 --log-json "$WORK/$1.jsonl" --dump-grads "$WORK/$1.grads" || fail "$1 single rank"
}
# run_vs_one_rank LABEL REF LAUNCH... -- FLAGS...: 20 steps and the first step's gradients of LAUNCH with
# "${common[@]}" "${RUN_FLAGS[@]}" FLAGS (one launch), compared with REF's ($WORK/REF.jsonl and $WORK/REF.grads)
run_vs_one_rank() {
  local label=$1 ref=$2
  shift 2
  local launch=()
  while [[ $1 != -- ]]; do launch+=("$1"); shift; done
  shift
  local tag=${label// /_} attempt rc
  for attempt in 1 2; do
    rm -f "$WORK/$tag.jsonl"
    rc=0
    "${launch[@]}" "${common[@]}" "${RUN_FLAGS[@]}" --steps 20 --log-json "$WORK/$tag.jsonl" --dump-grads "$WORK/$tag.grads" "$@" \
      2>"$WORK/$tag.err" || rc=$?
    cat "$WORK/$tag.err" >&2
    ((rc == 0)) && break
    # Open MPI's own start-up failing before MPI_Init returned (no line of ours ran): once more
    if [[ $attempt == 1 ]] && grep -q "before MPI_INIT completed" "$WORK/$tag.err"; then
      echo "note: $label: Open MPI failed to start a rank (MPI_Init, above); launching once more"
      continue
    fi
    fail "$label: training"
    return
  done
  compare "$WORK/$ref.jsonl" "$WORK/$tag.jsonl" "$WORK/$ref.grads" "$WORK/$tag.grads" "$label" || fail "$label differs"
}

# vocabulary_heavy_stack: writes $WORK/stacks/gpt_h128_l4_v16384_s64/model.onnx (hidden 128, 4 blocks,
# vocabulary 16384, 64 tokens) and $WORK/pcie.json (2 hosts of 4 A100s on PCIe, 10 Gbit/s between)
# and sets V to the model: where the planner's stage and memory choices show
vocabulary_heavy_stack() {
  /usr/bin/python3 "$OASES_SOURCE_DIR/models/make_oases_stacks.py" --out "$WORK/stacks" --stack 128x4 --vocab 16384 --seq 64 >/dev/null \
    || fail "write a vocabulary-heavy stack"
  cat >"$WORK/pcie.json" <<'JSON'
{"format": "oases-cluster", "version": 1, "name": "2 hosts of 4 A100 on PCIe", "device": "A100-SXM-80GB", "nodes": 2, "gpus_per_node": 4,
 "links": {"intra_node": {"kind": "pcie", "bandwidth_gbps": 12.0, "latency_us": 10},
           "inter_node": {"kind": "ethernet", "bandwidth_gbps": 1.25, "latency_us": 50}}}
JSON
  V=$WORK/stacks/gpt_h128_l4_v16384_s64/model.onnx
}

# stage_memory_within OUT LABEL [AFTER]: oases-plan --simulate's output OUT (from the line holding
# AFTER on, when given) has two stage rows, each stage's predicted memory within 15% of its replayed
# program's (parameters, moments and the stage program's arena)
stage_memory_within() {
  /usr/bin/python3 - "$1" "$2" "${3:-}" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
t = t[t.find(sys.argv[3]):] if sys.argv[3] else t
rows = re.findall(r"stage (\d) \(rank \d+\):.*memory ([\d.]+) MiB \(predicted ([\d.]+) MiB\)", t)
assert len(rows) == 2, t
for s, replayed, predicted in rows:
    r = float(predicted) / float(replayed)
    assert 0.85 <= r <= 1.15, f"{sys.argv[2]} stage {s}: predicted {predicted} MiB, replayed {replayed} MiB ({r:.2f}x)"
print(f"ok {sys.argv[2]}: stage memory predicted/replayed " + ", ".join(f"{p}/{r} MiB" for _, r, p in rows))
PY
}

# same_checkpoint A B: both checkpoints (a pipeline's manifest: its stage files merged) hold the same
# tensors bit for bit, saved at step 10, optimizer state among them
same_checkpoint() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
def tensors(path):  # executor/checkpoint.h: magic, header length, crc, JSON header, tensor bytes
    raw = open(path, "rb").read()
    if raw[:8] == b"OASESPP1":  # a pipeline's manifest: the stage files beside it, merged
        m = json.loads(raw[9:])
        out = {}
        for f in m["files"]:
            step, t = tensors(os.path.join(os.path.dirname(path), f))
            assert step == m["step"] and not set(t) & set(out), (f, step)
            out.update(t)
        return m["step"], out
    n = struct.unpack("<Q", raw[8:16])[0]
    head = json.loads(raw[20:20 + n])
    return head["step"], {t["name"]: raw[20 + n + t["offset"]:20 + n + t["offset"] + t["bytes"]] for t in head["tensors"]}
(sa, a), (sb, b) = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sa == sb == 10, (sa, sb)
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
assert any(k.endswith((".m", ".momentum")) for k in a), "no optimizer state in the checkpoint"
bad = [k for k in a if a[k] != b[k]]
assert not bad, f"not bit for bit: {bad[:5]}"
print(f"ok {sys.argv[2]}: {len(a)} tensors bit for bit")
PY
}
# resumed_continues STRAIGHT_LOG RESUMED_LOG LABEL: the resumed run's 10 losses (steps 11-20) within 1e-6
# relative of the straight run's
resumed_continues() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])][10:]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 10, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst <= 1e-6, (worst, list(zip(a, b)))
print(f"ok resumed {sys.argv[3]}: steps 11-20 within {worst:.1e} of the straight run")
PY
}

finish() {
  # the failures again at the end, where a truncated log (CI keeps its head and tail) still shows them
  if [[ $FAILURES -ne 0 ]]; then
    echo "$FAILURES failure(s):"
    printf '  FAIL: %s\n' "${FAILED_LINES[@]}" | cut -c1-600
    exit 1
  fi
  echo "all passed"
  exit 0
}
