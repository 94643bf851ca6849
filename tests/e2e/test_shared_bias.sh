#!/usr/bin/env bash
# Exporters merge initializers of equal value (a freshly initialised model's zero biases become one
# tensor), so one bias can serve a column-parallel projection (split) and a row-parallel one (whole).
# The Megatron strategy keeps such a bias whole and each column-parallel use slices its part:
# tp 2 trains with the single-rank losses and gradients (the shared bias gets the sum).
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
M=$OASES_SOURCE_DIR/models/small/bert_mask
/usr/bin/python3 - "$M/model.onnx" "$WORK/shared.onnx" <<'PY' || { fail "could not write the shared-bias model"; finish; }
import sys, onnx
m = onnx.load(sys.argv[1])
# block 0: the query projection (column-parallel) and the attention output (row-parallel) read one bias
keep, drop = "m.h.0.attn.q_proj.bias", "m.h.0.attn.o_proj.bias"
for n in m.graph.node:
    for i, x in enumerate(n.input):
        if x == drop:
            n.input[i] = keep
inits = [t for t in m.graph.initializer if t.name != drop]
del m.graph.initializer[:]
m.graph.initializer.extend(inits)
onnx.checker.check_model(m)
onnx.save(m, sys.argv[2])
PY
common=(--inputs "$M/test_data_set_0" --steps 20 --lr 1e-3 --optimizer adamw -q)
"$T" "$WORK/shared.onnx" "${common[@]}" --log-json "$WORK/ref.jsonl" --dump-grads "$WORK/ref.grads" || fail "single rank"
"$T" "$WORK/shared.onnx" "${common[@]}" --local-ranks 2 --tp 2 --log-json "$WORK/tp.jsonl" --dump-grads "$WORK/tp.grads" || fail "tp 2"
/usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$WORK/ref.grads" "$WORK/tp.grads" "shared bias tp2" \
  --losses "$WORK/ref.jsonl" "$WORK/tp.jsonl" --steps 20 || fail "tp 2 differs from one rank"
finish
