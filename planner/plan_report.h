// What oases-plan writes: the plan file of a chosen plan (the partitioned training graph of
// planner/plan.h plan_to_json with the Plan's own keys, the predictions added by the caller),
// the JSON of estimates, simulations and the baselines' choices, a one-line description of
// per-part layouts, and the plan written as JSON, HTML and DOT.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "graph/graph.h"
#include "planner/analysis.h"
#include "planner/cost_model.h"
#include "planner/plan.h"
#include "planner/simulator.h"

namespace oases {

// The plan file of `plan` on the forward graph: the partitioned training graph (one chunk) in the
// version 1 layout; with per-part layouts also the parts (with their mesh axes), the schedule and
// the shapes (version 2).
Expected<nlohmann::json> plan_report(const Graph& forward, const Plan& plan, const std::string& model_path);

nlohmann::json estimate_json(const PlanEstimate& e);
nlohmann::json simulation_json(const SimResult& sim, double memory_bytes);
// A search candidate's parts and schedule (the baselines in "prediction").
nlohmann::json choice_json(const ModelAnalysis& a, const PlanChoice& p, int64_t ranks);
// "embedding tp4 | layers 0-11: attn tp4 mlp tp2+sp | head tp4"
std::string describe_layouts(const ModelAnalysis& a, const std::vector<Layout>& layouts);

// The simulator's timeline of rank 0 as a Chrome trace document, `about` in "otherData".
nlohmann::json predicted_trace(const SimResult& sim, const nlohmann::json& about);

Status write_text_file(const std::string& path, const std::string& text);
// Writes the plan wherever asked: JSON, HTML page, Graphviz DOT (an empty path is skipped).
Status write_plan_files(const nlohmann::json& plan, const std::string& out, const std::string& html, const std::string& dot);

}  // namespace oases
