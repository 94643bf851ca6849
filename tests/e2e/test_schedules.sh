#!/usr/bin/env bash
# Every schedule and chunk count gives the gradients of the plain schedule: 5 schedules x
# K in {1, 2, 4} x tp in {2, 4}. With one chunk nothing changes the order of any sum, so the
# gradients must be bit-identical; with more chunks the parameter gradients are summed chunk by
# chunk, so they agree within 1e-6 relative. Also checks the activations each schedule keeps per
# block. (Overlap itself: test_overlap.sh.)
# ctest: COST 21 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
M=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=(--data "$OASES_SOURCE_DIR/data/kjv_genesis.txt" --batch 8 --seq 32 --seed 3)

compare() {  # REF DIR LABEL EXACT(1|0): gradients within 1e-6 relative, or bit-identical
  /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$1" "$2" "$3" --rtol 1e-6 $([[ $4 == 1 ]] && echo --exact)
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
# interleaved (the chunks' activations all live until the backward; the recomputation of a block
# may move ahead of its readers' step only past steps that recompute nothing)
"$T" "$M" "${DATA[@]}" --steps 1 --local-ranks 2 --tp 2 --schedule oases --chunks 2 --memory-report -q 2> "$WORK/mem.oases" \
  || fail "oases memory report"
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
# and the arena follows: each block's recomputation runs just before its own backward (it once ran
# for every block ahead of the loss, which kept all the recomputed activations at once and left
# the checkpointed arenas as large as plain's)
def arena(s):
    return float(re.search(r"activation arena ([\d.]+) MiB at its peak", open(f"{sys.argv[1]}/mem.{s}").read()).group(1))
a = {s: arena(s) for s in ("plain", "default_checkpoint", "optim_comm_checkpoint", "oases")}
assert all(a[s] < 0.75 * a["plain"] for s in ("default_checkpoint", "optim_comm_checkpoint", "oases")), a
print("ok arenas (MiB):", a)
PY

# with sequence parallelism and with data parallelism beside tp
while read -r label args; do
  "$T" "$M" "${DATA[@]}" --steps 0 -q $args --dump-grads "$WORK/x.$label" || { fail "$label did not run"; continue; }
  compare "$WORK/ref2" "$WORK/x.$label" "$label" 0 || fail "$label differs"
done <<'CASES'
sp_tp2_oases_K2 --local-ranks 2 --tp 2 --sequence-parallel --schedule oases --chunks 2
sp_tp4_default_K2 --local-ranks 4 --tp 4 --sequence-parallel --schedule default_checkpoint --chunks 2
sp_dp2_tp2_overlap_K4 --local-ranks 4 --tp 2 --dp 2 --sequence-parallel --schedule overlap_checkpoint --chunks 4
dp2_tp2_oases_K2 --local-ranks 4 --tp 2 --dp 2 --schedule oases --chunks 2
cm_tp2_plain --local-ranks 2 --tp 2 --sequence-parallel --collective-matmul
cm_tp4_oases_K2 --local-ranks 4 --tp 4 --sequence-parallel --collective-matmul --schedule oases --chunks 2
cm_tp4_default_K2 --local-ranks 4 --tp 4 --sequence-parallel --collective-matmul --schedule default_checkpoint --chunks 2
cm_dp2_tp2_optim_K4 --local-ranks 4 --tp 2 --dp 2 --sequence-parallel --collective-matmul --schedule optim_comm_checkpoint --chunks 4
CASES

# a plan mixing layouts (attention without sequence parallelism, MLP and head with it) under a
# checkpointing schedule with one-sequence chunks: the recomputation leaves a chunk's forward
# all-gather unread, which every rank drops alike (it once stopped the run: "fusion removed node")
cat >"$WORK/mixed.json" <<'JSON'
{"format": "oases-plan", "version": 2, "mesh": {"axes": ["dp", "tp"], "sizes": [1, 2], "ranks": 2}, "batch": 4, "seq": 32,
 "vocab_parallel": true, "schedule": {"name": "default_checkpoint", "chunks": 4},
 "parts": [{"part": "embedding", "tp": 2, "sequence_parallel": false}, {"part": "layer.0.attn", "tp": 2, "sequence_parallel": false},
           {"part": "layer.0.mlp", "tp": 2, "sequence_parallel": true}, {"part": "layer.1.attn", "tp": 2, "sequence_parallel": false},
           {"part": "layer.1.mlp", "tp": 2, "sequence_parallel": true}, {"part": "head", "tp": 2, "sequence_parallel": true}]}
JSON
B4=(--data "$OASES_SOURCE_DIR/data/kjv_genesis.txt" --batch 4 --seq 32 --seed 3)
"$T" "$M" "${B4[@]}" --steps 0 --local-ranks 2 --tp 2 -q --dump-grads "$WORK/ref_b4" || fail "reference batch 4"
for sched in default_checkpoint overlap_checkpoint; do
  sed "s/default_checkpoint/$sched/" "$WORK/mixed.json" >"$WORK/mixed.$sched.json"
  "$T" "$M" "${B4[@]}" --steps 0 --local-ranks 2 --plan "$WORK/mixed.$sched.json" -q --dump-grads "$WORK/x.mixed.$sched" \
    || { fail "mixed sequence-parallel plan under $sched K=4 did not run"; continue; }
  compare "$WORK/ref_b4" "$WORK/x.mixed.$sched" "mixed sp plan $sched K=4" 0 || fail "mixed sequence-parallel plan under $sched differs"
done

# collective matmuls under MPI (point to point on the groups' communicators), and the flag's errors
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 "$T" "$M" "${DATA[@]}" --steps 0 -q --tp 4 --sequence-parallel --collective-matmul --schedule oases --chunks 2 \
  --dump-grads "$WORK/x.cm_mpi" || fail "collective matmul under MPI did not run"
compare "$WORK/ref2" "$WORK/x.cm_mpi" "cm_mpi_tp4_oases_K2" 0 || fail "collective matmul under MPI differs"
expect_error "--collective-matmul without sequence parallelism" "add --sequence-parallel" \
  "$T" "$M" "${DATA[@]}" --steps 1 --local-ranks 2 --tp 2 --collective-matmul

# dropout (training-mode export): masks come from global element indices, so tp, dp, chunks and
# recomputation all draw the masks of the single-rank run
MD=$OASES_SOURCE_DIR/models/train/gpt2_dropout/model.onnx
"$T" "$MD" "${DATA[@]}" --steps 0 -q --dump-grads "$WORK/dref" || fail "dropout reference"
while read -r label args; do
  "$T" "$MD" "${DATA[@]}" --steps 0 -q $args --dump-grads "$WORK/d.$label" || { fail "dropout $label did not run"; continue; }
  compare "$WORK/dref" "$WORK/d.$label" "dropout $label" 0 || fail "dropout $label differs"
done <<'CASES'
tp2 --local-ranks 2 --tp 2
tp4_default_K4 --local-ranks 4 --tp 4 --schedule default_checkpoint --chunks 4
tp2_oases_K2 --local-ranks 2 --tp 2 --schedule oases --chunks 2
dp2 --local-ranks 2 --dp 2
dp2_tp2_optim_K2 --local-ranks 4 --dp 2 --tp 2 --schedule optim_comm_checkpoint --chunks 2
CASES

finish
