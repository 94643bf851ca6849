#!/usr/bin/env bash
# Bad layouts of parallel runs: tp not dividing heads, key/value heads, MLP width or the
# vocabulary; world size != tp x dp; ranks started with different models. Each ends within seconds
# with a clear error (exit 2).
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
TINY=$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx
ODD=$OASES_SOURCE_DIR/tests/data/models/gpt2_odd_sizes/model.onnx
D=(--synthetic --steps 10 -q)

expect_error "heads" "block 0: tp 3 does not divide its 4 attention heads" "$T" "$TINY" "${D[@]}" --local-ranks 3 --tp 3
# tp 4 over 2 key/value heads is no error since Megatron's rule holds (the K/V heads replicated,
# tests/unit/attention_heads_test.cpp checks its gradients); tp neither dividing nor a multiple of
# the K/V heads is, with one line naming both counts (checked there: no committed model has such heads)
out=$("$T" "$OASES_SOURCE_DIR/models/small/llama_gqa/model.onnx" "${D[@]}" --local-ranks 4 --tp 4 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "kv heads: tp 4 over 2 key/value heads: exit $rc ($out)"
echo "ok: kv heads: tp 4 over 2 key/value heads trains"
expect_error "mlp width" "block 0 mlp up: tp 4 does not divide the 90 output features" "$T" "$ODD" "${D[@]}" --local-ranks 4 --tp 4
expect_error "vocabulary" "tp 2 does not divide the vocabulary size 255" "$T" "$ODD" "${D[@]}" --local-ranks 2 --tp 2
expect_error "world size" "tp 3 x dp 1 = 3 ranks, but the run has 4" "$T" "$TINY" "${D[@]}" --local-ranks 4 --tp 3 --dp 1

# under MPI: the layout error comes from rank 0, mpirun exits 2
out=$("${MPIRUN[@]}" -np 2 "$T" "$TINY" "${D[@]}" --tp 4 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "mpi world size: exit $rc"
grep -q "error: tp 4 does not divide the 2 ranks of this run" <<<"$out" || fail "mpi world size message: $out"

# ranks started with different models (MPMD launch)
out=$("${MPIRUN[@]}" -np 1 "$T" "$TINY" --synthetic --steps 2 -q --tp 2 : -np 1 "$T" "$OASES_SOURCE_DIR/models/small/gpt2_rms_gelu/model.onnx" \
  --synthetic --steps 2 -q --tp 2 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "different models: exit $rc ($out)"
grep -qE "error: .*rank 1 runs another model or binary than rank 0" <<<"$out" || fail "different models message: $out"
echo "ok: different models -> exit $rc"

# faults of a running rank (failing, hung, dead): tests/e2e/test_rank_faults*.sh
finish
