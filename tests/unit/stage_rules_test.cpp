// The pipeline's training rules (executor/stage_rules.h) on thread ranks: the loss comes from the
// last stage, the gradient norm counts a tied weight once, a disagreement on the transfers names
// the ranks, a per-stage checkpoint keeps a tied weight only in its first holder's file under one
// save id, and each stage's tensors are pooled on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "executor/launcher.h"
#include "executor/stage_rules.h"
#include "executor/training.h"
#include "tests/common/onnx_builder.h"

namespace fs = std::filesystem;

namespace oases {
namespace {

using testutil::TempDir;

// Runs `body` on every world rank of a pipeline whose stage s has stage_ranks[s] ranks (one tp
// axis), as oases-train does: a world runtime, and each rank's stage runtime on its stage's
// contiguous ranks. `info_of(world_rank)` is the rank's StageProgramInfo (its stage is set here).
using InfoOf = std::function<StageProgramInfo(int world_rank)>;
Status run_pipeline(const std::vector<int64_t>& stage_ranks, const InfoOf& info_of,
                    const std::function<Status(StageRules&, RankRuntime& stage_rt)>& body, Plan* plan = nullptr) {
  Plan pl;
  pl.stages.assign(stage_ranks.size(), MeshPlan{});
  for (size_t s = 0; s < stage_ranks.size(); ++s) pl.stages[s].ranks = stage_ranks[s];
  if (plan) *plan = pl;
  return run_thread_ranks(pl.world(), Mesh{{"world"}, {pl.world()}, {}}, LinkModel{}, 1, 30, [&](RankRuntime& world) -> Status {
    const int st = pl.stage_of_rank(world.rank());
    PlacedMesh placed = PlacedMesh::contiguous(Mesh{{"tp"}, {pl.stage_ranks(st)}, {}}, pl.first_rank(st));
    OASES_ASSIGN_OR_RETURN(auto stage_rt, RankRuntime::create(world.communicator(), placed));
    StageProgramInfo info = info_of(world.rank());
    info.stage = st;
    StageRules rules(*stage_rt, world, std::move(info), static_cast<int>(pl.num_stages()));
    return body(rules, *stage_rt);
  });
}

StageProgramInfo stage_with(std::vector<bool> counts_in_norm, std::vector<std::string> transfers = {}) {
  StageProgramInfo info;
  info.counts_in_norm = std::move(counts_in_norm);
  info.transfers = std::move(transfers);
  return info;
}

TEST(StageRules, CountedSumSquaresZeroesTiedCopies) {
  EXPECT_EQ(counted_sum_squares({4, 9, 16}, {true, false, true}), (std::vector<double>{4, 0, 16}));
  EXPECT_EQ(counted_sum_squares({}, {}), std::vector<double>{});
}

TEST(StageRules, DropTiedCopiesRemovesTheCopyAndItsOptimizerState) {
  Tensor t = Tensor::from_f32({1, 2}, {2});
  std::map<std::string, Tensor> tensors;
  for (const char* n : {"b", "b.m", "b.v", "wte", "wte.m", "wte.v", "wte.momentum"}) tensors[n] = t;
  drop_tied_copies(&tensors, {"b", "wte"}, {true, false});
  std::vector<std::string> left;
  for (const auto& [name, x] : tensors) left.push_back(name);
  EXPECT_EQ(left, (std::vector<std::string>{"b", "b.m", "b.v"}));
}

TEST(StageRules, TransferListsRoundTripThroughOneString) {
  std::vector<std::string> lines{"0>1 0 h [2, 4] R -> R", "1>0 0 dh [2, 4] R -> R"};
  EXPECT_EQ(split_lines(join_lines(lines)), lines);
  EXPECT_EQ(join_lines({}), "");
  EXPECT_TRUE(split_lines("").empty());
}

TEST(StageRules, APlainRunIsItsOwnLastStage) {
  Status st = run_thread_ranks(1, Mesh{{"tp"}, {1}, {}}, LinkModel{}, 1, 30, [](RankRuntime& rt) -> Status {
    StageRules rules(rt);
    EXPECT_FALSE(rules.piped());
    EXPECT_TRUE(rules.lead());
    EXPECT_TRUE(rules.last_stage());
    EXPECT_EQ(rules.stage(), -1);
    EXPECT_EQ(rules.from_last_stage(2.5), 2.5);
    EXPECT_EQ(rules.global_norm({9, 16}, std::vector<ShardingSpec>(2)), 5.0);
    EXPECT_EQ(rules.of_stage(std::vector<int>{1, 2, 3}), (std::vector<int>{1, 2, 3}));
    return Status::ok();
  });
  EXPECT_TRUE(st.is_ok()) << st.message();
}

TEST(StageRules, TheLossComesFromTheLastStagesFirstRank) {
  // stages of 1, 1 and 2 ranks: world ranks 2 and 3 are the last stage, 2 its rank 0
  std::vector<double> seen(4, -1);
  std::mutex mu;
  Status st = run_pipeline(
      {1, 1, 2}, [](int) { return StageProgramInfo{}; },
      [&](StageRules& rules, RankRuntime&) -> Status {
        double loss = rules.from_last_stage(10.0 * rules.world_rank() + 1);  // only the last stage's is real
        std::lock_guard<std::mutex> lock(mu);
        seen[static_cast<size_t>(rules.world_rank())] = loss;
        EXPECT_EQ(rules.last_stage(), rules.world_rank() >= 2);
        EXPECT_EQ(rules.lead(), rules.world_rank() == 0);
        return Status::ok();
      });
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(seen, (std::vector<double>{21, 21, 21, 21}));
}

TEST(StageRules, TheGradientNormCountsATiedWeightOnce) {
  // stage 0 (1 rank): wte (first holder), a; stage 1 (tp 2): b split over tp, wte's copy
  // (replicated). Σ g²: wte 4, a 9, b 16 + 9 over the two shards; the copy's 4 must not count.
  std::vector<double> norms(3, -1);
  std::mutex mu;
  Status st = run_pipeline(
      {1, 2},
      [](int r) {
        return stage_with(r == 0 ? std::vector<bool>{true, true} : std::vector<bool>{true, false});
      },
      [&](StageRules& rules, RankRuntime& rt) -> Status {
        std::vector<double> ss;
        std::vector<ShardingSpec> specs;
        if (rules.stage() == 0) {
          ss = {4, 9};
          specs = {ShardingSpec::replicated(2), ShardingSpec::replicated(1)};
        } else {
          ss = {rt.rank() == 0 ? 16.0 : 9.0, 4};
          specs = {ShardingSpec::replicated(2).with_dim(0, 0), ShardingSpec::replicated(2)};
        }
        double n = rules.global_norm(ss, specs);
        std::lock_guard<std::mutex> lock(mu);
        norms[static_cast<size_t>(rules.world_rank())] = n;
        return Status::ok();
      });
  ASSERT_TRUE(st.is_ok()) << st.message();
  const double want = std::sqrt(4.0 + 9.0 + 16.0 + 9.0);
  for (double n : norms) EXPECT_EQ(n, want);
}

TEST(StageRules, ATransferListMismatchNamesTheRanks) {
  const std::string send = "0>1 0 h [2, 4] R -> R", other = "0>1 0 h [2, 8] R -> R";
  Plan pl;
  // agreeing lists pass on every rank
  Status ok = run_pipeline(
      {1, 2}, [&](int) { return stage_with({}, {send}); }, [&](StageRules& rules, RankRuntime&) { return rules.check_transfers(pl); }, &pl);
  EXPECT_TRUE(ok.is_ok()) << ok.message();
  // world rank 2 (stage 1's second rank) expects another shape: every rank names it
  std::vector<std::string> errors(3);
  std::mutex mu;
  Status off = run_pipeline(
      {1, 2}, [&](int r) { return stage_with({}, {r == 2 ? other : send}); },
      [&](StageRules& rules, RankRuntime&) -> Status {
        Status s = rules.check_transfers(pl);
        std::lock_guard<std::mutex> lock(mu);
        errors[static_cast<size_t>(rules.world_rank())] = s.message();
        return Status::ok();
      },
      &pl);
  ASSERT_TRUE(off.is_ok()) << off.message();
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("world ranks 2 (stage 1) and 0 (stage 0) disagree on their transfers between stages 0 and 1"), std::string::npos) << e;
    EXPECT_NE(e.find("'" + other + "'"), std::string::npos) << e;
  }
}

// Per-stage checkpoint: stage 0 (1 rank) first holds wte, stage 1 (tp 2) has wte's copy.
struct StageSave {
  std::vector<std::string> names;
  std::vector<bool> counts;
};

Checkpoint stage_checkpoint(const std::vector<std::string>& names, int64_t step) {
  Checkpoint ck;
  ck.fingerprint = "model-x";
  ck.step = step;
  ck.optimizer_kind = "adamw";
  ck.optimizer_t = step;
  Tensor t = Tensor::from_f32({1, 2}, {2});
  for (const std::string& n : names) {
    ck.tensors[n] = t;
    ck.tensors[n + ".m"] = t;
    ck.tensors[n + ".v"] = t;
  }
  return ck;
}

const StageSave kStage0{{"wte", "a"}, {true, true}};
const StageSave kStage1{{"b", "wte"}, {true, false}};

Status save_pipeline(const std::string& path) {
  return run_pipeline(
      {1, 2}, [](int r) { return stage_with(r == 0 ? kStage0.counts : kStage1.counts); },
      [&](StageRules& rules, RankRuntime&) -> Status {
        const StageSave& mine = rules.stage() == 0 ? kStage0 : kStage1;
        return rules.save(stage_checkpoint(mine.names, 7), path, mine.names);
      });
}

std::set<std::string> names_in(const std::map<std::string, Tensor>& tensors) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) names.insert(name);
  return names;
}

TEST(StageRules, APerStageCheckpointKeepsATiedWeightInItsFirstHolderOnly) {
  TempDir dir;
  const std::string path = (dir.path() / "ck").string();
  Status st = save_pipeline(path);
  ASSERT_TRUE(st.is_ok()) << st.message();
  auto s0 = load_checkpoint(stage_checkpoint_path(path, 0, 2));
  auto s1 = load_checkpoint(stage_checkpoint_path(path, 1, 2));
  ASSERT_TRUE(s0 && s1);
  EXPECT_EQ(names_in(s0->tensors), (std::set<std::string>{"a", "a.m", "a.v", "wte", "wte.m", "wte.v"}));
  EXPECT_EQ(names_in(s1->tensors), (std::set<std::string>{"b", "b.m", "b.v"}));
  // the manifest names every stage file, and all carry one save id
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(text.substr(0, 9), "OASESPP1\n");
  nlohmann::json m = nlohmann::json::parse(text.substr(9));
  EXPECT_EQ(m["files"], (nlohmann::json{"ck.stage0-of-2", "ck.stage1-of-2"}));
  EXPECT_EQ(m["step"], 7);
  nlohmann::json e0 = nlohmann::json::parse(s0->extra_json), e1 = nlohmann::json::parse(s1->extra_json);
  EXPECT_EQ(e0["pipeline_save"], m["save_id"]);
  EXPECT_EQ(e1["pipeline_save"], m["save_id"]);
  EXPECT_EQ(e0["stage"], 0);
  EXPECT_EQ(e1["stage"], 1);
  // and the whole loads as one checkpoint
  auto whole = load_checkpoint(path);
  ASSERT_TRUE(whole) << whole.status().message();
  EXPECT_EQ(names_in(whole->tensors).size(), 9u);
  EXPECT_EQ(whole->step, 7);
}

TEST(StageRules, AStageThatCannotWriteFailsTheSaveOnEveryRankAndNoManifestIsWritten) {
  TempDir dir;
  const std::string path = (dir.path() / "ck").string();
  // a non-empty folder where stage 1's file goes: its rename fails
  fs::create_directories(stage_checkpoint_path(path, 1, 2) + "/busy");
  std::vector<std::string> errors(3);
  std::mutex mu;
  Status st = run_pipeline(
      {1, 2}, [](int r) { return stage_with(r == 0 ? kStage0.counts : kStage1.counts); },
      [&](StageRules& rules, RankRuntime&) -> Status {
        const StageSave& mine = rules.stage() == 0 ? kStage0 : kStage1;
        Status s = rules.save(stage_checkpoint(mine.names, 7), path, mine.names);
        std::lock_guard<std::mutex> lock(mu);
        errors[static_cast<size_t>(rules.world_rank())] = s.message();
        return Status::ok();
      });
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(errors[0], path + ": not written: another stage could not write its file");
  EXPECT_NE(errors[1], "");  // the stage's own error
  EXPECT_EQ(errors[2], errors[0]);
  EXPECT_FALSE(fs::exists(path));
}

TEST(StageRules, PooledGivesEveryStagesTensorsOnEveryRank) {
  std::vector<std::set<std::string>> seen(3);
  std::mutex mu;
  Status st = run_pipeline(
      {1, 2}, [](int) { return StageProgramInfo{}; },
      [&](StageRules& rules, RankRuntime& rt) -> Status {
        std::map<std::string, Tensor> full{{fmt::format("s{}", rules.stage()), Tensor::from_f32({1.0f * rules.stage()}, {1})}};
        if (rt.rank() == 1) full["only_rank1"] = Tensor::from_f32({3}, {1});  // not its stage's rank 0: not sent
        std::map<std::string, Tensor> all = rules.pooled(full);
        std::lock_guard<std::mutex> lock(mu);
        seen[static_cast<size_t>(rules.world_rank())] = names_in(all);
        return Status::ok();
      });
  ASSERT_TRUE(st.is_ok()) << st.message();
  for (const auto& s : seen) EXPECT_EQ(s, (std::set<std::string>{"s0", "s1"}));
}

}  // namespace
}  // namespace oases
