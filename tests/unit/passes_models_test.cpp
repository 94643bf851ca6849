// Pass behaviour found on exported models (models/small): fusions must not misfire on each other's
// leftovers, and scalar constants stored as initializers (dynamo exporter) fold like Constants.
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

}  // namespace
}  // namespace oases
