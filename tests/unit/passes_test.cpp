// Import-time passes: constant folding of shape arithmetic (Shape→Gather→Unsqueeze→Concat→Reshape
// chains as exporters write them), dead-code elimination; each checked on the graph and by
// running the model before and after.
#include <gtest/gtest.h>

#include "graph/passes/pass.h"
#include "tests/unit/onnx_test_util.h"

namespace oases {
namespace {

using namespace testutil;
using onnx::TensorProto;

int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.nodes()) n += g.node(id).op_type == op;
  return n;
}

// y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [2, -1]))
// for x[B, T, 8]: the [B, T, H, D] split of heads as PyTorch exports it.
ModelBuilder shape_chain_model(int opset, std::vector<Dim> x_dims = {2, 3, 8}) {
  ModelBuilder b(opset, 8);
  b.input("x", TensorProto::FLOAT, x_dims);
  b.init_i64("idx0", {}, {0});
  b.init_i64("idx1", {}, {1});
  b.init_i64("zero_axis", {1}, {0});
  b.init_i64("heads", {2}, {2, -1});
  b.node("Shape", {"x"}, {"shape"}, "shape");
  b.node("Gather", {"shape", "idx0"}, {"b"}, "gather_b", {attr_int("axis", 0)});
  b.node("Gather", {"shape", "idx1"}, {"t"}, "gather_t", {attr_int("axis", 0)});
  b.node("Unsqueeze", {"b", "zero_axis"}, {"b1"}, "unsqueeze_b");
  b.node("Unsqueeze", {"t", "zero_axis"}, {"t1"}, "unsqueeze_t");
  b.node("Concat", {"b1", "t1", "heads"}, {"target"}, "concat", {attr_int("axis", 0)});
  b.node("Reshape", {"x", "target"}, {"y"}, "reshape");
  b.output("y");
  return b;
}

TEST(ConstantFolding, ShapeGatherUnsqueezeConcatReshapeFoldsToAConstantReshape) {
  for (int opset : {13, 17, 21}) {
    SCOPED_TRACE(opset);
    TempDir d;
    auto m = load_built(shape_chain_model(opset), d);
    ASSERT_TRUE(m) << m.status().message();
    const Graph& g = m->graph;
    ASSERT_EQ(g.num_nodes(), 1u) << graph_signature(g);
    const Node& r = g.node(g.nodes()[0]);
    EXPECT_EQ(r.op_type, "Reshape");
    EXPECT_EQ(r.num_inputs(), 1);  // the shape operand became the attribute
    EXPECT_EQ(r.attrs.get_ints("shape"), (std::vector<int64_t>{2, 3, 2, 4}));
    EXPECT_EQ(g.value(g.outputs()[0]).shape, (Shape{2, 3, 2, 4}));
    EXPECT_TRUE(g.initializers().empty());  // idx0, idx1, zero_axis, heads are gone
    for (const char* op : {"Shape", "Gather", "Unsqueeze", "Concat"}) EXPECT_EQ(count_op(g, op), 0) << op;

    Tensor x = ramp({2, 3, 8});
    auto out = run_graph(g, {{"x", x}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape(), (Shape{2, 3, 2, 4}));
    EXPECT_EQ(to_floats(out[0]), to_floats(x));
  }
}

TEST(ConstantFolding, TheChainFollowsBoundSymbolicDims) {
  TempDir d;
  ImportOptions opts;
  ASSERT_TRUE(parse_dim_binding("B=4", &opts).is_ok());
  ASSERT_TRUE(parse_dim_binding("T=5", &opts).is_ok());
  auto m = load_built(shape_chain_model(17, {"B", "T", 8}), d, opts);
  ASSERT_TRUE(m) << m.status().message();
  ASSERT_EQ(m->graph.num_nodes(), 1u);
  EXPECT_EQ(m->graph.node(m->graph.nodes()[0]).attrs.get_ints("shape"), (std::vector<int64_t>{4, 5, 2, 4}));
}

TEST(ConstantFolding, FoldingKeepsParametersAndGraphOutputs) {
  // A float initializer through Transpose stays a parameter (not folded into a new constant).
  TempDir d;
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 3});
  b.init_f32("w", {2, 3}, {1, 2, 3, 4, 5, 6});
  b.node("Transpose", {"w"}, {"wt"}, "transpose_w");
  b.node("MatMul", {"x", "wt"}, {"y"}, "mm");
  b.output("y");
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(count_op(m->graph, "Transpose"), 1);
  ASSERT_EQ(m->graph.initializers().size(), 1u);
  EXPECT_EQ(m->graph.value(m->graph.initializers()[0]).name, "w");
}

TEST(DeadCode, RemovesDeadNodesAndUnusedInitializers) {
  TempDir d;
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 3});
  b.init_f32("used_w", {2, 3}, {1, 2, 3, 4, 5, 6});
  b.init_f32("dead_w", {2, 3}, {1, 1, 1, 1, 1, 1});
  b.init_f32("never_read", {4}, {0, 0, 0, 0});
  b.node("Add", {"x", "used_w"}, {"y"}, "live_add");
  b.node("Mul", {"x", "dead_w"}, {"d1"}, "dead_mul");
  b.node("Exp", {"d1"}, {"d2"}, "dead_exp");
  b.node("Relu", {"y"}, {"d3"}, "dead_relu_of_live");
  b.output("y");
  auto raw = import_built(b, d);
  ASSERT_TRUE(raw) << raw.status().message();
  Graph g = *raw;
  auto rep = DeadCodePass().run(g);
  ASSERT_TRUE(rep) << rep.status().message();
  EXPECT_TRUE(rep->changed);
  EXPECT_EQ(rep->count, 5);  // 3 nodes, 2 initializers
  ASSERT_EQ(g.num_nodes(), 1u);
  EXPECT_EQ(g.node(g.nodes()[0]).name, "live_add");
  std::vector<std::string> inits;
  for (ValueId v : g.initializers()) inits.push_back(g.value(v).name);
  EXPECT_EQ(inits, std::vector<std::string>{"used_w"});
  EXPECT_FALSE(g.value(g.find_value("dead_w")).is_constant());
  EXPECT_TRUE(g.validate().is_ok()) << g.validate().message();
  // nothing left to remove: an unchanged report, not an error
  auto again = DeadCodePass().run(g);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->changed);
  // the pipeline gives the same result and the model still computes x + w
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->graph.num_nodes(), 1u);
  EXPECT_EQ(m->graph.initializers().size(), 1u);
  auto out = run_graph(m->graph, {{"x", Tensor::from_f32({0, 0, 0, 1, 1, 1}, {2, 3})}});
  ASSERT_EQ(out.size(), 1u);
  expect_near(to_floats(out[0]), {1, 2, 3, 5, 6, 7});
}

TEST(DeadCode, GraphOutputsThatAreInitializersStay) {
  TempDir d;
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2});
  b.init_f32("w", {2}, {1, 2});
  b.node("Neg", {"x"}, {"y"}, "neg");
  b.output("y").output("w");
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->graph.initializers().size(), 1u);
  auto out = run_graph(m->graph, {{"x", Tensor::from_f32({3, 4}, {2})}});
  ASSERT_EQ(out.size(), 2u);
  expect_near(to_floats(out[0]), {-3, -4});
  expect_near(to_floats(out[1]), {1, 2});
}

}  // namespace
}  // namespace oases
