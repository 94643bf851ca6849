// A pipeline plan priced from the programs that run (issue 30 item 5): each stage's program (built
// as oases-train builds it, planner/pipeline_program.h) is replayed by the one-rank simulator
// (planner/simulator.h), and the pipeline simulator (planner/pipeline.h) composes what the replays
// measured.
//
// Per stage, the replay's compute-thread time of each instruction goes to the pipeline step of its
// node (its micro-batch, forward or backward: recomputation is backward work) or, for nodes of no
// micro-batch (weight casts, gradient sums, the data-parallel all-reduces), to the stage's
// "other" time. A stage's forward and backward per micro-batch are the means over its
// micro-batches. The Reshards between stages cost the compute thread only their hand-off in the
// replay (they run on channel 1); their time is what their transfer plans predicted for the plan's
// machine (planner/reshard_nodes.h): per boundary, the forward transfers of one micro-batch; the
// transfers of values of no micro-batch (a tied table's gradient sum between the first and last
// stages) once a step. The step is the pipeline's makespan, then the slowest stage's other time,
// the once-a-step transfers and the slowest optimizer step.
#pragma once

#include <vector>

#include "planner/cluster_spec.h"
#include "planner/pipeline.h"
#include "planner/pipeline_program.h"
#include "planner/pipeline_search.h"
#include "planner/profile.h"
#include "planner/simulator.h"

namespace oases {

struct StageReplay {
  int stage = 0;
  int64_t world_rank = 0;                // the rank whose program was replayed (the stage's first)
  double forward_s = 0, backward_s = 0;  // one micro-batch, the mean
  double other_s = 0;                    // nodes of no micro-batch
  double optimizer_s = 0;
  // what the rank holds: parameters and AdamW's two moments kept by the trainer, plus the
  // executor's activation arena (gradients, the micro-batches in flight, transfer buffers)
  double memory_bytes = 0;
  SimResult sim;  // the whole program's replay (as one rank alone: transfers arrive at once)
};

struct PipelineReplay {
  std::vector<StageReplay> stages;
  PipelineTimes times;  // what the pipeline simulator was given
  PipelineSim sim;
  double exchange_s = 0;  // once a step, after the flush: the transfers of values of no micro-batch
  double step_s = 0;
};

// Builds and replays the first rank's program of every stage of `sg` on `cluster` with `ops`
// (`local_floor` as SimOptions says); the transfers planned for `cluster`'s hosts and links.
Expected<PipelineReplay> replay_pipeline(const StageGlobals& sg, const ClusterSpec& cluster, const OpTimeModel& ops, const Profile* local_floor);
// The same for a plan of stages on `forward` (the model at the plan's shapes; `model_path` names it
// in errors): its stage programs built first.
Expected<PipelineReplay> replay_pipeline(const Graph& forward, const std::string& model_path, const Plan& plan, const ClusterSpec& cluster,
                                         const OpTimeModel& ops, const Profile* local_floor);

// What the pipeline search found, re-ranked by its programs (oases-plan --simulate): the search's
// choice and its runners-up (PipelinePlan::runners_up), each replayed; the fastest replayed step
// whose programs fit `memory_limit` bytes a rank (> 0: the largest stage's replayed memory) wins.
// When none fits, the search's choice stays (`none_fits`). A runner-up of more than twice the
// search's choice's chunks (M x K, what a replay's cost grows with) is not replayed.
struct PipelineRanking {
  std::vector<PipelinePlan> tried;      // the search's choice first, then its runners-up
  std::vector<PipelineReplay> replays;  // per plan tried
  std::vector<double> memory_bytes;     // per plan tried: its largest stage's replayed memory
  size_t best = 0;
  bool none_fits = false;
  int unreplayed = 0;  // runners-up of more than twice the chunks (M x K) of the search's choice
  std::string text;  // for people: each plan tried, predicted and replayed
};
Expected<PipelineRanking> rank_pipelines_by_replay(const Graph& forward, const std::string& model_path, const PipelinePlan& found,
                                                   double memory_limit, const ClusterSpec& cluster, const OpTimeModel& ops,
                                                   const Profile* local_floor);

}  // namespace oases
