// A graph the strided-attention tests share (tests/unit/gpu_backend_test.cpp runs it on the CPU
// fused and unfused, tests/gpu/cuda_kernels_test.cpp on the GPU against the CPU): attention over a
// fused qkv projection as exporters and autodiff leave it,
//   forward   x [B, T, (H + 2·Hkv)·D] → Split → Reshape [B, T, h, D] → Transpose(0, 2, 1, 3) → q, k, v
//             → oases.Attention → Transpose(0, 2, 1, 3) → Reshape → y [B, T, H·D]
//   backward  dy → Reshape → Transpose → oases.AttentionGrad → dq, dk, dv → Transpose → Reshape
//             → Concat → dx [B, T, (H + 2·Hkv)·D]
// with outputs y and dx (and lse, which the backward reads).
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace oases::test {

struct AttentionGraph {
  Graph g;
  ValueId y = kNoId, dx = kNoId;
};

inline AttentionGraph fused_qkv_attention_graph(DType t, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool causal) {
  AttentionGraph a;
  Graph& g = a.g;
  const int64_t heads[3] = {H, Hkv, Hkv};
  const int64_t W = (H + 2 * Hkv) * D;
  const char* names[3] = {"q", "k", "v"};
  const std::vector<int64_t> perm{0, 2, 1, 3};
  ValueId x = g.add_input("x", t, {B, T, W}), dy = g.add_input("dy", t, {B, T, H * D});
  auto shape_const = [&g](const std::string& name, std::vector<int64_t> dims) {
    return g.add_initializer(name, Tensor::from_int64(dims, {static_cast<int64_t>(dims.size())}));
  };
  std::vector<ValueId> parts(3), heads4(3), bhtd(3);
  for (int i = 0; i < 3; ++i) parts[i] = g.add_value(std::string(names[i]) + "_flat", t, {B, T, heads[i] * D}, true);
  g.add_node("Split", {x}, parts,
             AttrMap{{"axis", Attribute::of_int(2)}, {"split", Attribute::of_ints({H * D, Hkv * D, Hkv * D})}}, "split");
  for (int i = 0; i < 3; ++i) {
    std::string n = names[i];
    heads4[i] = g.add_value(n + "_heads", t, {B, T, heads[i], D}, true);
    g.add_node("Reshape", {parts[i], shape_const(n + "_shape", {B, T, heads[i], D})}, {heads4[i]}, {}, n + "_reshape");
    bhtd[i] = g.add_value(n, t, {B, heads[i], T, D}, true);
    g.add_node("Transpose", {heads4[i]}, {bhtd[i]}, AttrMap{{"perm", Attribute::of_ints(perm)}}, n + "_transpose");
  }
  AttrMap attrs{{"causal", Attribute::of_int(causal ? 1 : 0)}};
  ValueId o = g.add_value("o", t, {B, H, T, D}, true), lse = g.add_value("lse", DType::kF32, {B, H, T}, true);
  g.add_node("Attention", bhtd, {o, lse}, attrs, "attn", "oases");
  ValueId ot = g.add_value("o_t", t, {B, T, H, D}, true);
  g.add_node("Transpose", {o}, {ot}, AttrMap{{"perm", Attribute::of_ints(perm)}}, "o_transpose");
  a.y = g.add_value("y", t, {B, T, H * D}, true);
  g.add_node("Reshape", {ot, shape_const("y_shape", {B, T, H * D})}, {a.y}, {}, "o_reshape");
  // backward
  ValueId dyt = g.add_value("dy_heads", t, {B, T, H, D}, true), dout = g.add_value("dout", t, {B, H, T, D}, true);
  g.add_node("Reshape", {dy, shape_const("dy_shape", {B, T, H, D})}, {dyt}, {}, "dy_reshape");
  g.add_node("Transpose", {dyt}, {dout}, AttrMap{{"perm", Attribute::of_ints(perm)}}, "dy_transpose");
  std::vector<ValueId> grads(3), flat(3);
  for (int i = 0; i < 3; ++i) grads[i] = g.add_value(std::string("d") + names[i], t, {B, heads[i], T, D}, true);
  g.add_node("AttentionGrad", {dout, bhtd[0], bhtd[1], bhtd[2], o, lse}, grads, attrs, "attn_grad", "oases");
  for (int i = 0; i < 3; ++i) {
    std::string n = std::string("d") + names[i];
    ValueId gt = g.add_value(n + "_t", t, {B, T, heads[i], D}, true);
    g.add_node("Transpose", {grads[i]}, {gt}, AttrMap{{"perm", Attribute::of_ints(perm)}}, n + "_transpose");
    flat[i] = g.add_value(n + "_flat", t, {B, T, heads[i] * D}, true);
    g.add_node("Reshape", {gt, shape_const(n + "_shape", {B, T, heads[i] * D})}, {flat[i]}, {}, n + "_reshape");
  }
  a.dx = g.add_value("dx", t, {B, T, W}, true);
  g.add_node("Concat", flat, {a.dx}, AttrMap{{"axis", Attribute::of_int(2)}}, "concat");
  g.set_outputs({a.y, a.dx});
  return a;
}

}  // namespace oases::test
