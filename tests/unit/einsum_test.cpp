// Einsum beyond the ONNX node tests: ellipses of different ranks with broadcasting, the
// batched-GEMM path with transposes on both sides and on the output, implicit outputs, a trace.
// Each case is checked against plain loops written out for it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "executor/executor.h"
#include "graph/passes/pass.h"

namespace oases {
namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  Tensor t(DType::kF32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = dist(gen);
  return t;
}

struct EinsumRun {
  Shape out_shape;
  std::string canonical;
  Tensor out;
};

EinsumRun run_einsum(const std::string& equation, const std::vector<Tensor>& ins) {
  Graph g;
  g.opset_imports[""] = 17;
  std::vector<ValueId> vs;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    vs.push_back(g.add_input(name, ins[i].dtype(), ins[i].shape()));
    feeds[name] = ins[i];
  }
  AttrMap attrs;
  attrs.set_string("equation", equation);
  NodeId n = g.add_node_new_outputs("Einsum", vs, 1, attrs, "einsum");
  g.add_output(g.node(n).outputs[0]);
  CpuEvaluator ev;
  FoldOptions fold;
  fold.evaluator = &ev;
  auto rep = run_canonical_passes(g, fold);
  EXPECT_TRUE(rep) << rep.status().message();
  EinsumRun r;
  r.out_shape = g.value(g.outputs()[0]).shape;
  r.canonical = g.node(g.producer(g.outputs()[0])).attrs.get_string("equation", "");
  auto ex = Executor::create(g);
  EXPECT_TRUE(ex) << ex.status().message();
  auto outs = (*ex)->run(feeds);
  EXPECT_TRUE(outs) << outs.status().message();
  r.out = (*outs)[0];
  return r;
}

// Compares every element with ref(multi-index of the output).
void expect_matches(const EinsumRun& r, const std::function<double(const std::vector<int64_t>&)>& ref) {
  const Shape& s = r.out_shape;
  for (int64_t i = 0; i < r.out.numel(); ++i) {
    std::vector<int64_t> idx(s.size());
    int64_t rem = i;
    for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
      idx[d] = rem % s[d];
      rem /= s[d];
    }
    double want = ref(idx);
    ASSERT_NEAR(r.out.data<float>()[i], want, 1e-5 + 1e-5 * std::abs(want)) << "element " << i;
  }
}

float at(const Tensor& t, const std::vector<int64_t>& idx) {
  std::vector<int64_t> st = contiguous_strides(t.shape());
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += (t.shape()[d] == 1 ? 0 : idx[d]) * st[d];
  return t.data<float>()[off];
}

TEST(Einsum, EllipsisOfDifferentRanksBroadcasts) {
  Tensor a = random_tensor({2, 3, 4, 5}, 1), b = random_tensor({3, 6, 5}, 2);
  EinsumRun r = run_einsum("...ij,...kj->...ik", {a, b});
  EXPECT_EQ(r.out_shape, (Shape{2, 3, 4, 6}));
  expect_matches(r, [&](const std::vector<int64_t>& o) {
    double s = 0;
    for (int64_t j = 0; j < 5; ++j) s += at(a, {o[0], o[1], o[2], j}) * at(b, {o[1], o[3], j});
    return s;
  });
}

TEST(Einsum, SizeOneEllipsisDimBroadcasts) {
  Tensor a = random_tensor({2, 1, 4, 5}, 3), b = random_tensor({3, 6, 5}, 4);
  EinsumRun r = run_einsum("...ij,...kj->...ik", {a, b});
  EXPECT_EQ(r.out_shape, (Shape{2, 3, 4, 6}));
  expect_matches(r, [&](const std::vector<int64_t>& o) {
    double s = 0;
    for (int64_t j = 0; j < 5; ++j) s += at(a, {o[0], 0, o[2], j}) * at(b, {o[1], o[3], j});
    return s;
  });
}

TEST(Einsum, AttentionScoresWithPermutedOutput) {
  Tensor q = random_tensor({2, 3, 4, 8}, 5), k = random_tensor({2, 5, 4, 8}, 6);
  EinsumRun r = run_einsum("bqhd,bkhd->bhqk", {q, k});
  EXPECT_EQ(r.out_shape, (Shape{2, 4, 3, 5}));
  expect_matches(r, [&](const std::vector<int64_t>& o) {
    double s = 0;
    for (int64_t d = 0; d < 8; ++d) s += at(q, {o[0], o[2], o[1], d}) * at(k, {o[0], o[3], o[1], d});
    return s;
  });
}

TEST(Einsum, ImplicitOutputIsSortedSingleLabels) {
  Tensor a = random_tensor({3, 4}, 7), b = random_tensor({4, 5}, 8);
  EinsumRun r = run_einsum("kj, ji", {a, b});
  EXPECT_EQ(r.canonical, "kj,ji->ik");
  EXPECT_EQ(r.out_shape, (Shape{5, 3}));
  expect_matches(r, [&](const std::vector<int64_t>& o) {
    double s = 0;
    for (int64_t j = 0; j < 4; ++j) s += at(a, {o[1], j}) * at(b, {j, o[0]});
    return s;
  });
}

TEST(Einsum, TraceAndLabelsSummedInOneOperand) {
  Tensor a = random_tensor({4, 4}, 9);
  EinsumRun r = run_einsum("ii->", {a});
  EXPECT_EQ(r.out_shape, Shape{});
  expect_matches(r, [&](const std::vector<int64_t>&) {
    double s = 0;
    for (int64_t i = 0; i < 4; ++i) s += at(a, {i, i});
    return s;
  });
  Tensor x = random_tensor({2, 3}, 10), y = random_tensor({3, 4}, 11);
  EinsumRun r2 = run_einsum("ij,jk->k", {x, y});
  expect_matches(r2, [&](const std::vector<int64_t>& o) {
    double s = 0;
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < 3; ++j) s += at(x, {i, j}) * at(y, {j, o[0]});
    }
    return s;
  });
}

TEST(Einsum, BadEquationsNameTheNode) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId a = g.add_input("a", DType::kF32, {2, 3});
  ValueId b = g.add_input("b", DType::kF32, {4, 5});
  AttrMap attrs;
  attrs.set_string("equation", "ij,jk->ik");
  NodeId n = g.add_node_new_outputs("Einsum", {a, b}, 1, attrs, "mm");
  g.add_output(g.node(n).outputs[0]);
  auto rep = run_canonical_passes(g, FoldOptions{});
  ASSERT_FALSE(rep);
  EXPECT_NE(rep.status().message().find("node 'mm'"), std::string::npos) << rep.status().message();
  EXPECT_NE(rep.status().message().find("label 'j'"), std::string::npos) << rep.status().message();
}

}  // namespace
}  // namespace oases
