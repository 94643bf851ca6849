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

constexpr int kPlanVersion = 1;

nlohmann::json plan_to_json(const Graph& global, const PartitionedGraph& pg, const ShardingResult& sr, const Strategy& s,
                            const std::string& model_path);

// "[S(tp), R]", "[S(tp)/3, R] P(dp)" -> spec over `mesh`; errors name the text.
Expected<ShardingSpec> parse_spec(const std::string& text, const Mesh& mesh);

// Strategy from a plan file: its "parameters" (a list of {name, spec} or a map name -> spec) and
// its mesh (which must agree with opt.tp/opt.dp). Unknown names are errors.
Expected<Strategy> strategy_from_plan_file(const std::string& path, const Graph& g, const StrategyOptions& opt);

}  // namespace oases
