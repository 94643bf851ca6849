#!/usr/bin/env bash
# oases-train's bad inputs: each a one-line error naming the culprit, exit code 2.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=$OASES_SOURCE_DIR/data/kjv_genesis.txt
T=$OASES_BIN/oases-train

# data shorter than one batch row
head -c 20 "$DATA" > "$WORK/short.txt"
expect_error "short data" "short\.txt.*fewer than one batch row" "$T" "$MODEL" --data "$WORK/short.txt" --seq 64 --steps 1
# token id >= vocabulary (uint16 ids up to 300 for a 256-byte vocabulary)
/usr/bin/python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<2000H', *[i % 301 for i in range(2000)]))" "$WORK/big.bin"
expect_error "token id" "big\.bin.*token id 256 .*vocabulary size 256" "$T" "$MODEL" --data "$WORK/big.bin" --steps 1
# checkpoint from another model
"$T" "$MODEL" --data "$DATA" --steps 1 --batch 2 --seq 16 --save "$WORK/ck" -q || fail "making a checkpoint"
"$T" "$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx" --data "$DATA" --steps 1 --save "$WORK/ck_tiny" -q || fail "making a checkpoint"
expect_error "foreign checkpoint" "ck_tiny.*another model" "$T" "$MODEL" --data "$DATA" --steps 2 --batch 2 --seq 16 --resume "$WORK/ck_tiny"
expect_error "not a checkpoint" "not an Oases checkpoint" "$T" "$MODEL" --data "$DATA" --steps 2 --resume "$DATA"
# no float initializer to train
/usr/bin/python3 - "$WORK/noparams.onnx" <<'PY'
import sys, onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.INT64, [2, 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3])
n1 = helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)
n2 = helper.make_node("Unsqueeze", ["xf", "ax"], ["xu"])
n3 = helper.make_node("Expand", ["xu", "shp"], ["y"])
g = helper.make_graph([n1, n2, n3], "g", [x], [y], [helper.make_tensor("ax", TensorProto.INT64, [1], [2]),
                                                   helper.make_tensor("shp", TensorProto.INT64, [3], [2, 4, 3])])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
expect_error "no parameters" "no float32 initializer to train" "$T" "$WORK/noparams.onnx" --data "$DATA" --steps 1
# no scalar output and no logits
/usr/bin/python3 - "$WORK/nologits.onnx" <<'PY'
import sys, onnx, numpy as np
from onnx import helper, TensorProto, numpy_helper
x = helper.make_tensor_value_info("x", TensorProto.INT64, [4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
w = numpy_helper.from_array(np.ones(8, np.float32), "w")
g = helper.make_graph([helper.make_node("Gather", ["w", "x"], ["y"])], "g", [x], [y], [w])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
expect_error "no loss" "no scalar output.*no logits" "$T" "$WORK/nologits.onnx" --data "$DATA" --steps 1
expect_error "two sources" "exactly one of" "$T" "$MODEL" --data "$DATA" --synthetic --steps 1
expect_error "missing data" "nope\.txt: no such data file" "$T" "$MODEL" --data "$WORK/nope.txt" --steps 1
mkdir -p "$WORK/a_folder"
expect_error "data path is a folder" "a_folder: is a folder, not a data file" "$T" "$MODEL" --data "$WORK/a_folder" --steps 1
expect_error "data path is a device" "/dev/null: not a regular file" "$T" "$MODEL" --data /dev/null --steps 1
for v in 100000 1025 -1; do
  expect_error "--threads $v" "^error: --threads: $v is not in \\[0, 1024\\]" "$T" "$MODEL" --data "$DATA" --steps 1 --threads "$v"
done
expect_error "oases-profile --threads 100000" "^error: --threads: Value 100000 not in range 0 to 1024" \
  "$OASES_BIN/oases-profile" --out "$WORK/profile.json" --threads 100000
expect_error "bad regex" "not a valid regular expression" "$T" "$MODEL" --data "$DATA" --steps 1 --freeze "("
# flag ranges: refused before any work (not given still means the default)
for flag in --tp --dp --batch --seq --local-ranks --chunks --grad-accum --val-batches --trace-steps; do
  expect_error "$flag 0" "^error: $flag: 0 is not in \\[1, inf\\)" "$T" "$MODEL" --data "$DATA" --steps 1 "$flag" 0
done
for flag in --steps --warmup --clip --min-lr --weight-decay --save-every --val-every --log-every --stop-after; do
  expect_error "$flag -1" "^error: $flag: -1 is not in \\[0, inf\\)" "$T" "$MODEL" --data "$DATA" --steps 1 "$flag" -1
done
for v in 0 -1 nan inf; do
  expect_error "--lr $v" "^error: --lr: $v is not in \\(0, inf\\)" "$T" "$MODEL" --data "$DATA" --steps 1 --lr "$v"
done
for v in -10000 -0.5 1 nan; do
  expect_error "--val-fraction $v" "^error: --val-fraction: $v is not in \\[0, 1\\)" "$T" "$MODEL" --data "$DATA" --steps 1 --val-fraction "$v"
done
expect_error "--clip nan" "^error: --clip: nan is not in" "$T" "$MODEL" --data "$DATA" --steps 1 --clip nan
# a diverging run (--lr 1e300 overflows every weight the first update touches): a checkpoint is never
# written from that state (its validation loss is checked first; without validation data, its
# tensors), `stop` exits 2 before the next update, the last checkpoint stays as it was; `skip` goes
# on with a warning per skipped step
cp "$WORK/ck" "$WORK/ck_before"
BOOM=("$T" "$MODEL" --data "$DATA" --steps 6 --batch 2 --seq 16 --lr 1e300 --warmup 0 --clip 0 --resume "$WORK/ck" --save "$WORK/ck" -q)
expect_error "non-finite save" "^error: .*ck: not written: the validation loss after step 2 is nan \(a checkpoint is never saved" \
  "${BOOM[@]}" --save-every 1
expect_error "non-finite save, no validation" "^error: .*ck: not written: tensor '.*' holds a non-finite value" "${BOOM[@]}" --save-every 1 \
  --val-fraction 0
expect_error "non-finite stop" "^error: step 3: the loss is .* stopped before the update" "${BOOM[@]}"
cmp -s "$WORK/ck" "$WORK/ck_before" || fail "non-finite: the checkpoint was replaced"
out=$("$T" "$MODEL" --data "$DATA" --steps 4 --batch 2 --seq 16 --lr 1e300 --clip 0 --on-nonfinite skip -q 2>&1)
rc=$?
if [[ $rc -eq 0 ]] && grep -q "^warning: step 2: .*update skipped" <<<"$out"; then echo "ok: non-finite skip warns"; else fail "non-finite skip: rc $rc: $out"; fi
# output paths are checked before any work (a missing folder, or a file where a folder should be)
for flag in --save --export-onnx --log-json --trace --export-plan; do
  expect_error "$flag missing folder" "^error: $flag .*/nodir/out: the folder .*/nodir does not exist" \
    "$T" "$MODEL" --data "$DATA" --steps 1 "$flag" "$WORK/nodir/out"
done
expect_error "--dump-grads under a file" "^error: --dump-grads .*short\.txt is not a folder" "$T" "$MODEL" --data "$DATA" --steps 1 --dump-grads "$WORK/short.txt/grads"
finish
