// What oases-plan and oases-profile share: a model loaded at the shapes a plan is made for (shapes
// only: external weights stay unread), its training graph and analysis, the cluster and op-time
// model a plan is costed on, and the program one rank of a plan runs (planner/rank_program.h, the
// same as oases-train runs), which the simulator replays.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/training_graph.h"
#include "planner/analysis.h"
#include "planner/cost_model.h"
#include "planner/coverage.h"
#include "planner/hybrid.h"
#include "planner/partition.h"
#include "planner/rank_program.h"
#include "planner/search.h"
#include "planner/simulator.h"
#include "tools/model_loader.h"

namespace oases {

struct PlanningModel {
  std::string path;
  ImportOptions opts;
  Graph forward;        // canonical, at [batch, seq]
  TrainingGraph train;  // loss + backward, one chunk
  int64_t batch = 0, seq = 0;
};

// Binds the token inputs to [batch, seq] (0: the model's own, else 8 x 64) and builds the
// training graph.
Expected<PlanningModel> load_planning_model(const std::string& path, ImportOptions opts, int64_t batch, int64_t seq);

// The tp degrees oases-profile times (--degrees; empty: every candidate of `a`), each checked to
// divide the model on `ranks` ranks; the error names the degree, the model and the candidates.
Expected<std::vector<int64_t>> profiled_degrees(const ModelAnalysis& a, const std::vector<int64_t>& asked, const std::string& model,
                                               int64_t ranks);

// A profile must hold a sample of every op shape the planner prices in `space` (planner/coverage.h;
// a GPU profile: of every op). The error names the first one missing, where it is priced, and the
// oases-profile command that measures them all (`bind`: the --dim/--shape flags the model took).
Status check_profile_covers(const Profile& profile, const std::string& profile_file, const PlanningModel& pm, const ModelAnalysis& a,
                            const PricingSpace& space, const BindingFlags& bind);

// The program rank 0 runs for `plan` (its mesh over plan.mesh().ranks ranks), built as oases-train
// builds it (planner/rank_program.h), constants unsliced.
Expected<RankProgram> planned_rank_program(const PlanningModel& m, const Plan& plan);

// Simulated step of a plan (and the memory the executor would need).
struct Simulated {
  SimResult sim;
  double memory_bytes = 0;  // parameters, gradients and AdamW moments kept by the trainer, plus the arena
  RankProgram program;
};
Expected<Simulated> simulate_plan(const PlanningModel& m, const Plan& plan, const ClusterSpec& cluster, const OpTimeModel& ops,
                                  const Profile* local_floor, bool trace);

// Collective matmuls beside an interleaved schedule: the chain cost model cannot tell what they
// add to the other chunks' overlap (both hide the same communication), so the replayed programs
// decide between the choice's collective matmuls, every sequence-parallel part's (but the
// embedding's), and none. `choice` takes the fastest; returns a line for people ("" when there was
// nothing to decide: no sequence-parallel part, or a schedule without interleaving).
Expected<std::string> choose_collective_matmuls_by_simulation(const PlanningModel& m, const ModelAnalysis& a, int64_t ranks,
                                                              const ClusterSpec& cluster, const OpTimeModel& ops, const Profile* local_floor,
                                                              PlanChoice* choice);

// The chain cost model ranks plans by what it can tell apart; the replayed programs see what it
// cannot (chunks' collectives queued on one channel, executor overheads, cores shared). Simulates
// the best `limit` of `candidates` (the search's best per schedule and chunk count, fastest first
// by the chain model) and `choice` itself, and makes `choice` the fastest simulated. Returns a line
// for people ("" when there was nothing to compare). A candidate whose replayed program needs more
// than `memory_limit` bytes per rank (> 0; the executor's arena, which the chain model only
// estimates) is not taken. `require_sp` (--sequence-parallel): only candidates with sequence
// parallelism, and no variant without it.
Expected<std::string> rerank_by_simulation(const PlanningModel& m, const ModelAnalysis& a, int64_t ranks, const ClusterSpec& cluster,
                                           const OpTimeModel& ops, const Profile* local_floor, const std::vector<PlanChoice>& candidates,
                                           size_t limit, double memory_limit, PlanChoice* choice, bool require_sp = false);

}  // namespace oases
