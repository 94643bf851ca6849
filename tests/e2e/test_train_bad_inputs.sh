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
expect_error "bad regex" "not a valid regular expression" "$T" "$MODEL" --data "$DATA" --steps 1 --freeze "("
finish
