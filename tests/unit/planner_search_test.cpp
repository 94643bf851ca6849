// The planner's exact search (dynamic program over the chain of parts, Pareto fronts under a
// memory limit) finds the same optimum as enumerating every assignment, on small instances: the
// committed small models at 2 and 4 ranks, on the machine at hand and on a two-node cluster, with
// and without memory limits that cut through the space.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>

#include "planner/search.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

struct Instance {
  const char* model;
  int64_t ranks;
  bool cluster;  // a 2-node RTX 3090 cluster file, else the machine at hand
};

ClusterSpec two_nodes(int64_t ranks) {
  nlohmann::json j = {{"format", "oases-cluster"},
                      {"version", 1},
                      {"name", "test"},
                      {"device", "RTX3090"},
                      {"nodes", 2},
                      {"gpus_per_node", ranks / 2},
                      {"links",
                       {{"intra_node", {{"kind", "pcie"}, {"bandwidth_gbps", 6.2}, {"latency_us", 10}}},
                        {"inter_node", {{"kind", "ethernet"}, {"bandwidth_gbps", 1.25}, {"latency_us", 30}}}}}};
  auto c = cluster_from_json(j, "test cluster");
  EXPECT_TRUE(c) << c.status().message();
  return *c;
}

class SearchEqualsBruteForce : public ::testing::TestWithParam<Instance> {};

TEST_P(SearchEqualsBruteForce, SameOptimumUnderEveryLimit) {
  const Instance& in = GetParam();
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/" + in.model + "/model.onnx";
  // the train model has dynamic axes (8 x 16 tokens here); the small ones fix theirs
  bool dynamic = std::string(in.model).rfind("train/", 0) == 0;
  auto pm = load_planning_model(path, ImportOptions{}, dynamic ? 8 : 0, dynamic ? 16 : 0);
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, in.ranks);
  ASSERT_TRUE(a) << a.status().message();
  ClusterSpec cluster = in.cluster ? two_nodes(in.ranks) : this_machine(in.ranks, nullptr, "", 1);
  OpTimeModel ops = op_time_model(cluster, nullptr);
  CostModel cm(*a, cluster, ops);

  SearchOptions o;
  o.chunks = {1, 2};  // keeps the enumeration small; every schedule
  SearchResult free_dp = search_plan(cm, o);
  SearchResult free_bf = brute_force(cm, o);
  ASSERT_TRUE(free_dp.found && free_bf.found);
  EXPECT_NEAR(free_dp.objective, free_bf.objective, 1e-12 * free_bf.objective);
  EXPECT_NEAR(plan_objective(cm, free_dp.best), free_dp.objective, 1e-12 * free_dp.objective);
  EXPECT_NEAR(free_dp.least_memory, free_bf.least_memory, 1e-9 * free_bf.least_memory);

  // limits from just under the least any plan needs up to just over the free optimum's memory
  double lo = free_bf.least_memory, hi = plan_memory(cm, free_bf.best);
  int constrained = 0;
  for (double f : {0.999, 1.0, 1.0001, 0.25, 0.5, 0.75, 0.9, 0.99}) {
    SearchOptions lim = o;
    lim.memory_limit = f >= 0.999 && f <= 1.0001 && f != 0.25 ? lo * f : lo + (hi - lo) * f;
    SearchResult d = search_plan(cm, lim), b = brute_force(cm, lim);
    ASSERT_EQ(d.found, b.found) << "limit " << lim.memory_limit;
    if (!b.found) {
      EXPECT_GT(b.least_memory, lim.memory_limit);
      EXPECT_NEAR(d.least_memory, b.least_memory, 1e-9 * b.least_memory);
      continue;
    }
    EXPECT_NEAR(d.objective, b.objective, 1e-12 * b.objective) << "limit " << lim.memory_limit;
    EXPECT_LE(plan_memory(cm, d.best), lim.memory_limit * (1 + 1e-12));
    // the chains' bounds only cut work: the label programs alone choose the same plan
    SearchOptions alone = lim;
    alone.bound_chains = false;
    SearchResult u = search_plan(cm, alone);
    EXPECT_TRUE(u.best == d.best) << "limit " << lim.memory_limit << ": the bounds changed the plan";
    EXPECT_EQ(u.objective, d.objective) << "limit " << lim.memory_limit;
    EXPECT_NEAR(plan_objective(cm, d.best), d.objective, 1e-12 * d.objective);
    constrained += b.objective > free_bf.objective * (1 + 1e-9);
  }
  // keep_spaces: the same optimum, and per (schedule, K) the best the search restricted to that
  // space finds, fastest first; under a limit too
  for (double limit : {0.0, lo + (hi - lo) * 0.5}) {
    SearchOptions k = o;
    k.memory_limit = limit;
    k.keep_spaces = true;
    SearchResult ks = search_plan(cm, k), plain = search_plan(cm, [&] {
                                             SearchOptions x = o;
                                             x.memory_limit = limit;
                                             return x;
                                           }());
    ASSERT_EQ(ks.found, plain.found);
    if (!ks.found) continue;
    EXPECT_NEAR(ks.objective, plain.objective, 1e-12 * plain.objective);
    ASSERT_FALSE(ks.spaces.empty());
    EXPECT_NEAR(ks.spaces.front().objective, ks.objective, 1e-12 * ks.objective);
    SearchOptions alone = k;
    alone.bound_chains = false;
    SearchResult ku = search_plan(cm, alone);
    ASSERT_EQ(ku.spaces.size(), ks.spaces.size());
    for (size_t i = 0; i < ks.spaces.size(); ++i) {
      EXPECT_TRUE(ku.spaces[i].choice == ks.spaces[i].choice) << ks.spaces[i].choice.schedule << " K=" << ks.spaces[i].choice.chunks;
    }
    for (size_t i = 0; i < ks.spaces.size(); ++i) {
      const SpaceBest& sb = ks.spaces[i];
      if (i > 0) {
        EXPECT_GE(sb.objective, ks.spaces[i - 1].objective);
      }
      SearchOptions one = o;
      one.memory_limit = limit;
      one.schedules = {sb.choice.schedule};
      one.chunks = {sb.choice.chunks};
      SearchResult r = brute_force(cm, one);
      ASSERT_TRUE(r.found) << sb.choice.schedule << " K=" << sb.choice.chunks;
      EXPECT_NEAR(sb.objective, r.objective, 1e-12 * r.objective) << sb.choice.schedule << " K=" << sb.choice.chunks;
      EXPECT_NEAR(plan_objective(cm, sb.choice), sb.objective, 1e-12 * sb.objective);
      if (limit > 0) {
        EXPECT_LE(sb.memory, limit * (1 + 1e-12));
      }
    }
  }
  // uniform layouts only (Megatron-like): the same
  SearchOptions u = o;
  u.allow_mixed = false;
  SearchResult ud = search_plan(cm, u), ub = brute_force(cm, u);
  ASSERT_TRUE(ud.found && ub.found);
  EXPECT_NEAR(ud.objective, ub.objective, 1e-12 * ub.objective);
  EXPECT_GE(ud.objective, free_dp.objective * (1 - 1e-12));
  // the limits cut through the space: some of them force a slower plan than the free optimum
  if (hi > lo * 1.01) {
    EXPECT_GT(constrained, 0) << "memory " << lo << " .. " << hi;
  }
}

INSTANTIATE_TEST_SUITE_P(SmallModels, SearchEqualsBruteForce,
                         ::testing::Values(Instance{"small/gpt2_tiny", 2, false}, Instance{"small/gpt2_tiny", 4, false},
                                           Instance{"small/gpt2_tiny", 4, true}, Instance{"small/llama_gqa", 4, true},
                                           Instance{"small/bert_mask", 4, false}, Instance{"train/gpt2_bytes", 4, false},
                                           Instance{"train/gpt2_bytes", 4, true}, Instance{"train/gpt2_bytes", 2, true}),
                         [](const auto& info) {
                           std::string m = info.param.model;
                           return m.substr(m.find('/') + 1) + "_" + std::to_string(info.param.ranks) +
                                  (info.param.cluster ? "_cluster" : "_local");
                         });

// The committed tiny GPT-2 analysed on `ranks` ranks of this machine, with its op times.
struct TinyModel {
  ModelAnalysis a;
  ClusterSpec cluster;
  OpTimeModel ops;
};
std::unique_ptr<TinyModel> tiny_model(int64_t ranks) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/small/gpt2_tiny/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 0, 0);
  EXPECT_TRUE(pm) << pm.status().message();
  if (!pm) return nullptr;
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, ranks);
  EXPECT_TRUE(a);
  if (!a) return nullptr;
  ClusterSpec cluster = this_machine(ranks, nullptr, "", 1);
  OpTimeModel ops = op_time_model(cluster, nullptr);
  return std::make_unique<TinyModel>(TinyModel{std::move(*a), cluster, ops});
}

TEST(PlannerSearch, NoPlanFitsNamesTheLeastMemory) {
  auto t = tiny_model(2);
  ASSERT_TRUE(t);
  CostModel cm(t->a, t->cluster, t->ops);
  SearchOptions o;
  o.memory_limit = 1024;  // 1 KiB
  SearchResult r = search_plan(cm, o);
  EXPECT_FALSE(r.found);
  EXPECT_GT(r.least_memory, 1024);
  o.memory_limit = r.least_memory;
  EXPECT_TRUE(search_plan(cm, o).found);
}

// oases-plan --gpus N --sequence-parallel: every part that has a sequence-parallel layout at a
// degree takes one there (the others keep theirs); with --no-sequence-parallel none does.
TEST(PlannerSearch, SequenceParallelRequiredOrRefused) {
  auto t = tiny_model(2);
  ASSERT_TRUE(t);
  CostModel cm(t->a, t->cluster, t->ops);
  SearchOptions o;
  o.degrees = {2};
  o.allow_collective_matmul = false;
  int with_sp = 0;
  for (int i = 0; i < cm.num_parts(); ++i) {
    for (const Layout& l : candidate_layouts(t->a, 2, i, 1)) with_sp += l.tp == 2 && l.sequence_parallel;
  }
  ASSERT_GT(with_sp, 0) << "the tiny GPT-2 has sequence-parallel layouts at tp 2";
  SearchResult free_run = search_plan(cm, o);
  o.require_sequence_parallel = true;
  SearchResult sp = search_plan(cm, o);
  o.require_sequence_parallel = false;
  o.allow_sequence_parallel = false;
  SearchResult none = search_plan(cm, o);
  ASSERT_TRUE(free_run.found && sp.found && none.found);
  for (int i = 0; i < cm.num_parts(); ++i) {
    const auto cands = candidate_layouts(t->a, 2, i, 1);
    bool can = std::any_of(cands.begin(), cands.end(), [](const Layout& l) { return l.tp == 2 && l.sequence_parallel; });
    EXPECT_EQ(sp.best.layouts[static_cast<size_t>(i)].sequence_parallel, can) << "part " << i;
    EXPECT_FALSE(none.best.layouts[static_cast<size_t>(i)].sequence_parallel) << "part " << i;
  }
  // never faster than the free choice, which may take it or not
  EXPECT_GE(sp.objective, free_run.objective - 1e-12);
  EXPECT_GE(none.objective, free_run.objective - 1e-12);
}

// The distributed optimizer priced: a part's moments and update shared over its dp ranks (8 + 8/dp
// bytes a weight instead of 16), the gradient all-reduce's gather half exposed after the step; the
// search's choice then carries it (PlanChoice::zero, Plan::zero), and needs no more memory.
TEST(PlannerSearch, DistributedOptimizerSharesTheStateOverDp) {
  auto t = tiny_model(4);
  ASSERT_TRUE(t);
  const ModelAnalysis* a = &t->a;
  CostModel plain(t->a, t->cluster, t->ops), zero(t->a, t->cluster, t->ops);
  zero.set_zero(true);
  ScheduleOptions s;
  for (int i = 0; i < plain.num_parts(); ++i) {
    for (const Layout& l : plain.layouts(i, 1)) {
      const PartCost& pc = zero.part(i, l, 1);
      ASSERT_EQ(pc.dp, 4 / l.tp);
      EXPECT_DOUBLE_EQ(plain.state_bytes(plain.part(i, l, 1)), 4.0 * pc.param_bytes);
      EXPECT_DOUBLE_EQ(zero.state_bytes(pc), (2.0 + 2.0 / static_cast<double>(pc.dp)) * pc.param_bytes);
      EXPECT_DOUBLE_EQ(zero.updated_bytes(pc), pc.param_bytes / static_cast<double>(pc.dp));
      PartTime tp = plain.part_time(i, l, l, s, 1), tz = zero.part_time(i, l, l, s, 1);
      EXPECT_DOUBLE_EQ(tz.comm, tp.comm);  // a reduce-scatter and an all-gather move what the all-reduce moved
      if (pc.dp > 1) {
        EXPECT_GE(tz.exposed, pc.comm_dp / 2);  // the weights' gather: nothing to hide behind
      }
    }
  }
  SearchOptions o;
  SearchResult rp = search_plan(plain, o), rz = search_plan(zero, o);
  ASSERT_TRUE(rp.found && rz.found);
  EXPECT_FALSE(rp.best.zero);
  EXPECT_TRUE(rz.best.zero);
  EXPECT_EQ(plan_of_choice(*a, rz.best, 4).zero, 1);
  EXPECT_LE(zero.estimate(rp.best).memory_bytes, plain.estimate(rp.best).memory_bytes);
}

// The pipeline search analyses the model once per stage mesh through one ModelAnalyzer, which keeps
// what depends on the model alone: every analysis must be analyze_model's on those ranks.
TEST(PlannerAnalysis, AnalyzerOnSeveralRanksIsAnalyzeModel) {
  for (const char* model : {"train/gpt2_4l", "train/llama_4l"}) {
    std::string path = std::string(OASES_SOURCE_DIR) + "/models/" + model + "/model.onnx";
    auto pm = load_planning_model(path, ImportOptions{}, 48, 64);
    ASSERT_TRUE(pm) << pm.status().message();
    ModelAnalyzer analyzer(pm->forward, pm->train.graph, pm->train.params);
    for (int64_t ranks : {16, 1, 2, 4, 8, 3, 6, 12, 256, 16}) {
      auto shared = analyzer.analyze(ranks);
      auto alone = analyze_model(pm->forward, pm->train.graph, pm->train.params, ranks);
      ASSERT_EQ(shared.is_ok(), alone.is_ok()) << model << " on " << ranks;
      if (!alone) continue;
      const ModelAnalysis &x = *shared, &y = *alone;
      EXPECT_EQ(x.parts, y.parts);
      EXPECT_EQ(x.tp_candidates, y.tp_candidates) << model << " on " << ranks;
      EXPECT_EQ(x.reference_tp, y.reference_tp);
      EXPECT_EQ(x.mixed_ok, y.mixed_ok);
      EXPECT_EQ(x.mixed_why, y.mixed_why);
      EXPECT_EQ(std::tie(x.batch, x.seq, x.hidden, x.vocab, x.tied_head), std::tie(y.batch, y.seq, y.hidden, y.vocab, y.tied_head));
      ASSERT_EQ(x.plain.size(), y.plain.size());
      ASSERT_EQ(x.seqpar.size(), y.seqpar.size());
      for (size_t i = 0; i < x.plain.size(); ++i) EXPECT_EQ(x.plain[i].signature, y.plain[i].signature) << model << " part " << i;
      for (size_t i = 0; i < x.seqpar.size(); ++i) EXPECT_EQ(x.seqpar[i].signature, y.seqpar[i].signature) << model << " part " << i;
    }
  }
}

}  // namespace
}  // namespace oases

namespace oases {
namespace {

// The work of the search, guarded (not its wall time): a 4-layer GPT on 16 GPUs of two nodes, every
// schedule, K in {1, 2, 4, 8}, sequence parallelism and collective matmuls, under twelve memory
// limits from just above the least any plan needs to just under the fastest plan's memory, so the
// chains' bounds and Pareto fronts run. The dominance pruning and the bounds (exact:
// SearchEqualsBruteForce, and here the same plan as the label programs alone) cut the work; what
// the limits together cost must stay under the bound measured when it was set (2026-11-27) with a
// margin, so a change that multiplies the search's work fails here instead of in a user's
// minute-long oases-plan.
TEST(SearchWork, StaysBounded) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/gpt2_4l/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 32, 64);
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, 16);
  ASSERT_TRUE(a) << a.status().message();
  nlohmann::json j = {{"format", "oases-cluster"},
                      {"version", 1},
                      {"name", "two A100 nodes"},
                      {"device", "A100-SXM-80GB"},
                      {"nodes", 2},
                      {"gpus_per_node", 8},
                      {"links",
                       {{"intra_node", {{"kind", "nvlink"}, {"bandwidth_gbps", 240}, {"latency_us", 3}}},
                        {"inter_node", {{"kind", "infiniband"}, {"bandwidth_gbps", 25}, {"latency_us", 5}}}}}};
  auto c = cluster_from_json(j, "test cluster");
  ASSERT_TRUE(c) << c.status().message();
  OpTimeModel ops = op_time_model(*c, nullptr);
  ops.set_half_precision(true);
  CostModel cm(*a, *c, ops);
  SearchOptions o;
  SearchResult free_run = search_plan(cm, o);
  ASSERT_TRUE(free_run.found);
  int64_t transitions = 0, labels = 0, bounding = 0, unbounded_labels = 0, dominated = 0;
  for (double f : {0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95}) {
    o.memory_limit = free_run.least_memory + f * (free_run.memory - free_run.least_memory);
    SearchResult r = search_plan(cm, o);
    ASSERT_TRUE(r.found) << "limit " << o.memory_limit;
    EXPECT_LE(r.memory, o.memory_limit);
    SearchOptions alone = o;
    alone.bound_chains = false;
    SearchResult u = search_plan(cm, alone);
    EXPECT_TRUE(r.best == u.best) << "limit " << o.memory_limit << ": the bounds changed the plan";
    EXPECT_EQ(r.objective, u.objective) << "limit " << o.memory_limit;
    transitions += r.transitions;
    labels += r.labels;
    bounding += r.bound_transitions;
    unbounded_labels += u.labels;
    dominated = r.dominated;
  }
  EXPECT_GT(dominated, 0) << "no layout was dominated: the pruning did not run";
  EXPECT_GT(bounding, 0) << "no chain was bounded: the limits did not bind";
  std::printf("search work over 12 limits: %lld transitions, %lld labels, %lld bounding (the label programs alone: %lld labels), %lld layouts "
              "dominated\n",
              static_cast<long long>(transitions), static_cast<long long>(labels), static_cast<long long>(bounding),
              static_cast<long long>(unbounded_labels), static_cast<long long>(dominated));
  // measured when set: 60013 transitions, 484 labels, 6036 bounding; 25% margin. Reset
  // 2026-11-27 when the memory model learned the backward's working set and the gradients taking
  // the activations' place (other limits, other chains bounded): 70674 transitions, 287 labels,
  // 10078 bounding (GPT-3's 96 layers x 64 GPUs: 2.25 M transitions, 38 k labels, 4.33 M bounding,
  // was 2.28 M, 70 k, 5.28 M); 25% margin on the bounding
  EXPECT_LE(transitions, 75100) << "the search's work grew";
  EXPECT_LE(labels, 610) << "the search's work grew";
  EXPECT_LE(bounding, 12600) << "the search's work grew";
}

}  // namespace
}  // namespace oases
