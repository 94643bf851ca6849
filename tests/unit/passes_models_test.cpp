// Pass behaviour found on exported models (models/small): fusions must not misfire on each other's
// leftovers, and scalar constants stored as initializers (dynamo exporter) fold like Constants.
#include <algorithm>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "executor/executor.h"
#include "graph/graph.h"
#include "graph/passes/pass.h"

namespace oases {
namespace {

int count_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.nodes()) n += g.node(id).op_type == op;
  return n;
}

// LayerNorm written out with a scale and no bias (the decomposition below opset 17):
//   d = x - mean(x); y = d / sqrt(mean(d^2) + eps) * gamma
Graph layernorm_without_bias() {
  Graph g;
  g.opset_imports[""] = 14;
  ValueId x = g.add_input("x", DType::kF32, {2, 3, 8});
  ValueId gamma = g.add_initializer("gamma", Tensor::from_f32({1, 2, 3, 4, 5, 6, 7, 8}, {8}));
  AttrMap red{{"axes", Attribute::of_ints({-1})}, {"keepdims", Attribute::of_int(1)}};
  auto op = [&](const std::string& type, std::vector<ValueId> ins, AttrMap a = {}) {
    NodeId n = g.add_node_new_outputs(type, ins, 1, std::move(a));
    return g.node(n).outputs[0];
  };
  ValueId mean = op("ReduceMean", {x}, red);
  ValueId d = op("Sub", {x, mean});
  ValueId sq = op("Pow", {d, g.add_constant("two", Tensor::scalar_f32(2.f))});
  ValueId var = op("ReduceMean", {sq}, red);
  ValueId ve = op("Add", {var, g.add_constant("eps", Tensor::scalar_f32(1e-5f))});
  ValueId sd = op("Sqrt", {ve});
  ValueId n = op("Div", {d, sd});
  ValueId y = op("Mul", {n, gamma});
  g.add_output(y);
  return g;
}

TEST(PassesOnModels, RmsNormDoesNotFuseALayerNormsVariance) {
  Graph g = layernorm_without_bias();
  ASSERT_TRUE(InferShapesPass().run(g));
  auto ln = make_fuse_layernorm_pass()->run(g);
  ASSERT_TRUE(ln);
  EXPECT_EQ(ln->count, 1);
  auto rms = make_fuse_rmsnorm_pass()->run(g);
  ASSERT_TRUE(rms);
  EXPECT_EQ(rms->count, 0) << rms->found;
  ASSERT_TRUE(DeadCodePass().run(g));
  EXPECT_EQ(count_ops(g, "LayerNormalization"), 1);
  EXPECT_EQ(count_ops(g, "RMSNormalization"), 0);
  EXPECT_EQ(g.node(g.value(g.outputs()[0]).producer).op_type, "LayerNormalization");
}

// The dynamo exporter's additive causal mask: Trilu(Expand(fill, [T, T]), k=1, upper) where the
// fill value -3.4e38 is a scalar *initializer*. It must fold to a constant.
TEST(PassesOnModels, ScalarFloatInitializersFold) {
  Graph g;
  g.opset_imports[""] = 18;
  ValueId x = g.add_input("x", DType::kF32, {4, 4});
  ValueId fill = g.add_initializer("val_128", Tensor::scalar_f32(-3.4028234663852886e+38f));
  ValueId shape = g.add_initializer("val_126", Tensor::from_int64({4, 4}, {2}));
  ValueId k = g.add_initializer("val_129", Tensor::from_int64({1}, {}));
  NodeId e = g.add_node_new_outputs("Expand", {fill, shape}, 1);
  NodeId t = g.add_node_new_outputs("Trilu", {g.node(e).outputs[0], k}, 1, AttrMap{{"upper", Attribute::of_int(1)}});
  NodeId a = g.add_node_new_outputs("Add", {x, g.node(t).outputs[0]}, 1);
  g.add_output(g.node(a).outputs[0]);
  CpuEvaluator ev;
  FoldOptions fo;
  fo.evaluator = &ev;
  auto r = InferShapesPass(fo).run(g);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(count_ops(g, "Trilu"), 0);
  EXPECT_EQ(count_ops(g, "Expand"), 0);
  const Value& mask = g.value(g.node(a).inputs[1]);
  ASSERT_TRUE(mask.is_constant());
  std::vector<double> m = mask.constant.to_double();
  EXPECT_EQ(m[0 * 4 + 0], 0.0);
  EXPECT_LT(m[0 * 4 + 1], -1e30);
  EXPECT_EQ(m[3 * 4 + 2], 0.0);
}

TEST(PassesOnModels, WeightInitializersDoNotFold) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {4, 2});
  ValueId w = g.add_initializer("w", Tensor::from_f32({1, 2, 3, 4, 5, 6}, {3, 2}));
  NodeId t = g.add_node_new_outputs("Transpose", {w}, 1, AttrMap{{"perm", Attribute::of_ints({1, 0})}});
  NodeId m = g.add_node_new_outputs("MatMul", {x, g.node(t).outputs[0]}, 1);
  g.add_output(g.node(m).outputs[0]);
  CpuEvaluator ev;
  FoldOptions fo;
  fo.evaluator = &ev;
  ASSERT_TRUE(InferShapesPass(fo).run(g));
  EXPECT_EQ(count_ops(g, "Transpose"), 1);
}

// LLaMA's repeat_kv before attention: the fused node must read k and v with their 2 kv heads.
TEST(PassesOnModels, AttentionReadsKeysAndValuesBeforeRepeatKv) {
  Graph g;
  g.opset_imports[""] = 17;
  const int64_t B = 1, H = 4, KV = 2, T = 3, D = 2;
  ValueId q = g.add_input("q", DType::kF32, {B, H, T, D});
  ValueId k = g.add_input("k", DType::kF32, {B, KV, T, D});
  ValueId v = g.add_input("v", DType::kF32, {B, KV, T, D});
  auto op = [&](const std::string& type, std::vector<ValueId> ins, AttrMap a = {}) {
    NodeId n = g.add_node_new_outputs(type, ins, 1, std::move(a));
    return g.node(n).outputs[0];
  };
  auto repeat = [&](ValueId x) {
    ValueId u = op("Unsqueeze", {x, g.add_constant("axes", Tensor::from_int64({2}, {1}))});
    ValueId e = op("Expand", {u, g.add_constant("shape5", Tensor::from_int64({B, KV, H / KV, T, D}, {5}))});
    return op("Reshape", {e, g.add_constant("shape4", Tensor::from_int64({B, H, T, D}, {4}))});
  };
  ValueId kt = op("Transpose", {repeat(k)}, AttrMap{{"perm", Attribute::of_ints({0, 1, 3, 2})}});
  ValueId s = op("MatMul", {q, kt});
  s = op("Div", {s, g.add_constant("sqrt_d", Tensor::scalar_f32(1.4142135f))});
  ValueId p = op("Softmax", {s}, AttrMap{{"axis", Attribute::of_int(-1)}});
  ValueId o = op("MatMul", {p, repeat(v)});
  g.add_output(o);
  ASSERT_TRUE(InferShapesPass().run(g));
  auto r = make_fuse_attention_pass()->run(g);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->count, 1) << r->found;
  ASSERT_TRUE(DeadCodePass().run(g));
  const Node& a = g.node(g.value(o).producer);
  ASSERT_EQ(a.op_type, "Attention");
  EXPECT_EQ(a.inputs[1], k);
  EXPECT_EQ(a.inputs[2], v);
  EXPECT_EQ(count_ops(g, "Expand"), 0);
  auto again = InferShapesPass().run(g);
  EXPECT_TRUE(again) << again.status().message();
}

std::vector<Tensor> run_once(const Graph& g, const std::map<std::string, Tensor>& feeds) {
  auto ex = Executor::create(g);
  EXPECT_TRUE(ex) << ex.status().message();
  if (!ex) return {};
  auto out = (*ex)->run(feeds);
  EXPECT_TRUE(out) << out.status().message();
  return out ? *out : std::vector<Tensor>{};
}

// scaled_dot_product_attention as PyTorch's exporters write it: the scale split over q and kᵀ, an
// additive mask, and the guard for rows that see no key, Where(IsNaN(P), 0, P). It fuses, and a
// fully masked row gives 0 as the guard makes it.
TEST(PassesOnModels, AttentionFusesThroughTheNanGuardOfSdpa) {
  Graph g;
  g.opset_imports[""] = 17;
  const int64_t B = 1, H = 2, T = 3, D = 4;
  ValueId q = g.add_input("q", DType::kF32, {B, H, T, D});
  ValueId k = g.add_input("k", DType::kF32, {B, H, T, D});
  ValueId v = g.add_input("v", DType::kF32, {B, H, T, D});
  ValueId mask = g.add_input("mask", DType::kF32, {B, 1, T, T});
  auto op = [&](const std::string& type, std::vector<ValueId> ins, AttrMap a = {}) {
    NodeId n = g.add_node_new_outputs(type, ins, 1, std::move(a));
    return g.node(n).outputs[0];
  };
  ValueId c = g.add_constant("sqrt_scale", Tensor::scalar_f32(0.70710678f));  // (1/sqrt(4))^(1/2)
  ValueId kt = op("Transpose", {k}, AttrMap{{"perm", Attribute::of_ints({0, 1, 3, 2})}});
  ValueId s = op("MatMul", {op("Mul", {q, c}), op("Mul", {kt, c})});
  s = op("Add", {s, mask});
  ValueId p = op("Softmax", {s}, AttrMap{{"axis", Attribute::of_int(-1)}});
  ValueId guarded = op("Where", {op("IsNaN", {p}), g.add_constant("zero", Tensor::scalar_f32(0.f)), p});
  ValueId o = op("MatMul", {guarded, v});
  g.add_output(o);
  ASSERT_TRUE(InferShapesPass().run(g));
  std::vector<float> mv(static_cast<size_t>(T * T), 0.f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < T; ++j) mv[static_cast<size_t>(1 * T + j)] = ninf;  // query row 1 sees no key
  mv[static_cast<size_t>(2 * T + 0)] = ninf;
  std::map<std::string, Tensor> feeds{{"q", Tensor(DType::kF32, {B, H, T, D})},
                                      {"k", Tensor(DType::kF32, {B, H, T, D})},
                                      {"v", Tensor(DType::kF32, {B, H, T, D})},
                                      {"mask", Tensor::from_f32(mv, {B, 1, T, T})}};
  for (auto& [name, t] : feeds) {
    if (name == "mask") continue;
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = std::sin(0.7f * static_cast<float>(i) + name[0]);
  }
  std::vector<Tensor> before = run_once(g, feeds);
  auto r = make_fuse_attention_pass()->run(g);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->count, 1) << r->found;
  ASSERT_TRUE(DeadCodePass().run(g));
  EXPECT_EQ(count_ops(g, "IsNaN"), 0);
  EXPECT_EQ(count_ops(g, "Softmax"), 0);
  const Node& a = g.node(g.value(o).producer);
  ASSERT_EQ(a.op_type, "Attention");
  EXPECT_NEAR(a.attrs.get_float("scale", 0), 0.5, 1e-6);
  std::vector<Tensor> after = run_once(g, feeds);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(after.size(), 1u);
  for (int64_t i = 0; i < before[0].numel(); ++i) {
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-5) << i;
    int64_t row = (i / D) % T;
    if (row == 1) {
      EXPECT_EQ(after[0].data<float>()[i], 0.f) << "a row that sees no key attends to nothing";
    }
  }
}

// Fills every float feed with a smooth non-repeating pattern.
void fill_feeds(std::map<std::string, Tensor>& feeds) {
  for (auto& [name, t] : feeds) {
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = std::sin(0.7f * static_cast<float>(i) + name[0]);
  }
}

// The dynamo exporter writes repeat_kv for kᵀ through a flattened transpose:
// Reshape(Transpose(Reshape(Expand(Unsqueeze(k)), [B·H, T, D]), 0 2 1), [B, H, D, T]). The fused
// op reads k before the repeat, as it does for the TorchScript exporter's form (one rule for both).
TEST(PassesOnModels, AttentionReadsKeysBeforeTheDynamoRepeatOfKTransposed) {
  Graph g;
  g.opset_imports[""] = 18;
  const int64_t B = 2, H = 4, KV = 1, T = 3, D = 2;
  ValueId q = g.add_input("q", DType::kF32, {B, H, T, D});
  ValueId k = g.add_input("k", DType::kF32, {B, KV, T, D});
  ValueId v = g.add_input("v", DType::kF32, {B, KV, T, D});
  auto op = [&](const std::string& type, std::vector<ValueId> ins, AttrMap a = {}) {
    NodeId n = g.add_node_new_outputs(type, ins, 1, std::move(a));
    return g.node(n).outputs[0];
  };
  auto expand = [&](ValueId x) {
    ValueId u = op("Unsqueeze", {x, g.add_constant("axes", Tensor::from_int64({2}, {1}))});
    return op("Expand", {u, g.add_constant("shape5", Tensor::from_int64({B, KV, H / KV, T, D}, {5}))});
  };
  ValueId flat = op("Reshape", {expand(k), g.add_constant("flat", Tensor::from_int64({B * H, T, D}, {3}))});
  ValueId kt = op("Reshape", {op("Transpose", {flat}, AttrMap{{"perm", Attribute::of_ints({0, 2, 1})}}),
                              g.add_constant("kt", Tensor::from_int64({B, H, D, T}, {4}))});
  ValueId vr = op("Reshape", {expand(v), g.add_constant("shape4", Tensor::from_int64({B, H, T, D}, {4}))});
  ValueId s = op("Mul", {op("MatMul", {q, kt}), g.add_constant("scale", Tensor::scalar_f32(0.5f))});
  ValueId o = op("MatMul", {op("Softmax", {s}, AttrMap{{"axis", Attribute::of_int(-1)}}), vr});
  g.add_output(o);
  ASSERT_TRUE(InferShapesPass().run(g));
  std::map<std::string, Tensor> feeds{
      {"q", Tensor(DType::kF32, {B, H, T, D})}, {"k", Tensor(DType::kF32, {B, KV, T, D})}, {"v", Tensor(DType::kF32, {B, KV, T, D})}};
  fill_feeds(feeds);
  std::vector<Tensor> before = run_once(g, feeds);
  auto r = make_fuse_attention_pass()->run(g);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->count, 1) << r->found;
  ASSERT_TRUE(DeadCodePass().run(g));
  const Node& a = g.node(g.value(o).producer);
  ASSERT_EQ(a.op_type, "Attention");
  EXPECT_EQ(a.inputs[1], k);
  EXPECT_EQ(a.inputs[2], v);
  EXPECT_EQ(count_ops(g, "Expand"), 0);
  std::vector<Tensor> after = run_once(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  for (int64_t i = 0; i < before[0].numel(); ++i) EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-6) << i;
}

// Bloom's attention (both exporters): scores on [B·H, T, T] as baddbmm writes them, the ALiBi term
// (per-head slopes [H, 1] times key positions [B, 1, T], flattened to [B·H, 1, T]) added before
// the view to [B, H, T, T] and the additive mask. It fuses into one Attention whose mask input is
// the ALiBi bias viewed by heads plus the mask, with the same outputs.
TEST(PassesOnModels, AlibiAttentionFusesWithItsBiasInTheMask) {
  Graph g;
  g.opset_imports[""] = 17;
  const int64_t B = 2, H = 4, T = 3, D = 2;
  ValueId q = g.add_input("q", DType::kF32, {B, H, T, D});
  ValueId k = g.add_input("k", DType::kF32, {B, H, T, D});
  ValueId v = g.add_input("v", DType::kF32, {B, H, T, D});
  ValueId pos = g.add_input("pos", DType::kF32, {B, 1, T});
  ValueId mask = g.add_input("mask", DType::kF32, {B, 1, T, T});
  auto op = [&](const std::string& type, std::vector<ValueId> ins, AttrMap a = {}) {
    NodeId n = g.add_node_new_outputs(type, ins, 1, std::move(a));
    return g.node(n).outputs[0];
  };
  auto shape = [&](std::vector<int64_t> s) { return g.add_constant("shape", Tensor::from_int64(s, {static_cast<int64_t>(s.size())})); };
  ValueId slopes = g.add_constant("slopes", Tensor::from_f32({0.25f, 0.0625f, 0.015625f, 0.00390625f}, {H, 1}));
  ValueId alibi = op("Reshape", {op("Mul", {slopes, pos}), shape({B * H, 1, T})});
  ValueId q3 = op("Reshape", {q, shape({B * H, T, D})});
  ValueId kt3 = op("Transpose", {op("Reshape", {k, shape({B * H, T, D})})}, AttrMap{{"perm", Attribute::of_ints({0, 2, 1})}});
  ValueId s3 = op("Add", {op("Mul", {op("MatMul", {q3, kt3}), g.add_constant("inv_norm", Tensor::scalar_f32(0.7071068f))}), alibi});
  ValueId s = op("Add", {op("Reshape", {s3, shape({B, H, T, T})}), mask});
  ValueId o = op("MatMul", {op("Softmax", {s}, AttrMap{{"axis", Attribute::of_int(-1)}}), v});
  g.add_output(o);
  ASSERT_TRUE(InferShapesPass().run(g));
  std::map<std::string, Tensor> feeds{{"q", Tensor(DType::kF32, {B, H, T, D})},
                                      {"k", Tensor(DType::kF32, {B, H, T, D})},
                                      {"v", Tensor(DType::kF32, {B, H, T, D})},
                                      {"pos", Tensor::from_f32({0, 1, 2, 0, 0, 1}, {B, 1, T})},
                                      {"mask", Tensor(DType::kF32, {B, 1, T, T})}};
  fill_feeds(feeds);
  feeds["pos"] = Tensor::from_f32({0, 1, 2, 0, 0, 1}, {B, 1, T});
  std::vector<float> mv(static_cast<size_t>(B * T * T), 0.f);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = i + 1; j < T; ++j) mv[static_cast<size_t>((b * T + i) * T + j)] = -3.4e38f;
    }
  }
  feeds["mask"] = Tensor::from_f32(mv, {B, 1, T, T});
  std::vector<Tensor> before = run_once(g, feeds);
  auto r = make_fuse_attention_pass()->run(g);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->count, 1) << r->found;
  EXPECT_NE(r->found.find("1 with ALiBi"), std::string::npos) << r->found;
  ASSERT_TRUE(DeadCodePass().run(g));
  EXPECT_EQ(count_ops(g, "Softmax"), 0);
  const Node& a = g.node(g.value(o).producer);
  ASSERT_EQ(a.op_type, "Attention");
  EXPECT_EQ(a.inputs[0], q);
  EXPECT_EQ(a.inputs[1], k);
  ASSERT_EQ(a.inputs.size(), 4u);
  EXPECT_EQ(g.value(a.inputs[3]).shape, (Shape{B, H, T, T}));
  EXPECT_NEAR(a.attrs.get_float("scale", 0), 0.7071068, 1e-6);
  std::vector<Tensor> after = run_once(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  for (int64_t i = 0; i < before[0].numel(); ++i) EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-6) << i;
}

// Bloom's GELU: 0.5·x · (1 + tanh((√(2/π)·x) · (1 + 0.044715·x·x))), the tanh form regrouped.
TEST(PassesOnModels, BloomGeluFusesAsTheTanhForm) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {2, 5});
  auto op = [&](const std::string& type, std::vector<ValueId> ins) { return g.node(g.add_node_new_outputs(type, ins, 1)).outputs[0]; };
  auto c = [&](float f) { return g.add_constant("c", Tensor::scalar_f32(f)); };
  ValueId half = op("Mul", {x, c(0.5f)});
  ValueId cx = op("Mul", {x, c(0.7978846f)});
  ValueId sq = op("Mul", {op("Mul", {x, c(0.044715f)}), x});
  ValueId t = op("Tanh", {op("Mul", {cx, op("Add", {sq, c(1.f)})})});
  ValueId y = op("Mul", {half, op("Add", {t, c(1.f)})});
  g.add_output(y);
  ASSERT_TRUE(InferShapesPass().run(g));
  std::map<std::string, Tensor> feeds{{"x", Tensor(DType::kF32, {2, 5})}};
  fill_feeds(feeds);
  std::vector<Tensor> before = run_once(g, feeds);
  auto r = make_fuse_gelu_pass()->run(g);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->count, 1) << r->found;
  ASSERT_TRUE(DeadCodePass().run(g));
  EXPECT_EQ(count_ops(g, "Tanh"), 0);
  EXPECT_EQ(count_ops(g, "Gelu"), 1);
  std::vector<Tensor> after = run_once(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  for (int64_t i = 0; i < before[0].numel(); ++i) EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-6) << i;
}

// Hugging Face's padding-mask look-up as the TorchScript exporter traces it:
// Gather(Flatten(mask [B, T]), b·T + j) becomes a per-row Gather(mask, j, axis 1); a look-up that
// reads other rows stays as it is.
TEST(PassesOnModels, FlatBatchLookUpBecomesPerRow) {
  for (bool per_row : {true, false}) {
    SCOPED_TRACE(per_row);
    Graph g;
    g.opset_imports[""] = 17;
    const int64_t B = 2, T = 3;
    ValueId x = g.add_input("x", DType::kI64, {B, T});
    NodeId fl = g.add_node_new_outputs("Flatten", {x}, 1, AttrMap{{"axis", Attribute::of_int(2)}});
    std::vector<int64_t> idx{2, 0, 1, 5, 3, 4};  // b·3 + {2, 0, 1}
    if (!per_row) idx = {2, 0, 1, 2, 0, 1};      // row 1 reads row 0
    ValueId I = g.add_constant("idx", Tensor::from_int64(idx, {B, 1, T}));
    NodeId ga = g.add_node_new_outputs("Gather", {g.node(fl).outputs[0], I}, 1, AttrMap{{"axis", Attribute::of_int(0)}});
    ValueId y = g.node(ga).outputs[0];
    g.add_output(y);
    ASSERT_TRUE(InferShapesPass().run(g));
    ASSERT_EQ(g.value(y).shape, (Shape{B, 1, T, 1}));
    std::map<std::string, Tensor> feeds{{"x", Tensor::from_int64({10, 11, 12, 20, 21, 22}, {B, T})}};
    std::vector<Tensor> before = run_once(g, feeds);
    auto r = make_batch_gather_pass()->run(g);
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_EQ(r->count, per_row ? 1 : 0) << r->found;
    ASSERT_TRUE(DeadCodePass().run(g));
    EXPECT_EQ(count_ops(g, "Flatten"), per_row ? 0 : 1);
    ASSERT_TRUE(InferShapesPass().run(g));
    EXPECT_EQ(g.value(y).shape, (Shape{B, 1, T, 1}));
    std::vector<Tensor> after = run_once(g, feeds);
    ASSERT_EQ(after.size(), 1u);
    std::vector<int64_t> want = per_row ? std::vector<int64_t>{12, 10, 11, 22, 20, 21} : std::vector<int64_t>{12, 10, 11, 12, 10, 11};
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(after[0].data<int64_t>()[i], want[static_cast<size_t>(i)]) << i;
      EXPECT_EQ(after[0].data<int64_t>()[i], before[0].data<int64_t>()[i]) << i;
    }
  }
}

// A tied head the exporter folded into its own initializer (an exporter-named copy of Eᵀ) is read
// through Transpose(E) again, so training sums both uses into E; a copy that differs in one element,
// or a tensor of one repeated value, is left alone.
TEST(PassesOnModels, RetiesAFoldedTransposedCopyOfTheEmbedding) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    Graph g;
    g.opset_imports[""] = 17;
    const int64_t V = 5, H = 3;
    std::vector<float> e(static_cast<size_t>(V * H)), et(static_cast<size_t>(V * H));
    for (int64_t i = 0; i < V * H; ++i) e[static_cast<size_t>(i)] = variant == 2 ? 1.f : 0.1f * static_cast<float>(i) - 0.4f;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t h = 0; h < H; ++h) et[static_cast<size_t>(h * V + v)] = e[static_cast<size_t>(v * H + h)];
    }
    if (variant == 1) et[4] += 1e-3f;
    ValueId ids = g.add_input("ids", DType::kI64, {2});
    ValueId E = g.add_initializer("wte.weight", Tensor::from_f32(e, {V, H}));
    ValueId C = g.add_initializer("onnx::MatMul_7", Tensor::from_f32(et, {H, V}));
    NodeId ga = g.add_node_new_outputs("Gather", {E, ids}, 1);
    NodeId mm = g.add_node_new_outputs("MatMul", {g.node(ga).outputs[0], C}, 1);
    ValueId logits = g.node(mm).outputs[0];
    g.add_output(logits);
    auto r = make_retie_pass()->run(g);
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_EQ(r->count, variant == 0 ? 1 : 0) << r->found;
    ValueId head = g.node(mm).inputs[1];
    if (variant == 0) {
      NodeId t = g.value(head).producer;
      ASSERT_NE(t, kNoId);
      EXPECT_EQ(g.node(t).op_type, "Transpose");
      EXPECT_EQ(g.node(t).inputs[0], E);
      EXPECT_EQ(std::count(g.initializers().begin(), g.initializers().end(), C), 0);
      ASSERT_TRUE(InferShapesPass().run(g));
      std::vector<Tensor> out = run_once(g, {{"ids", Tensor::from_int64({3, 1}, {2})}});
      ASSERT_EQ(out.size(), 1u);
      for (int64_t v = 0; v < V; ++v) {  // logits[0, v] = E[3] · E[v]
        float want = 0;
        for (int64_t h = 0; h < H; ++h) want += e[static_cast<size_t>(3 * H + h)] * e[static_cast<size_t>(v * H + h)];
        EXPECT_NEAR(out[0].data<float>()[v], want, 1e-6);
      }
    } else {
      EXPECT_EQ(head, C);
    }
  }
}

}  // namespace
}  // namespace oases
