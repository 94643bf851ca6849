// planner/coverage.h: the op shapes the planner prices, which oases-profile measures and
// oases-plan --profile checks. The list must be exactly what the searches look up (the one-mesh
// search and the pipeline search's stages, on the cost model), every entry must run alone at its
// shapes (oases-profile times it so), and a profile lacking one is told which, and where it is priced.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "executor/measure_machine.h"
#include "planner/coverage.h"
#include "planner/pipeline_search.h"
#include "planner/search.h"
#include "tools/plan_driver.h"

using namespace oases;

namespace {

struct Case {
  const char* model;
  int64_t ranks;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.model;
  for (char& c : n) {
    if (c == '/') c = '_';
  }
  return n + "_" + std::to_string(info.param.ranks) + "ranks";
}

Expected<PlanningModel> load(const char* model) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/" + model + "/model.onnx";
  // the train models have dynamic axes (8 x 16 tokens here); the others fix theirs at 2 x 16
  bool dynamic = std::string(model).rfind("train/", 0) == 0;
  return load_planning_model(path, ImportOptions{}, dynamic ? 8 : 0, dynamic ? 16 : 0);
}

class PricedOps : public ::testing::TestWithParam<Case> {};

// What the searches ask the op-time model for (but the ring steps' copies, priced from the copy
// rate) is the list, no more and no less: GPT and LLaMA (RMSNorm, SwiGLU, rotary, grouped-query
// heads), BERT (one layout for all), T5 (unfused attention), on one host.
TEST_P(PricedOps, AreWhatTheSearchesPrice) {
  const Case& c = GetParam();
  auto pm = load(c.model);
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, c.ranks);
  ASSERT_TRUE(a) << a.status().message();
  ClusterSpec cluster = this_machine(c.ranks, nullptr, "", 1);
  OpTimeModel ops = op_time_model(cluster, nullptr);
  ops.log_lookups();
  CostModel cm(*a, cluster, ops);
  SearchResult r = search_plan(cm, SearchOptions{});
  ASSERT_TRUE(r.found);
  auto pipe = search_pipeline(pm->forward, pm->train.graph, pm->train.params, cluster, ops, c.ranks, PipelinePlanOptions{});
  ASSERT_TRUE(pipe) << pipe.status().message();
  std::set<std::string> looked_up;
  for (const auto& [op, key] : ops.lookups()) {
    if (op != "RingAssemble") looked_up.insert(key);
  }

  auto priced = priced_ops(pm->forward, pm->train.graph, pm->train.params, *a, default_pricing_space(c.ranks));
  ASSERT_TRUE(priced) << priced.status().message();
  std::set<std::string> listed;
  for (const PricedSample& s : *priced) {
    EXPECT_TRUE(listed.insert(s.op.key).second) << "listed twice: " << s.op.key;
    EXPECT_EQ(s.op.key.rfind(s.op.op + " ", 0), 0u) << s.op.key;
    EXPECT_NE(s.op.node, kNoId) << s.op.key;
  }
  for (const std::string& k : looked_up) EXPECT_TRUE(listed.count(k)) << "priced but not listed: " << k;
  for (const std::string& k : listed) EXPECT_TRUE(looked_up.count(k)) << "listed but never priced: " << k;
  EXPECT_GT(listed.size(), 20u);
}

// Every entry runs alone as the training graph's node at its local shapes (oases-profile's way of
// timing what its runs did not): the sample's shapes are ones a kernel runs at.
TEST_P(PricedOps, EachRunsAloneAtItsShapes) {
  const Case& c = GetParam();
  auto pm = load(c.model);
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, c.ranks);
  ASSERT_TRUE(a) << a.status().message();
  auto priced = priced_ops(pm->forward, pm->train.graph, pm->train.params, *a, default_pricing_space(c.ranks));
  ASSERT_TRUE(priced) << priced.status().message();
  std::map<std::string, OpSample> acc;
  auto timed = measure_priced_ops(pm->train.graph, *priced, 1, 1, 1.0, &acc);
  ASSERT_TRUE(timed) << timed.status().message();
  EXPECT_EQ(static_cast<size_t>(*timed), priced->size());
  for (const PricedSample& s : *priced) {
    auto it = acc.find(s.op.key);
    ASSERT_NE(it, acc.end()) << s.op.key;
    EXPECT_EQ(it->second.op, s.op.op);
    EXPECT_GE(it->second.us, 0.0) << s.op.key;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PricedOps,
                         ::testing::Values(Case{"train/llama_4l", 2}, Case{"train/llama_4l", 4}, Case{"small/llama_gqa", 2},
                                           Case{"train/gpt2_4l", 4}, Case{"small/bert_mask", 2}, Case{"hf/torchscript_t5", 2}),
                         case_name);

// A profile lacking a shape is told which one and where the planner prices it; one of another
// backend (its own compute type) needs samples of every op, not of every shape.
TEST(PricedOps, UncoveredNamesTheShapeAndWhere) {
  auto pm = load("train/llama_4l");
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, 4);
  ASSERT_TRUE(a) << a.status().message();
  auto priced = priced_ops(pm->forward, pm->train.graph, pm->train.params, *a, default_pricing_space(4));
  ASSERT_TRUE(priced) << priced.status().message();
  Profile p;
  for (const PricedSample& s : *priced) p.ops.push_back(OpSample{s.op.op, s.op.key, s.op.flops, s.op.bytes, 1.0, 1});
  EXPECT_TRUE(uncovered(*priced, p).empty());

  // drop the first shape only a sequence-parallel layout prices (the profile's runs never have one)
  auto sp = std::find_if(priced->begin(), priced->end(), [](const PricedSample& s) { return s.layout.sequence_parallel; });
  ASSERT_NE(sp, priced->end());
  p.ops.erase(p.ops.begin() + (sp - priced->begin()));
  auto missing = uncovered(*priced, p);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0]->op.key, sp->op.key);
  std::string where = missing[0]->where();
  EXPECT_EQ(where.rfind(missing[0]->part + " at tp 2 x dp 2, ", 0), 0u) << where;
  EXPECT_NE(where.find("sequence-parallel"), std::string::npos) << where;
  PricedSample stage = *sp;
  stage.ranks = 2;
  stage.chunks = 8;
  stage.stages = 2;
  stage.layout = Layout{1, false};
  EXPECT_EQ(stage.where(), stage.part + " at tp 1 x dp 2, 8 chunks, a stage of 2 pipeline stages");

  Profile gpu = p;
  gpu.backend = "cuda";
  EXPECT_TRUE(uncovered(*priced, gpu).empty());  // other shapes of the op are there to interpolate
  gpu.ops.erase(std::remove_if(gpu.ops.begin(), gpu.ops.end(), [](const OpSample& s) { return s.op == "MatMul"; }), gpu.ops.end());
  size_t matmuls = std::count_if(priced->begin(), priced->end(), [](const PricedSample& s) { return s.op.op == "MatMul"; });
  EXPECT_EQ(uncovered(*priced, gpu).size(), matmuls);
}

// A narrower search lists less: one degree, no sequence parallelism, no pipeline.
TEST(PricedOps, FollowTheSearchOptions) {
  auto pm = load("train/llama_4l");
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, 2);
  ASSERT_TRUE(a) << a.status().message();
  auto base = priced_ops(pm->forward, pm->train.graph, pm->train.params, *a, default_pricing_space(2));
  ASSERT_TRUE(base) << base.status().message();
  PricingSpace one_mesh = default_pricing_space(2);
  one_mesh.pipeline = false;
  one_mesh.search.allow_sequence_parallel = false;
  one_mesh.search.degrees = {2};
  auto fewer = priced_ops(pm->forward, pm->train.graph, pm->train.params, *a, one_mesh);
  ASSERT_TRUE(fewer) << fewer.status().message();
  EXPECT_LT(fewer->size(), base->size());
  for (const PricedSample& s : *fewer) {
    EXPECT_EQ(s.layout.tp, 2);
    EXPECT_FALSE(s.layout.sequence_parallel);
    EXPECT_EQ(s.stages, 1);
  }
}

}  // namespace
