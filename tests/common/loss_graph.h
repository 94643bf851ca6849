// A graph the loss-fusion tests share (tests/unit/gpu_backend_test.cpp runs it on the CPU fused
// and unfused, tests/gpu/cuda_kernels_test.cpp on the GPU against the CPU): mixed precision's chain
// around softmax cross-entropy, Cast(x16 → float32) → SoftmaxCrossEntropyLoss (mean, ignore_index
// -100) and SoftmaxCrossEntropyGrad(1, ...) → Cast back to x16, outputs the loss and the 16-bit
// gradient.
#pragma once

#include "graph/graph.h"

namespace oases::test {

struct LossGraph {
  Graph g;
  ValueId loss = kNoId, dscores = kNoId;
};

inline LossGraph cast_loss_graph(DType half, int64_t n, int64_t c) {
  LossGraph l;
  Graph& g = l.g;
  ValueId x = g.add_input("x", half, {n, c}), lab = g.add_input("labels", DType::kI64, {n});
  ValueId x32 = g.add_value("x32", DType::kF32, {n, c}, true);
  l.loss = g.add_value("loss", DType::kF32, {}, true);
  ValueId one = g.add_initializer("one", Tensor::scalar_f32(1.f));
  ValueId d32 = g.add_value("d32", DType::kF32, {n, c}, true);
  l.dscores = g.add_value("d16", half, {n, c}, true);
  AttrMap ig{{"ignore_index", Attribute::of_int(-100)}};
  g.add_node("Cast", {x}, {x32}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kF32))}}, "widen");
  g.add_node("SoftmaxCrossEntropyLoss", {x32, lab}, {l.loss}, ig, "sce");
  g.add_node("SoftmaxCrossEntropyGrad", {one, x32, lab}, {d32}, ig, "sce_grad", "oases");
  g.add_node("Cast", {d32}, {l.dscores}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(half))}}, "narrow");
  g.set_outputs({l.loss, l.dscores});
  return l;
}

}  // namespace oases::test
