// The Plan value type (planner/plan.h): JSON round trip, equality, validation, and the plan files
// of earlier versions.
#include <fstream>

#include <gtest/gtest.h>

#include "planner/plan.h"

namespace oases {
namespace {

Plan sample_plan() {
  Plan p =
      Plan::from_parts({{"embedding", 2, false}, {"layer.0.attn", 4, true}, {"layer.0.mlp", 4, true}, {"head", 2, false}}, 8, "oases", 4);
  p.batch = 16;
  p.seq = 128;
  p.dtype = "bf16";
  p.dp_bucket_bytes = 1 << 20;
  p.mesh.recompute = CheckpointMode::kBlock;
  return p;
}

TEST(PlanTest, RoundTripKeepsEveryField) {
  for (const Plan& p : {sample_plan(), Plan::megatron(2, 2), [] {
                          Plan q = Plan::megatron(4, 1);
                          q.vocab_parallel = false;
                          q.sequence_parallel = true;
                          q.parameters["wte"] = "[S(tp), R]";
                          return q;
                        }()}) {
    ASSERT_TRUE(p.validate().is_ok()) << p.validate().message();
    auto back = Plan::from_json(p.to_json(), "mem.json");
    ASSERT_TRUE(back.is_ok()) << back.status().message();
    // the mesh a file names comes back as axes; compare what a run uses
    Plan q = *back;
    q.mesh.mesh = p.mesh.mesh;
    q.version = p.version;
    EXPECT_EQ(q, p) << p.to_string() << " vs " << q.to_string();
    EXPECT_EQ(back->to_json(), p.to_json());
  }
}

TEST(PlanTest, EqualityAndToString) {
  Plan a = sample_plan(), b = sample_plan();
  EXPECT_EQ(a, b);
  b.mesh.parts[1].tp = 2;
  EXPECT_NE(a, b);
  b = a;
  b.mesh.recompute.reset();
  EXPECT_NE(a, b);
  EXPECT_EQ(b.mesh.recompute_mode(), CheckpointMode::kCommOptimized);  // oases's own
  EXPECT_EQ(Plan::megatron(2, 1).mesh.chunk_count(), 1);
  EXPECT_EQ(a.mesh.chunk_count(), 4);
  EXPECT_EQ(Plan::megatron(2, 2).to_string(), "tp 2 x dp 2, in line x 1 chunks, fp32");
  EXPECT_NE(a.to_string().find("recompute block"), std::string::npos) << a.to_string();
}

TEST(PlanTest, ValidateNamesWhatIsWrong) {
  auto expect_error = [](Plan p, const std::string& needle) {
    Status s = p.validate();
    ASSERT_FALSE(s.is_ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  Plan p = Plan::megatron(2, 2);
  p.mesh.ranks = 8;
  expect_error(p, "tp 2 x dp 2 = 4 ranks, but the mesh has 8");
  p = Plan::megatron(2, 2);
  p.mesh.schedule = "fastest";
  expect_error(p, "unknown schedule 'fastest'");
  p = Plan::megatron(2, 2);
  p.dtype = "fp8";
  expect_error(p, "unknown dtype 'fp8'");
  p = Plan::megatron(2, 2);
  p.mesh.chunks = -1;
  expect_error(p, "-1 chunks");
  p = sample_plan();
  p.mesh.parts[0].tp = 3;
  expect_error(p, "part 'embedding' has tp 3, which does not divide 8 ranks");
  p = sample_plan();
  p.mesh.ranks = 0;
  expect_error(p, "needs \"mesh\"");
}

TEST(PlanTest, ReadsVersionOneAndTwo) {
  // version 1: a Megatron split written by oases-plan --tp/--dp (parameters as a list), or a map
  nlohmann::json v1 = nlohmann::json::parse(R"({"format": "oases-plan", "version": 1, "model": "m.onnx",
      "mesh": {"axes": ["dp", "tp"], "sizes": [2, 2], "ranks": 4},
      "parameters": [{"name": "wte", "shape": [64, 16], "spec": "[S(tp), R]", "local_shape": [32, 16]},
                     {"name": "ln.weight", "shape": [16], "spec": "[R]"}]})");
  auto p1 = Plan::from_json(v1, "v1.json");
  ASSERT_TRUE(p1.is_ok()) << p1.status().message();
  EXPECT_EQ(p1->version, 1);
  EXPECT_EQ(p1->mesh.tp, 2);
  EXPECT_EQ(p1->mesh.dp, 2);
  EXPECT_EQ(p1->mesh.ranks, 4);
  EXPECT_EQ(p1->parameters.at("wte"), "[S(tp), R]");
  EXPECT_TRUE(p1->validate().is_ok());
  auto map = Plan::from_json(nlohmann::json::parse(R"({"parameters": {"wte": "[R, S(tp)]"}})"), "map.json");
  ASSERT_TRUE(map.is_ok());
  EXPECT_EQ(map->version, 1);
  EXPECT_EQ(map->mesh.ranks, 0);
  EXPECT_EQ(map->parameters.at("wte"), "[R, S(tp)]");
  // version 2: what oases-plan --gpus writes (parts, shapes, schedule, a compound mesh)
  nlohmann::json v2 = nlohmann::json::parse(R"({"format": "oases-plan", "version": 2, "strategy": "oases-planner",
      "mesh": {"axes": ["m0", "m1", "tp2"], "sizes": [2, 2, 4], "parts": [[], [], [0, 1]], "ranks": 4},
      "batch": 8, "seq": 32, "vocab_parallel": true,
      "parts": [{"part": "embedding", "tp": 4, "dp": 1, "sequence_parallel": false},
                {"part": "head", "tp": 2, "dp": 2, "sequence_parallel": true}],
      "schedule": {"name": "oases", "chunks": 2}})");
  auto p2 = Plan::from_json(v2, "v2.json");
  ASSERT_TRUE(p2.is_ok()) << p2.status().message();
  EXPECT_EQ(p2->version, 2);
  EXPECT_EQ(p2->mesh.ranks, 4);
  EXPECT_EQ(p2->mesh.tp, 0);  // mixed degrees
  ASSERT_EQ(p2->mesh.parts.size(), 2u);
  EXPECT_TRUE(p2->mesh.parts[1].sequence_parallel);
  EXPECT_EQ(p2->mesh.schedule, "oases");
  EXPECT_EQ(p2->mesh.chunks, 2);
  EXPECT_EQ(p2->batch, 8);
  EXPECT_EQ(p2->seq, 32);
  EXPECT_TRUE(p2->validate().is_ok()) << p2->validate().message();
}

TEST(PlanTest, NewerVersionIsAOneLineError) {
  auto p = Plan::from_json(nlohmann::json::parse(R"({"version": 7})"), "future.json");
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().message(), "future.json: plan version 7 (this build reads 1 to 3)");
  std::string path = ::testing::TempDir() + "/oases_plan_future.json";
  std::ofstream(path) << R"({"version": 4})";
  auto r = Plan::read(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(path + ": plan version 4"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

TEST(PlanTest, AdoptFillsWhatTheCommandLineLeftOpen) {
  Plan p = sample_plan();
  RunShape run;
  ASSERT_TRUE(adopt_plan(p, "p.json", 8, &run).is_ok());
  EXPECT_EQ(run.tp, 1);  // mixed parts: a placeholder grid
  EXPECT_EQ(run.dp, 8);
  EXPECT_EQ(run.batch, 16);
  EXPECT_EQ(run.schedule, "oases");
  EXPECT_EQ(run.chunks, 4);
  RunShape other;
  Status s = adopt_plan(p, "p.json", 4, &other);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("the plan is for 8 ranks, this run has 4"), std::string::npos) << s.message();
  RunShape conflict;
  conflict.tp = 4;
  conflict.dp = 1;
  s = adopt_plan(Plan::megatron(2, 2), "p.json", 4, &conflict);
  EXPECT_NE(s.message().find("the plan has --tp 2, the command line 4"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace oases
