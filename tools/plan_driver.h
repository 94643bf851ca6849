// What oases-plan and oases-profile share: a model loaded at the shapes a plan is made for (shapes
// only: external weights stay unread), its training graph and analysis, the cluster and op-time
// model a plan is costed on, and the program one rank of a plan runs (built exactly as oases-train
// builds it: layouts, micro-batch chunks, partition, recomputation, schedule), which the
// simulator replays.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "executor/training.h"
#include "planner/analysis.h"
#include "planner/cost_model.h"
#include "planner/hybrid.h"
#include "planner/partition.h"
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

std::vector<PartLayout> part_layouts_of(const ModelAnalysis& a, const std::vector<Layout>& layouts);

struct RankProgram {
  Graph graph;                     // the rank's template (local shapes; constants unsliced)
  std::vector<ScheduledOp> order;  // empty: no --schedule (in line)
  // What the executor runs: the compiled program's graph (with its fused ops, executor/fusion.h)
  // and its instructions in order (what the simulator replays and the profile timed).
  Graph exec_graph;
  std::vector<ScheduledOp> exec_order;
  Strategy strategy;
  Mesh mesh;
  double param_bytes = 0;  // this rank's parameters
  double arena_bytes = 0;  // the executor's activation arena for this order
  int collectives = 0;
};

// The program rank 0 runs for `plan` on `ranks` ranks.
Expected<RankProgram> build_rank_program(const PlanningModel& m, const ModelAnalysis& a, const PlanChoice& plan, int64_t ranks);

// Simulated step of a plan (and the memory the executor would need).
struct Simulated {
  SimResult sim;
  double memory_bytes = 0;  // parameters, gradients and AdamW moments kept by the trainer, plus the arena
  RankProgram program;
};
Expected<Simulated> simulate_plan(const PlanningModel& m, const ModelAnalysis& a, const PlanChoice& plan, const ClusterSpec& cluster,
                                  const OpTimeModel& ops, const Profile* local_floor, bool trace);

// The machine at hand as a cluster: `ranks` ranks of this host (cores shared), the local
// communicator's link as the profile measured it (else a default), optionally behind an
// emulated link.
ClusterSpec this_machine(int64_t ranks, const Profile* profile, const std::string& emulate_link, int threads_per_rank);

// An op-time model for a cluster: the profile's samples (scaled for cores shared differently than
// when it was measured) or the device's roofline.
OpTimeModel op_time_model(const ClusterSpec& cluster, const Profile* profile, int64_t ranks, int threads_per_rank);

}  // namespace oases
