// A graph the GELU-epilogue tests share (tests/unit/gpu_backend_test.cpp runs it on the CPU fused
// and unfused, tests/gpu/cuda_kernels_test.cpp on the GPU against the CPU): a transformer's MLP in
// training as autodiff leaves it,
//   forward   x [B, T, C] → MatMul w1 [C, F] → Add b1 [F] → h → Gelu(tanh) → MatMul w2 [F, C] → y
//   backward  dy → oases.MatMulT(dy, w2; trans_b) → oases.GeluGrad(·, h) → dh
//             → oases.MatMulT(dh, w1; trans_b) → dx,  ReduceSum(dh; axes 0, 1, dims kept) → Reshape → db1
// with outputs y, dx and db1 (without the bias: no Add, no ReduceSum, no db1). h is read by the
// GELU and its gradient, so a device program's product writes both the GELU and h.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace oases::test {

struct MlpGraph {
  Graph g;
  ValueId y = kNoId, dx = kNoId, db1 = kNoId;
};

inline MlpGraph gelu_mlp_graph(DType t, int64_t B, int64_t T, int64_t C, int64_t F, bool bias) {
  MlpGraph m;
  Graph& g = m.g;
  ValueId x = g.add_input("x", t, {B, T, C}), w1 = g.add_input("w1", t, {C, F}), w2 = g.add_input("w2", t, {F, C});
  ValueId b1 = bias ? g.add_input("b1", t, {F}) : kNoId;
  ValueId dy = g.add_input("dy", t, {B, T, C});
  AttrMap tanh_form{{"approximate", Attribute::of_string("tanh")}};
  ValueId h0 = g.add_value("h0", t, {B, T, F}, true), h = h0;
  g.add_node("MatMul", {x, w1}, {h0}, {}, "fc1");
  if (bias) {
    h = g.add_value("h", t, {B, T, F}, true);
    g.add_node("Add", {h0, b1}, {h}, {}, "fc1_bias");
  }
  ValueId a = g.add_value("a", t, {B, T, F}, true);
  g.add_node("Gelu", {h}, {a}, tanh_form, "gelu");
  m.y = g.add_value("y", t, {B, T, C}, true);
  g.add_node("MatMul", {a, w2}, {m.y}, {}, "fc2");
  // backward
  ValueId da = g.add_value("da", t, {B, T, F}, true), dh = g.add_value("dh", t, {B, T, F}, true);
  g.add_node("MatMulT", {dy, w2}, {da}, AttrMap{{"trans_b", Attribute::of_int(1)}}, "fc2_dx", "oases");
  g.add_node("GeluGrad", {da, h}, {dh}, tanh_form, "gelu_grad", "oases");
  m.dx = g.add_value("dx", t, {B, T, C}, true);
  g.add_node("MatMulT", {dh, w1}, {m.dx}, AttrMap{{"trans_b", Attribute::of_int(1)}}, "fc1_dx", "oases");
  std::vector<ValueId> outs{m.y, m.dx};
  if (bias) {
    ValueId sums = g.add_value("db1_kept", t, {1, 1, F}, true);
    g.add_node("ReduceSum", {dh}, {sums}, AttrMap{{"axes", Attribute::of_ints({0, 1})}, {"keepdims", Attribute::of_int(1)}}, "fc1_db");
    m.db1 = g.add_value("db1", t, {F}, true);
    ValueId shape = g.add_initializer("db1_shape", Tensor::from_int64({F}, {1}));
    g.add_node("Reshape", {sums, shape}, {m.db1}, {}, "fc1_db_reshape");
    outs.push_back(m.db1);
  }
  g.set_outputs(outs);
  return m;
}

}  // namespace oases::test
