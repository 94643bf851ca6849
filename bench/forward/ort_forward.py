"""ONNX Runtime peer of bench/forward: times InferenceSession.run on the model's input_0.pb.
  ort_forward.py MODEL DATA_DIR THREADS WARMUP REPEAT [OUT.npy]
Prints one JSON line: {"times_ms": [...], "version": ...}. Sequential execution, intra-op threads =
THREADS, inter-op 1, the default graph optimisation level (ORT_ENABLE_ALL)."""
import json
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper, TensorProto

model, data, threads, warmup, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
t = TensorProto()
t.ParseFromString(open(f"{data}/input_0.pb", "rb").read())
feeds = {sess.get_inputs()[0].name: numpy_helper.to_array(t)}
for _ in range(warmup):
    sess.run(None, feeds)
times = []
out = None
for _ in range(repeat):
    t0 = time.perf_counter()
    out = sess.run(None, feeds)
    times.append((time.perf_counter() - t0) * 1e3)
if len(sys.argv) > 6:
    np.save(sys.argv[6], out[0])
print(json.dumps({"times_ms": times, "version": ort.__version__}))
