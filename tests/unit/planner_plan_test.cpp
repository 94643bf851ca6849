// The Plan value type (planner/plan.h): JSON round trip, equality, validation, and the plan files
// of earlier versions.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "planner/plan.h"

namespace oases {
namespace {

Plan sample_plan() {
  Plan p = Plan::from_parts({{"embedding", {2, false}}, {"layer.0.attn", {4, true}}, {"layer.0.mlp", {4, true}}, {"head", {2, false}}}, 8,
                            "oases", 4);
  p.batch = 16;
  p.seq = 128;
  p.dtype = "bf16";
  p.dp_bucket_bytes = 1 << 20;
  p.mesh().recompute = CheckpointMode::kBlock;
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
    q.mesh().mesh = p.mesh().mesh;
    q.version = p.version;
    EXPECT_EQ(q, p) << p.to_string() << " vs " << q.to_string();
    EXPECT_EQ(back->to_json(), p.to_json());
  }
}

TEST(PlanTest, EqualityAndToString) {
  Plan a = sample_plan(), b = sample_plan();
  EXPECT_EQ(a, b);
  b.mesh().parts[1].tp = 2;
  EXPECT_NE(a, b);
  b = a;
  b.mesh().recompute.reset();
  EXPECT_NE(a, b);
  EXPECT_EQ(b.mesh().recompute_mode(), CheckpointMode::kCommOptimized);  // oases's own
  EXPECT_EQ(Plan::megatron(2, 1).mesh().chunk_count(), 1);
  EXPECT_EQ(a.mesh().chunk_count(), 4);
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
  p.mesh().ranks = 8;
  expect_error(p, "tp 2 x dp 2 = 4 ranks, but the mesh has 8");
  p = Plan::megatron(2, 2);
  p.mesh().schedule = "fastest";
  expect_error(p, "unknown schedule 'fastest'");
  p = Plan::megatron(2, 2);
  p.dtype = "fp8";
  expect_error(p, "unknown dtype 'fp8'");
  p = Plan::megatron(2, 2);
  p.mesh().chunks = -1;
  expect_error(p, "schedule.chunks: -1 is not a positive integer");
  p = Plan::megatron(2, 2);
  p.mesh().chunks = kMaxPlanChunks + 1;
  expect_error(p, "schedule.chunks: 1048577 is more than 1048576");
  p = Plan::megatron(2, 2);
  p.mesh().schedule = "oases";
  p.mesh().chunks = 3;
  p.batch = 8;
  expect_error(p, "schedule.chunks: dp 2 x 3 chunks do not divide the batch of 8");
  p = Plan::megatron(2, 1);
  p.mesh().mesh = Mesh{{"dp", "tp"}, {0, 2}};
  expect_error(p, "mesh.sizes[0]: 0 is not a size from 1 to 1048576");
  p = Plan::megatron(2, 1);
  p.parameters["wte"] = "[S(tp)/0, R]";
  expect_error(p, "parameters['wte']: spec '[S(tp)/0, R]': 0 segments");
  p = Plan::megatron(2, 1);
  p.stages = {p.mesh(), p.mesh()};
  p.stages[0].blocks = "0-1";
  p.stages[1].blocks = "3-4";
  expect_error(p, "pipeline.cuts: stage 1 starts at block 3, not 2");
  p = sample_plan();
  p.mesh().parts[0].tp = 3;
  expect_error(p, "part 'embedding' has tp 3, which does not divide 8 ranks");
  p = sample_plan();
  p.mesh().ranks = 0;
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
  EXPECT_EQ(p1->mesh().tp, 2);
  EXPECT_EQ(p1->mesh().dp, 2);
  EXPECT_EQ(p1->mesh().ranks, 4);
  EXPECT_EQ(p1->parameters.at("wte"), "[S(tp), R]");
  EXPECT_TRUE(p1->validate().is_ok());
  auto map = Plan::from_json(nlohmann::json::parse(R"({"parameters": {"wte": "[R, S(tp)]"}})"), "map.json");
  ASSERT_TRUE(map.is_ok());
  EXPECT_EQ(map->version, 1);
  EXPECT_EQ(map->mesh().ranks, 0);
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
  EXPECT_EQ(p2->mesh().ranks, 4);
  EXPECT_EQ(p2->mesh().tp, 0);  // mixed degrees
  ASSERT_EQ(p2->mesh().parts.size(), 2u);
  EXPECT_TRUE(p2->mesh().parts[1].sequence_parallel);
  EXPECT_EQ(p2->mesh().schedule, "oases");
  EXPECT_EQ(p2->mesh().chunks, 2);
  EXPECT_EQ(p2->batch, 8);
  EXPECT_EQ(p2->seq, 32);
  EXPECT_TRUE(p2->validate().is_ok()) << p2->validate().message();
}

TEST(PlanTest, NewerVersionIsAOneLineError) {
  auto p = Plan::from_json(nlohmann::json::parse(R"({"version": 7})"), "future.json");
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().message(), "future.json: plan version 7 (this build reads 1 to 4)");
  std::string path = ::testing::TempDir() + "/oases_plan_future.json";
  std::ofstream(path) << R"({"version": 5})";
  auto r = Plan::read(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(path + ": plan version 5"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

// A valid version 2 plan file with a pipeline, and the same file with one field changed.
nlohmann::json good_file() {
  return nlohmann::json::parse(R"({"format": "oases-plan", "version": 3,
      "mesh": {"axes": ["dp", "tp"], "sizes": [2, 2], "ranks": 4}, "batch": 16, "seq": 32,
      "vocab_parallel": true, "sequence_parallel": false, "dtype": "bf16", "dp_bucket_bytes": 1048576,
      "schedule": {"name": "oases", "chunks": 2, "recompute": "block"},
      "parts": [{"part": "embedding", "tp": 2, "dp": 2}, {"part": "layer.0.attn", "tp": 2, "sequence_parallel": true}],
      "pipeline": {"stages": 2, "micro_batches": 2, "cuts": "0-0,1-3", "schedule": "1f1b",
                   "meshes": [{"tp": 2, "dp": 2}, {"tp": 4, "dp": 1, "schedule": "plain"}]},
      "parameters": [{"name": "wte", "spec": "[S(tp), R]"}]})");
}

TEST(PlanFileTest, EveryBadFieldIsOneLineNamingTheFileAndTheField) {
  ASSERT_TRUE(Plan::from_json(good_file(), "plan.json").is_ok()) << Plan::from_json(good_file(), "plan.json").status().message();
  struct Case {
    const char* pointer;  // JSON pointer of the field changed
    const char* value;    // its new value (JSON); "-" removes it
    const char* message;  // the whole message
  };
  const Case cases[] = {
      // the issue's cases: chunks 0, -3, 10^12 (as an integer and as a number), mesh sizes [0, 2]
      {"/schedule/chunks", "0", "plan.json: schedule.chunks: 0 is not a positive integer"},
      {"/schedule/chunks", "-3", "plan.json: schedule.chunks: -3 is not a positive integer"},
      {"/schedule/chunks", "1000000000000", "plan.json: schedule.chunks: 1000000000000 is more than 1048576, the most a plan may give"},
      {"/schedule/chunks", "1e12", "plan.json: schedule.chunks: 1000000000000 is more than 1048576, the most a plan may give"},
      {"/schedule/chunks", "1e300", "plan.json: schedule.chunks: 1e+300 is more than 1048576, the most a plan may give"},
      {"/schedule/chunks", "2.5", "plan.json: schedule.chunks: 2.5 is not an integer"},
      {"/schedule/chunks", "\"2\"", "plan.json: schedule.chunks: a string where an integer belongs"},
      {"/schedule/chunks", "3", "plan.json: pipeline.micro_batches: dp 2 x 2 micro-batches x 3 chunks do not divide the batch of 16"},
      {"/mesh/sizes", "[0, 2]", "plan.json: mesh.sizes[0]: 0 is not a positive integer"},
      {"/mesh/sizes", "[2, -2]", "plan.json: mesh.sizes[1]: -2 is not a positive integer"},
      {"/mesh/sizes", "[2, 4294967296]", "plan.json: mesh.sizes[1]: 4294967296 is more than 1048576, the most a plan may give"},
      {"/mesh/sizes", "[1024, 2048]", "plan.json: mesh.sizes: more than 1048576 ranks in all"},
      {"/mesh/sizes", "[2]", "plan.json: mesh: 2 axes but 1 sizes"},
      {"/mesh/sizes", "{}", "plan.json: mesh.sizes: an object where a list belongs"},
      {"/mesh/axes", "[\"tp\", \"tp\"]", "plan.json: mesh.axes[1]: axis 'tp' named twice"},
      {"/mesh/axes", "[\"dp\", \"\"]", "plan.json: mesh.axes[1]: an axis needs a name"},
      {"/mesh/ranks", "8", "plan.json: mesh.ranks: 8, but the mesh dp=2 x tp=2 has 4 ranks"},
      {"/mesh/ranks", "0", "plan.json: mesh.ranks: 0 is not a positive integer"},
      {"/mesh/parts", "[[], [5]]", "plan.json: mesh.parts[1][0]: axis 5 of a 2-axis mesh"},
      {"/mesh", "[2, 2]", "plan.json: mesh: a list where an object belongs"},
      {"/version", "3.5", "plan.json: version: 3.5 is not an integer"},
      {"/version", "0", "plan.json: plan version 0 (this build reads 1 to 4)"},
      {"/version", "\"3\"", "plan.json: version: a string where an integer belongs"},
      {"/format", "\"onnx\"", "plan.json: format: 'onnx' is not \"oases-plan\""},
      // a name that would break the one line (here, or quoted when the plan runs)
      {"/format", "\"oases-pl\\n\"", "plan.json: format: 'oases-pl\\n' holds a control character"},
      {"/parts/0/part", "\"emb\\u0001\"", "plan.json: parts[0].part: 'emb\\x01' holds a control character"},
      {"/parameters/0/name", "\"w\\tte\"", "plan.json: parameters[0].name: 'w\\tte' holds a control character"},
      {"/parameters", "{\"a\\nb\": \"[R]\"}", "plan.json: parameters['a\\nb']: 'a\\nb' holds a control character"},
      {"/batch", "0", "plan.json: batch: 0 is not a positive integer"},
      {"/batch", "12", "plan.json: pipeline.micro_batches: dp 2 x 2 micro-batches x 2 chunks do not divide the batch of 12"},
      {"/seq", "-1", "plan.json: seq: -1 is not a positive integer"},
      {"/vocab_parallel", "1", "plan.json: vocab_parallel: an integer where true or false belongs"},
      {"/dtype", "\"fp8\"", "plan.json: dtype: unknown dtype 'fp8' (fp32, bf16, fp16)"},
      {"/dp_bucket_bytes", "-1", "plan.json: dp_bucket_bytes: -1 is negative"},
      {"/schedule", "\"oases\"", "plan.json: schedule: a string where an object belongs"},
      {"/schedule/name", "\"fastest\"",
       "plan.json: schedule.name: unknown schedule 'fastest' (plain, default_checkpoint, optim_comm_checkpoint, overlap_checkpoint, "
       "oases)"},
      {"/schedule/recompute", "\"all\"", "plan.json: schedule.recompute: unknown recompute 'all' (none, block, comm_optimized)"},
      {"/parts/0/tp", "3", "plan.json: parts[0].tp: part 'embedding' has tp 3, which does not divide 4 ranks"},
      {"/parts/0/tp", "0", "plan.json: parts[0].tp: 0 is not a positive integer"},
      {"/parts/0/dp", "4", "plan.json: parts[0].dp: tp 2 x dp 4 = 8 ranks, but the mesh has 4"},
      {"/parts/0/tp", "-", "plan.json: parts[0]: part 'embedding' has no \"tp\""},
      {"/parts/1/part", "\"embedding\"", "plan.json: parts[1].part: part 'embedding' is listed twice"},
      {"/parts/1/sequence_parallel", "\"yes\"", "plan.json: parts[1].sequence_parallel: a string where true or false belongs"},
      {"/pipeline/stages", "0", "plan.json: pipeline.stages: 0 is not a positive integer"},
      {"/pipeline/stages", "3", "plan.json: pipeline.meshes: 2 meshes for 3 stages (one mesh per stage)"},
      {"/pipeline/micro_batches", "0", "plan.json: pipeline.micro_batches: 0 is not a positive integer"},
      {"/pipeline/micro_batches", "3", "plan.json: pipeline.micro_batches: dp 2 x 3 micro-batches x 2 chunks do not divide the batch of 16"},
      {"/pipeline/cuts", "\"0-0,1-3,4-5\"", "plan.json: pipeline.cuts: '0-0,1-3,4-5' cuts 3 stages, the plan has 2"},
      {"/pipeline/cuts", "\"0-0,2-3\"", "plan.json: pipeline.cuts: stage 1 starts at block 2, not 1 (every block once, in order)"},
      {"/pipeline/cuts", "\"0-0;1-3\"", "plan.json: pipeline.cuts: '0-0;1-3' is not a list of FIRST-LAST block ranges (e.g. 0-5,6-11)"},
      {"/pipeline/schedule", "\"zigzag\"", "plan.json: pipeline.schedule: unknown pipeline schedule 'zigzag' (gpipe, 1f1b, eager-1f1b, zb-h1)"},
      {"/pipeline/meshes/1/dp", "0", "plan.json: pipeline.meshes[1].dp: 0 is not a positive integer"},
      {"/pipeline/meshes/1/schedule", "\"fast\"",
       "plan.json: pipeline.meshes[1].schedule: unknown schedule 'fast' (plain, default_checkpoint, optim_comm_checkpoint, "
       "overlap_checkpoint, oases)"},
      {"/parameters/0/spec", "\"[S(model), R]\"",
       "plan.json: parameters['wte']: spec '[S(model), R]': mesh axis 'model' does not exist (the mesh is dp=2 x tp=2)"},
      {"/parameters/0/spec", "\"[S(tp)/0, R]\"",
       "plan.json: parameters['wte']: spec '[S(tp)/0, R]': 0 segments in 'S(tp)/0' (1 to 1048576)"},
      {"/parameters/0/spec", "\"[S(tp), R] junk\"", "plan.json: parameters['wte']: spec '[S(tp), R] junk': 'junk' is not P(axis)"},
      {"/parameters/0/spec", "7", "plan.json: parameters[0].spec: an integer where a string belongs"},
      {"/parameters/0/name", "-", "plan.json: parameters[0]: a parameter has a \"name\" and a \"spec\""},
      {"/parameters", "\"wte\"", "plan.json: parameters: a string where a list or an object belongs"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good_file();
    nlohmann::json::json_pointer at(c.pointer);
    if (std::string(c.value) == "-") {
      j[at.parent_pointer()].erase(at.back());
    } else {
      j[at] = nlohmann::json::parse(c.value);
    }
    auto p = Plan::from_json(j, "plan.json");
    ASSERT_FALSE(p.is_ok()) << c.pointer << " = " << c.value << " was accepted";
    EXPECT_EQ(p.status().message(), c.message) << c.pointer << " = " << c.value;
  }
}

TEST(PlanFileTest, OptionalFieldsAndNumbersWithoutAFraction) {
  nlohmann::json j = good_file();
  j["mesh"].erase("ranks");  // the sizes give it
  j["version"] = 2.0;
  j["schedule"]["chunks"] = 4e0;
  j["batch"] = 32;
  auto p = Plan::from_json(j, "plan.json");
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->mesh().ranks, 4);
  EXPECT_EQ(p->version, 2);
  EXPECT_EQ(p->mesh().chunks, 4);
  // a plan of parameter specs alone (version 1, written by hand)
  auto map = Plan::from_json(nlohmann::json::parse(R"j({"parameters": {"wte": "[R, S(tp)] P(dp)"}})j"), "map.json");
  ASSERT_TRUE(map.is_ok()) << map.status().message();
  EXPECT_EQ(map->mesh().ranks, 0);
}

TEST(PlanFileTest, ReadValidatesBeforeReturning) {
  const std::string path = ::testing::TempDir() + "/oases_bad_chunks.json";
  nlohmann::json j = good_file();
  j["schedule"]["chunks"] = 0;
  std::ofstream(path) << j.dump();
  auto r = Plan::read(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), path + ": schedule.chunks: 0 is not a positive integer");
  // not JSON, not an object, no file
  std::ofstream(path) << "{\"schedule\": ";
  EXPECT_EQ(Plan::read(path).status().message(), path + ": not valid JSON");
  std::ofstream(path) << "[1, 2]";
  EXPECT_EQ(Plan::read(path).status().message(), path + ": a plan is a JSON object, not a list");
  EXPECT_EQ(Plan::read(path + ".none").status().message(), path + ".none: no such plan file");
}

TEST(PlanFileTest, WrittenPlansReadBack) {
  // what is not fixed (chunks 0: the schedule's default; a pipeline's micro-batches) is left out
  Plan p = Plan::from_parts({{"embedding", {2, false}}, {"head", {2, false}}}, 4, "oases", 0);
  p.stages = {p.mesh(), p.mesh()};
  nlohmann::json j = p.to_json();
  EXPECT_FALSE(j["schedule"].contains("chunks")) << j.dump();
  EXPECT_FALSE(j["pipeline"].contains("micro_batches")) << j.dump();
  auto back = Plan::from_json(j, "written.json");
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->mesh().chunks, 0);
  EXPECT_EQ(back->mesh().chunk_count(), 2);
  EXPECT_EQ(back->to_json(), Plan::from_json(back->to_json(), "again.json")->to_json());
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
