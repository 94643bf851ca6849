// Micro-batch chunking (planner/chunking.h) on a tiny forward graph with a loss: every node that
// reads the batch is repeated per chunk on half the rows, the weights stay shared, and the chunked
// graph computes the same loss as the whole batch.
#include <cmath>

#include <gtest/gtest.h>

#include "executor/executor.h"
#include "graph/graph.h"
#include "planner/chunking.h"

namespace oases {
namespace {

// loss = mean((x [4, 8] · w [8, 3])²), a scalar
Graph squared_loss_graph() {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {4, 8});
  std::vector<float> w(24);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(i) - 0.4f;
  ValueId wv = g.add_initializer("w", Tensor::from_f32(w, {8, 3}));
  ValueId y = g.add_value("y", DType::kF32, {4, 3}, true);
  ValueId sq = g.add_value("sq", DType::kF32, {4, 3}, true);
  ValueId loss = g.add_value("loss", DType::kF32, {}, true);
  g.add_node("MatMul", {x, wv}, {y}, {}, "mm");
  g.add_node("Mul", {y, y}, {sq}, {}, "square");
  AttrMap keep;
  keep.set_int("keepdims", 0);
  // axes named, the canonical form shape inference writes (this graph is built without inference)
  keep.set_ints("axes", {0, 1});
  g.add_node("ReduceMean", {sq}, {loss}, keep, "mean");
  g.add_output(loss);
  return g;
}

Tensor batch() {
  std::vector<float> v(32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7f * static_cast<float>(i)) + 0.1f * static_cast<float>(i % 5);
  return Tensor::from_f32(v, {4, 8});
}

float run_loss(const Graph& g) {
  auto ex = Executor::create(g);
  EXPECT_TRUE(ex) << ex.status().message();
  if (!ex) return NAN;
  auto outs = (*ex)->run({{"x", batch()}});
  EXPECT_TRUE(outs) << outs.status().message();
  if (!outs) return NAN;
  EXPECT_EQ((*outs)[0].numel(), 1);
  return (*outs)[0].data<float>()[0];
}

TEST(PlannerChunking, TwoChunksHalveTheBatchAndShareTheWeights) {
  Graph g = squared_loss_graph();
  auto c = chunk_batch(g, 2);
  ASSERT_TRUE(c) << c.status().message();
  int matmuls = 0;
  std::set<int> chunks;
  ValueId w = c->find_value("w");
  ASSERT_NE(w, kNoId);
  for (NodeId id : c->nodes()) {
    const Node& n = c->node(id);
    if (n.op_type != "MatMul") continue;
    ++matmuls;
    chunks.insert(n.chunk);
    EXPECT_EQ(c->value(n.inputs[0]).shape, (Shape{2, 8})) << n.name;  // half the batch
    EXPECT_EQ(n.inputs[1], w) << n.name << " reads a copy of the weight";
    EXPECT_EQ(c->value(n.outputs[0]).shape, (Shape{2, 3})) << n.name;
  }
  EXPECT_EQ(matmuls, 2);
  EXPECT_EQ(chunks, (std::set<int>{0, 1}));
  // the graph's interface is unchanged: the whole batch in, one scalar loss out
  EXPECT_EQ(c->value(c->find_value("x")).shape, (Shape{4, 8}));
  ASSERT_EQ(c->outputs().size(), 1u);
  EXPECT_TRUE(c->value(c->outputs()[0]).shape.empty());
}

TEST(PlannerChunking, ChunkedLossEqualsTheWholeBatchLoss) {
  Graph g = squared_loss_graph();
  auto c = chunk_batch(g, 2);
  ASSERT_TRUE(c) << c.status().message();
  float whole = run_loss(g);
  float chunked = run_loss(*c);
  ASSERT_TRUE(std::isfinite(whole));
  ASSERT_GT(whole, 0.0f);
  // the same products summed in another order: equal up to float rounding of 12 terms
  EXPECT_NEAR(chunked, whole, 4e-7f * whole);
}

TEST(PlannerChunking, OneChunkIsTheIdentityAndAnIndivisibleBatchNamesTheInput) {
  Graph g = squared_loss_graph();
  auto one = chunk_batch(g, 1);
  ASSERT_TRUE(one) << one.status().message();
  EXPECT_EQ(one->num_nodes(), g.num_nodes());
  auto three = chunk_batch(g, 3);
  ASSERT_FALSE(three);
  EXPECT_NE(three.status().message().find("'x'"), std::string::npos) << three.status().message();
}

}  // namespace
}  // namespace oases
