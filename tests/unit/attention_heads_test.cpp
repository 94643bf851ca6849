// Attention under tensor parallelism when tp exceeds the key/value heads (multi-query and
// grouped-query attention, Megatron's rule): the K/V projections stay whole on every rank, each
// rank's query heads read the K/V head they use, and the gradients of the replicated K/V weights,
// summed over the tp group, equal the single-rank ones; ALiBi's per-head slopes split with the
// heads. Also: the rule's errors name the heads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "executor/communicator.h"
#include "executor/distributed.h"
#include "executor/executor.h"
#include "graph/autodiff.h"
#include "graph/passes/pass.h"
#include "planner/strategy.h"
#include "tests/common/tensor_compare.h"

namespace oases {
namespace {

constexpr int64_t kB = 2, kT = 4, kC = 8, kD = 2;

Tensor random_tensor(const Shape& s, std::mt19937& rng) {
  Tensor t(DType::kF32, s);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = u(rng);
  return t;
}

Tensor int_tensor(const std::vector<int64_t>& v) {
  Tensor t(DType::kI64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.mutable_data<int64_t>()[i] = v[i];
  return t;
}

struct AttentionModel {
  Graph g;
  std::vector<ValueId> params;  // wq, wk, wv, wo
  Strategy strategy;
  std::map<std::string, Tensor> feeds;  // the key positions of the ALiBi bias
};

// x [B, T, C] → q, k, v projections (H and Hkv heads of D) → causal attention → output projection
// → loss Σ y ∘ R; the training graph's outputs: loss, then the gradients of wq, wk, wv, wo.
// With `alibi`, the attention's additive mask is Bloom's bias, per-head slopes [H, 1] times key
// positions [1, T], viewed as [1, H, 1, T] (the form fuse-attention gives it).
Expected<AttentionModel> build(int64_t heads, int64_t kv_heads, int64_t tp, bool alibi = false) {
  AttentionModel m;
  Graph& g = m.g;
  g.opset_imports[""] = 18;
  std::mt19937 rng(5);
  ValueId x = g.add_constant("x", random_tensor({kB, kT, kC}, rng));
  auto proj = [&](const std::string& name, int64_t h) {
    ValueId w = g.add_initializer(name, random_tensor({kC, h * kD}, rng));
    m.params.push_back(w);
    ValueId y = g.node(g.add_node_new_outputs("MatMul", {x, w}, 1)).outputs[0];
    ValueId r = g.node(g.add_node_new_outputs("Reshape", {y, g.add_constant("shape", int_tensor({kB, kT, h, kD}))}, 1)).outputs[0];
    return g.node(g.add_node_new_outputs("Transpose", {r}, 1, AttrMap{{"perm", Attribute::of_ints({0, 2, 1, 3})}})).outputs[0];
  };
  ValueId q = proj("wq", heads), k = proj("wk", kv_heads), v = proj("wv", kv_heads);
  std::vector<ValueId> ins{q, k, v};
  if (alibi) {
    // the positions are an input (as Bloom computes them from the attention mask), so the bias
    // does not fold into one constant
    Tensor slopes(DType::kF32, {heads, 1}), pos(DType::kF32, {1, kT});
    for (int64_t h = 0; h < heads; ++h) slopes.mutable_data<float>()[h] = std::pow(2.f, -static_cast<float>(h + 1));
    for (int64_t t = 0; t < kT; ++t) pos.mutable_data<float>()[t] = static_cast<float>(t);
    m.feeds["pos"] = pos;
    ValueId b =
        g.node(g.add_node_new_outputs("Mul", {g.add_constant("slopes", slopes), g.add_input("pos", DType::kF32, {1, kT})}, 1)).outputs[0];
    ins.push_back(g.node(g.add_node_new_outputs("Reshape", {b, g.add_constant("shape", int_tensor({1, heads, 1, kT}))}, 1)).outputs[0]);
  }
  ValueId o =
      g.node(g.add_node_new_outputs("Attention", ins, 1, AttrMap{{"causal", Attribute::of_int(1)}}, "attn", kOasesDomain)).outputs[0];
  ValueId ot = g.node(g.add_node_new_outputs("Transpose", {o}, 1, AttrMap{{"perm", Attribute::of_ints({0, 2, 1, 3})}})).outputs[0];
  ValueId of = g.node(g.add_node_new_outputs("Reshape", {ot, g.add_constant("shape", int_tensor({kB, kT, heads * kD}))}, 1)).outputs[0];
  ValueId wo = g.add_initializer("wo", random_tensor({heads * kD, kC}, rng));
  m.params.push_back(wo);
  ValueId y = g.node(g.add_node_new_outputs("MatMul", {of, wo}, 1)).outputs[0];
  ValueId yr = g.node(g.add_node_new_outputs("Mul", {y, g.add_constant("r", random_tensor({kB, kT, kC}, rng))}, 1)).outputs[0];
  ValueId loss = g.node(g.add_node_new_outputs("ReduceSum", {yr}, 1,
                                               AttrMap{{"axes", Attribute::of_ints({0, 1, 2})}, {"keepdims", Attribute::of_int(0)}}))
                     .outputs[0];
  g.set_outputs({loss});
  InferShapesPass infer;
  OASES_RETURN_IF_ERROR(infer.run(g).status());
  StrategyOptions so;
  so.tp = tp;
  OASES_ASSIGN_OR_RETURN(m.strategy, megatron_strategy(g, so));  // on the forward graph
  OASES_ASSIGN_OR_RETURN(BackwardResult bw, build_backward(g, loss, m.params));
  std::vector<ValueId> outs{loss};
  for (ValueId p : m.params) outs.push_back(bw.grads.at(p));
  g.set_outputs(outs);
  OASES_RETURN_IF_ERROR(infer.run(g).status());
  return m;
}

// The loss and the gathered (whole) gradients of a tp-rank run, as rank 0 sees them.
Expected<std::vector<Tensor>> run_tp(const AttentionModel& m, int tp) {
  OASES_ASSIGN_OR_RETURN(PartitionedGraph pg, partition_training(m.g, m.params, m.strategy));
  auto world = make_local_world(tp, 60);
  std::vector<Expected<std::vector<Tensor>>> res(static_cast<size_t>(tp), Status::error("not run"));
  std::vector<std::thread> ts;
  for (int r = 0; r < tp; ++r) {
    ts.emplace_back([&, r] {
      auto comm = local_communicator(world, r);
      auto rt = RankRuntime::create(comm.get(), pg.mesh);
      if (!rt) {
        res[r] = rt.status();
        comm->abort(rt.status().message());
        return;
      }
      ExecOptions o;
      o.groups = (*rt)->axis_groups();
      try {
        auto ex = Executor::create(local_graph_for_rank(pg, r), o);
        if (!ex) throw std::runtime_error(ex.status().message());
        auto run = (*ex)->run(m.feeds);
        if (!run) throw std::runtime_error(run.status().message());
        const std::vector<Tensor>& outs = *run;
        std::vector<Tensor> whole{outs[0]};
        for (size_t k = 0; k < m.params.size(); ++k) {
          ValueId gv = pg.local.outputs()[k + 1];
          whole.push_back((*rt)->gather(outs[k + 1], pg.specs[gv], m.g.value(m.params[k]).shape));
        }
        res[r] = std::move(whole);
      } catch (const std::exception& e) {
        comm->abort(e.what());
        res[r] = Status::error(e.what());
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < tp; ++r) {
    if (!res[r]) return error("rank {}: {}", r, res[r].status().message());
  }
  return std::move(res[0]);
}

struct Case {
  int64_t heads, kv_heads, tp;
  bool alibi = false;
};

class AttentionHeadsUnderTp : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionHeadsUnderTp, GatheredGradientsEqualTheSingleRankOnes) {
  const Case c = GetParam();
  auto m = build(c.heads, c.kv_heads, c.tp, c.alibi);
  ASSERT_TRUE(m) << m.status().message();
  if (c.alibi) {
    // the ALiBi slopes [H, 1] split by heads: rank r holds the slopes of its heads
    ValueId slopes = kNoId;
    for (size_t v = 0; v < m->g.num_values(); ++v) {
      if (m->g.value(static_cast<ValueId>(v)).name.rfind("slopes", 0) == 0) slopes = static_cast<ValueId>(v);
    }
    ASSERT_NE(slopes, kNoId);
    auto it = m->strategy.specs.find(slopes);
    ASSERT_NE(it, m->strategy.specs.end());
    EXPECT_EQ(it->second.dims[0].axis, m->strategy.mesh.axis("tp"));
  }
  // K/V projections whole on every rank exactly when tp exceeds the key/value heads
  for (size_t i = 1; i < 3; ++i) {
    auto it = m->strategy.specs.find(m->params[i]);
    bool split = it != m->strategy.specs.end() && !it->second.is_replicated();
    EXPECT_EQ(split, c.kv_heads % c.tp == 0) << m->g.value(m->params[i]).name;
  }
  auto ex = Executor::create(m->g);
  ASSERT_TRUE(ex) << ex.status().message();
  auto run = (*ex)->run(m->feeds);
  ASSERT_TRUE(run) << run.status().message();
  const std::vector<Tensor>& want = *run;
  auto got = run_tp(*m, static_cast<int>(c.tp));
  ASSERT_TRUE(got) << got.status().message();
  ASSERT_EQ(got->size(), want.size());
  const char* names[] = {"loss", "wq", "wk", "wv", "wo"};
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ((*got)[k].shape(), want[k].shape()) << names[k];
    // float32 sums in another order (the all-reduces of partial sums): 1e-5 of the largest element
    EXPECT_LE(test::max_rel_diff((*got)[k], want[k]), 1e-5) << names[k];
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, AttentionHeadsUnderTp,
                         ::testing::Values(Case{4, 1, 2},        // multi-query: the one K/V head on both ranks
                                           Case{4, 1, 4},        // one query head per rank
                                           Case{4, 2, 4},        // grouped-query: ranks 0, 1 read K/V head 0, ranks 2, 3 head 1
                                           Case{4, 2, 2},        // tp divides the K/V heads: they split like the queries
                                           Case{8, 2, 4},        // two query heads per rank, a K/V head per two ranks
                                           Case{4, 4, 2, true},  // ALiBi (Bloom): the slopes split with the heads
                                           Case{4, 1, 4, true}));

TEST(AttentionHeadsUnderTp, TpNeitherDividingNorAMultipleOfTheKvHeadsNamesThem) {
  AttentionInfo a;
  a.heads = 12;
  a.kv_heads = 4;
  a.qkv.resize(3);
  auto s = attention_projection_split(a, 6, "block 0");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.status().message(), "block 0: tp 6 neither divides nor is a multiple of its 4 key/value heads (12 query heads)");
  auto q = attention_projection_split(a, 8, "block 0");
  ASSERT_FALSE(q);
  EXPECT_EQ(q.status().message(), "block 0: tp 8 does not divide its 12 attention heads");
  auto ok = attention_projection_split(a, 2, "block 0");
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, (std::vector<int>{1, 1, 1}));
  a.kv_heads = 2;
  auto mqa = attention_projection_split(a, 4, "block 0");
  ASSERT_TRUE(mqa);
  EXPECT_EQ(*mqa, (std::vector<int>{1, 0, 0}));
  // a fused [q | k | v] whose K/V parts are narrower stays whole
  a.qkv.resize(1);
  auto fused = attention_projection_split(a, 2, "block 0");
  ASSERT_TRUE(fused);
  EXPECT_EQ(*fused, (std::vector<int>{0}));
}

}  // namespace
}  // namespace oases
