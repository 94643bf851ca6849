// oases-plan's command: its options (filled by CLI11 in tools/oases_plan.cpp) and the search it runs
// for --gpus N (tools/plan_command.cpp), with the state the search leaves for the lines it prints
// and the plan file it writes (tools/plan_output.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/pipeline_replay.h"
#include "planner/pipeline_search.h"
#include "planner/profile.h"
#include "tools/model_loader.h"
#include "tools/plan_driver.h"

namespace oases {

// Every oases-plan flag; the defaults are the flags' defaults.
struct PlanOptions {
  std::string model;
  // the search (--gpus N)
  int64_t gpus = 0;
  std::string cluster_file, profile_file;
  double memory_gib = 0;  // 0: the device's
  bool simulate = false;
  int64_t sim_candidates = 24;
  int64_t sim_pipelines = 4;
  std::string trace;                                // --trace FILE
  std::string schedules, chunks, degrees, pp_list;  // comma lists as given
  bool uniform = false, no_sp = false, no_cm = false, no_pipeline = false;
  // --zero: the distributed optimizer (ZeRO stage 1): "1" on, "0" off, "auto" the pipeline search
  // weighs both (the one-mesh search plans without)
  std::string zero = "auto";
  std::string dtype, reference_pipeline, emulate_link;
  int64_t hosts = 0;
  // a given Megatron split (--tp [--dp] --strategy megatron)
  int64_t tp = 0, dp = 0;
  std::string strategy;
  bool no_vocab = false, seq_par = false;
  // both
  int64_t batch = 0, seq = 0;
  std::string out, html, dot, render;
  BindingFlags bind;
};

// One --gpus search: what it was made on and what it found. The cost model refers to `a`,
// `cluster` and `ops`, so a PlanSearch stays where it was made.
struct PlanSearch {
  std::optional<Profile> profile;
  ClusterSpec cluster;
  bool at_hand = false;  // no --cluster: planned for the machine at hand
  std::string dtype, dtype_why;
  OpTimeModel ops;
  PlanningModel pm;
  ModelAnalysis a;
  double limit = 0;  // bytes per GPU
  std::optional<CostModel> cm;
  SearchOptions so;
  PipelinePlanOptions po;
  bool pipelined = false;  // the pipeline search ran
  SearchResult best, megatron, dp;
  PipelinePlan pipe;
  std::optional<PipelineRanking> pipe_ranking;  // --simulate: the pipeline candidates replayed (pipe is its winner)
  double search_ms = 0;
  // wall time of each phase (oases-plan prints them): the model imported and its training graph
  // built, the analysis and cost model, the one-mesh search, the baselines' searches (Megatron, data
  // parallelism), the pipeline search, --simulate's replays, the plan file (and --html, --dot)
  struct Phases {
    double import_ms = 0, analysis_ms = 0, search_ms = 0, baselines_ms = 0, pipeline_ms = 0, simulate_ms = 0, plan_file_ms = 0;
  } phases;
  std::string reranked;  // --simulate's re-ranking, for people ("" when none)

  PlanSearch() = default;
  PlanSearch(const PlanSearch&) = delete;
  PlanSearch& operator=(const PlanSearch&) = delete;
};

// Comma lists: the non-empty items; the items as numbers of at least `least` (--chunks 1,2,4;
// --pp 2,4), the error naming `flag` and `what`.
std::vector<std::string> split_list(const std::string& s);
Expected<std::vector<int64_t>> int_list(const std::string& text, const char* flag, int64_t least, const char* what);

// oases-plan MODEL --gpus N ...: searches, prints, writes the files asked for; the exit code.
int plan_search_command(const PlanOptions& o);

// What the search prints and writes (tools/plan_output.cpp); the cost model caches what it prices,
// hence PlanSearch& where the estimates are read.
void print_plan_estimates(const PlanOptions& o, PlanSearch& s);
Status print_reference_pipeline(const PlanOptions& o, const PlanSearch& s);
// --simulate: each plan's program replayed; returns the plan file's "simulation" (may change the
// chosen plan's collective matmuls)
Expected<nlohmann::json> simulate_plans(const PlanOptions& o, PlanSearch& s);
Status write_chosen_plan(const PlanOptions& o, PlanSearch& s, const nlohmann::json& sims, bool pipeline_wins);

}  // namespace oases
