#!/usr/bin/env bash
# oases-train and oases-import on empty dimensions and on limits that must be validated where they
# are typed (issue 17): each a one-line error naming the culprit, exit code 2, never a signal or
# a hang. (oases-run's and the importer's model-side cases are in test_bad_inputs.sh.)
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
T=$OASES_BIN/oases-train
I=$OASES_BIN/oases-import

# zero-sized dims: the attention fusion divided by tq*tk (SIGFPE), training broadcast into a null buffer (SIGSEGV)
expect_error "import sequence=0" "--dim 'sequence=0'.*at least 1" "$I" "$MODEL" --dim batch=2 --dim sequence=0
expect_error "train seq 0" "--shape 'input_ids=2,0'.*at least 1" "$T" "$MODEL" --synthetic --steps 1 --shape input_ids=2,0
expect_error "train batch 0" "--shape 'input_ids=0,16'.*at least 1" "$T" "$MODEL" --synthetic --steps 1 --shape input_ids=0,16

# a logits output whose last dim (the vocabulary) is 0
/usr/bin/python3 - "$WORK/empty_vocab.onnx" <<'PY'
import sys, onnx, numpy as np
from onnx import helper, TensorProto, numpy_helper
ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [2, 4])
y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 4, 0])
emb = numpy_helper.from_array(np.ones((8, 3), np.float32), "emb")
head = numpy_helper.from_array(np.ones((3, 0), np.float32), "head")
g = helper.make_graph([helper.make_node("Gather", ["emb", "input_ids"], ["h"], name="embed"),
                       helper.make_node("MatMul", ["h", "head"], ["logits"], name="lm_head")], "g", [ids], [y], [emb, head])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
expect_error "empty vocabulary" "logits.*(empty|0)" "$T" "$WORK/empty_vocab.onnx" --synthetic --steps 1

# the emulated link: a latency of 1e12 us slept for 11 days
expect_error "link latency" "--emulate-link 'bw=10,latency=1e12'.*latency" "$T" "$MODEL" --synthetic --steps 1 --emulate-link bw=10,latency=1e12
expect_error "link bandwidth" "--emulate-link 'bw=nan'.*bandwidth" "$T" "$MODEL" --synthetic --steps 1 --emulate-link bw=nan
expect_error "link bandwidth tiny" "--emulate-link 'bw=1e-300'.*bandwidth" "$T" "$MODEL" --synthetic --steps 1 --emulate-link bw=1e-300

# thread counts: the pool would try to start 100000 threads (EAGAIN)
expect_error "train threads" "100000" "$T" "$MODEL" --synthetic --steps 1 --threads 100000
finish
