#include <gtest/gtest.h>

#include "graph/graph.h"
#include "graph/op_registry.h"

namespace oases {
namespace {

TEST(Graph, NodeIdsStayValidAcrossEdits) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {2, 3});
  NodeId a = g.add_node_new_outputs("Relu", {x}, 1);
  ValueId ya = g.node(a).outputs[0];
  NodeId b = g.add_node_new_outputs("Neg", {ya}, 1);
  NodeId c = g.add_node_new_outputs("Exp", {g.node(b).outputs[0]}, 1);
  g.add_output(g.node(c).outputs[0]);
  g.remove_node(b);
  EXPECT_TRUE(g.alive(a));
  EXPECT_FALSE(g.alive(b));
  EXPECT_TRUE(g.alive(c));
  EXPECT_EQ(g.node(c).op_type, "Exp");
  // rewire c to read a directly; the edge a -> c must appear
  g.set_input(c, 0, ya);
  EXPECT_EQ(g.predecessors(c), std::vector<NodeId>{a});
  EXPECT_TRUE(g.validate().is_ok()) << g.validate().message();
  auto order = g.topo_order();
  ASSERT_TRUE(order);
  EXPECT_EQ(*order, (std::vector<NodeId>{a, c}));
}

TEST(Graph, CycleIsReportedWithANode) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {2});
  ValueId p = g.add_value("p"), q = g.add_value("q");
  g.add_node("Add", {x, q}, {p}, {}, "first");
  g.add_node("Neg", {p}, {q}, {}, "second");
  auto order = g.topo_order();
  ASSERT_FALSE(order);
  EXPECT_NE(order.status().message().find("cycle"), std::string::npos);
}

TEST(Graph, CopyRebuildsEdges) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {2});
  NodeId a = g.add_node_new_outputs("Relu", {x}, 1);
  NodeId b = g.add_node_new_outputs("Neg", {g.node(a).outputs[0]}, 1);
  Graph h = g;
  EXPECT_EQ(h.successors(a), std::vector<NodeId>{b});
  h.remove_node(b);
  EXPECT_TRUE(g.alive(b));
  EXPECT_EQ(g.successors(a), std::vector<NodeId>{b});
}

TEST(OpRegistry, HasTheFoundationOps) {
  const char* ops[] = {"Add",        "Sub",
                       "Mul",        "Div",
                       "Pow",        "Sqrt",
                       "Reciprocal", "Neg",
                       "Exp",        "Log",
                       "Erf",        "Tanh",
                       "Sigmoid",    "Relu",
                       "Gelu",       "Softmax",
                       "LogSoftmax", "LayerNormalization",
                       "MatMul",     "Gemm",
                       "ReduceMean", "ReduceSum",
                       "ReduceMax",  "Reshape",
                       "Transpose",  "Gather",
                       "Concat",     "Split",
                       "Slice",      "Unsqueeze",
                       "Squeeze",    "Where",
                       "Cast",       "Expand",
                       "Shape",      "ConstantOfShape",
                       "Range",      "Equal",
                       "Less",       "Greater",
                       "Not",        "Trilu",
                       "Identity",   "Constant",
                       "Dropout",    "SoftmaxCrossEntropyLoss",
                       "Sin",        "Cos",
                       "CumSum",     "Min",
                       "Max",        "Clip"};
  for (const char* op : ops) EXPECT_NE(OpRegistry::global().find("", op), nullptr) << op;
}

}  // namespace
}  // namespace oases
