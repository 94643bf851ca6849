#!/usr/bin/env bash
# ctest: RUN_SERIAL (two ranks on a slow emulated link: the run is long and busy on the two cores)
# On a slow emulated link the oases schedule interleaves the chunks so tp communication can hide
# behind compute. Checked by structure, not by timing (speed belongs in bench/): in the schedule the
# program runs (OASES_DUMP_SCHEDULE), a chunk's collective starts before another chunk's compute and
# is waited for only after it; the Chrome trace shows collectives on the comm thread and both chunks.
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
M=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
# The size the overlap was tuned at (16 x 128; bench/ measures the hidden share); the checks below
# look only at the schedule's order and the trace's threads, which do not depend on it.
DATA=(--data "$OASES_SOURCE_DIR/data/kjv_genesis.txt" --batch 16 --seq 128 --seed 3)
for sched in default_checkpoint oases; do
  OASES_DUMP_SCHEDULE=1 "$T" "$M" "${DATA[@]}" --steps 4 --local-ranks 2 --tp 2 --schedule $sched --chunks 2 --emulate-link bw=1,latency=50 \
    --overlap-report --trace "$WORK/trace.$sched.json" -q 2> "$WORK/overlap.$sched" || fail "$sched overlap run"
done
/usr/bin/python3 - "$WORK" <<'PY' || fail "overlap schedule / trace"
import json, re, sys
w = sys.argv[1]
LINE = re.compile(r"^(START|WAIT |    ) c(\d+)\s+(fwd|loss|bwd|recompute)\s+(\S+)\s*(.*)$")
def schedule(s):
    ops = []
    for line in open(f"{w}/overlap.{s}"):
        m = LINE.match(line.rstrip("\n"))
        if m:
            ops.append((m.group(1).strip() or "compute", int(m.group(2)), m.group(3), m.group(4), m.group(5).strip()))
    return ops
def hidden_collectives(ops):
    """Collectives with compute of another chunk between their START and their WAIT."""
    pending, hidden, total = {}, 0, 0
    for i, (kind, chunk, phase, op, scope) in enumerate(ops):
        key = (chunk, phase, op, scope)
        if kind == "START":
            pending.setdefault(key, []).append(i)
        elif kind == "WAIT":
            assert pending.get(key), f"WAIT without an earlier START: {ops[i]}"
            s = pending[key].pop(0)
            total += 1
            hidden += any(k == "compute" and c != chunk for k, c, *_ in ops[s + 1:i])
    assert not any(pending.values()), f"STARTs never waited for: {[k for k, v in pending.items() if v][:3]}"
    return hidden, total
for sched in ("default_checkpoint", "oases"):
    ops = schedule(sched)
    assert ops, f"{sched}: OASES_DUMP_SCHEDULE printed no schedule"
    assert {c for _, c, *_ in ops} == {0, 1}, f"{sched}: expected chunks 0 and 1"
    hidden, total = hidden_collectives(ops)
    assert total > 0, f"{sched}: no collectives in the schedule"
    print(f"{sched}: {total} collectives, {hidden} with another chunk's compute between START and WAIT")
base_hidden, _ = hidden_collectives(schedule("default_checkpoint"))
ops = schedule("oases")
hidden, total = hidden_collectives(ops)
# interleaved per sub-layer: every collective flies while the other chunk computes, unlike chunks in sequence
assert hidden == total, f"oases: only {hidden} of {total} collectives have another chunk's compute between START and WAIT"
assert hidden > base_hidden, (hidden, base_hidden)
# every forward collective of chunk 0 is started before chunk 1's compute of the same phase has finished:
# chunk 1's forward compute runs between chunk 0's forward START and WAIT for at least one collective
fwd_hidden = sum(1 for i, (k, c, ph, op, sc) in enumerate(ops) if k == "START" and ph == "fwd" and c == 0
                 and any(kk == "compute" and cc == 1 for kk, cc, *_ in
                         ops[i + 1:next(j for j in range(i + 1, len(ops)) if ops[j][0] == "WAIT" and ops[j][1:] == (c, ph, op, sc))]))
assert fwd_hidden > 0, "oases: no forward collective of chunk 0 overlaps chunk 1's forward compute in the schedule"
t = json.load(open(f"{w}/trace.oases.json"))
ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in ev} == {0, 1}
assert {e["cat"] for e in ev} >= {"compute", "comm"}
assert any("(chunk 1)" in e["name"] for e in ev)
# collectives run on the communication thread (tid 1), compute on the main thread (tid 0)
assert any(e["pid"] == 0 and e["tid"] == 1 and e["cat"] == "comm" for e in ev), "no collective on the comm thread"
assert all(e["tid"] == 0 for e in ev if e["cat"] == "compute"), "compute off the main thread"
print(f"ok overlap: oases starts {hidden} of {total} collectives before another chunk's compute ({fwd_hidden} forward)")
# --overlap-report's groups: every collective in one, hidden + exposed = its time, hidden within what
# could hide, and exposed told apart into could not + did not
rows, in_table = {}, False
for line in open(f"{w}/overlap.oases"):
    if line.startswith("  group ") and "could hide" in line:
        in_table = True
    elif in_table and line.startswith("  all:"):
        break
    elif in_table and not line.startswith("  ..."):
        f = line.split()
        rows[" ".join(f[:-8])] = [float(x) for x in f[-8:]]
assert rows, "oases: --overlap-report printed no collective groups"
assert any(k.startswith("layer 0 attn forward") for k in rows) and any("backward" in k for k in rows), sorted(rows)
for name, (count, comm, hid, could, exposed, could_not, did_not, late) in rows.items():
    assert count >= 1 and abs(hid + exposed - comm) <= 0.02, (name, comm, hid, exposed)
    assert hid <= could + 0.02 and could <= comm + 0.02, (name, hid, could, comm)
    assert abs(could_not + did_not - exposed) <= 0.02 and could_not >= -0.02 and did_not >= -0.02, (name, exposed, could_not, did_not)
assert any("all:" in l and "could hide" in l for l in open(f"{w}/overlap.oases")), "no summary line"
print(f"ok overlap report: {len(rows)} collective groups, each hidden + exposed = its time, exposed split into could not + did not")
PY
finish
