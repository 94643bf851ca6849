// Plans for people and programs: the partitioned training graph as versioned JSON (every value's
// spec and local shape, every op's layout, every inserted collective with its bytes per step,
// per-rank parameter memory), and reading a plan (or a plain map of initializer -> spec) back into
// a Strategy for `oases-train --plan`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "planner/partition.h"
#include "planner/propagation.h"
#include "planner/strategy.h"

namespace oases {

// Version 2 adds per-part layouts ("parts": tp degree and sequence parallelism of the embedding,
// each attention and MLP, and the head), the mesh's compound axes ("mesh.parts"), the shapes and
// schedule the plan was made for ("batch", "seq", "schedule") and the predictions; version 1 files
// (one tp x dp mesh) still read.
constexpr int kPlanVersion = 2;

// What a plan fixes about a run besides the weights' specs.
struct PlanSettings {
  int version = 1;
  int64_t ranks = 0;           // 0: the plan does not say
  int64_t tp = 0, dp = 0;      // one tp x dp mesh (v1, or v2 with one degree); 0 for mixed parts
  int64_t batch = 0, seq = 0;  // 0: not fixed
  std::string schedule;        // "" when not fixed
  int64_t chunks = 0;
  bool vocab_parallel = true;
  std::vector<PartLayout> parts;  // v2
};
Expected<PlanSettings> read_plan_settings(const std::string& path);
// Fills what the command line left open (<= 0 or empty) from the plan; errors name a conflict.
Status adopt_plan_settings(const PlanSettings& p, const std::string& path, int64_t world, int64_t* tp, int64_t* dp, int64_t* batch,
                           int64_t* seq, std::string* schedule, int64_t* chunks);

nlohmann::json plan_to_json(const Graph& global, const PartitionedGraph& pg, const ShardingResult& sr, const Strategy& s,
                            const std::string& model_path);

// "[S(tp), R]", "[S(tp)/3, R] P(dp)" -> spec over `mesh`; errors name the text.
Expected<ShardingSpec> parse_spec(const std::string& text, const Mesh& mesh);

// Strategy from a plan file: its "parameters" (a list of {name, spec} or a map name -> spec) and
// its mesh (which must agree with opt.tp/opt.dp). Unknown names are errors. A version 2 plan with
// mixed "parts" lays them out on `g` (the forward graph; planner/hybrid.h inserts the Layout
// markers) and checks its "parameters" against the specs that gives.
Expected<Strategy> strategy_from_plan_file(const std::string& path, Graph& g, const StrategyOptions& opt);

}  // namespace oases
