// From model + plan + rank to the program one rank runs, in two phases so that N ranks of one
// process share the global work:
//
//   build_global_program (once): the plan's layouts on the forward graph (Megatron's split, per-part
//     layouts, or a plan file's specs) -> mixed precision and micro-batch chunks (before autodiff)
//     -> training graph (graph/training_graph.h) -> batch split -> partition into the per-rank
//     template (planner/partition.h);
//   build_rank_program (per rank): the rank's local graph (constants sliced to its shards) ->
//     recomputation -> schedule (planner/schedule.h) -> CPU fusion (graph/passes/fusion.h) ->
//     memory plan (planner/memory_plan.h).
//
// oases-train runs the result (the executor binds kernels to it), oases-plan --simulate replays it,
// oases-profile times it: all three run the same program.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/passes/fusion.h"
#include "graph/program_order.h"
#include "graph/training_graph.h"
#include "planner/memory_plan.h"
#include "planner/partition.h"
#include "planner/pipeline.h"
#include "planner/plan.h"
#include "planner/reshard_nodes.h"
#include "planner/schedule.h"
#include "planner/strategy.h"

namespace oases {

// A graph with its instructions in order, fused for the CPU kernels and memory-planned: what the
// executor binds kernels to (executor/executor.h compile_program).
struct ProgramLayout {
  Graph graph;                     // with the fused ops of the oases.cpu (oases.device) domain where fusion ran
  std::vector<ScheduledOp> order;  // every live node once (collectives as a start and a wait)
  MemoryPlan memory;
  FusionStats fusion;
  ReshardPlans reshards;  // the transfer plan of each Reshard node, made as the program was built
};

// Which executor fusion a program gets (graph/passes/fusion.h): kCpu on the CPU, kDevice (the
// products' epilogues) on a device, kNone when not asked for or turned off by OASES_NO_FUSION=1.
enum class Fusion { kNone, kCpu, kDevice };
Fusion fusion_for(bool fuse, const std::string& device);

// Fuses (as `fusion` says) and memory-plans `g` under `schedule` (empty: topological order, collectives
// run in line); values in `keep` stay readable after a run. Errors name a node the schedule runs
// other than once, or an output without a shape.
Expected<ProgramLayout> lay_out_program(Graph g, std::vector<ScheduledOp> schedule, const std::set<ValueId>& keep, Fusion fusion);

struct GlobalProgramOptions {
  std::string model_path;  // names the model in errors
  std::string plan_path;   // the plan's file, when it came from one: its specs rule, errors name it
  bool partition = false;  // partition even a one-rank run (plan reports)
  // pipeline stages cut the graph at block boundaries: gradient buckets must not span stages, so
  // the gradient all-reduces stay one per gradient there
  bool pipeline = false;
  // the stages' block ranges (with `pipeline`): every value one stage makes and another reads is
  // made whole on its stage (oases.Whole), so a tied weight's gradient, partial over dp, is reduced
  // before it crosses (Megatron's order: each stage's all-reduce, then the sum of the two)
  std::vector<StageCut> stage_cuts;
};

// What every rank of a run shares.
struct GlobalProgram {
  Plan plan;
  int64_t world = 1;
  TrainingGraph train;                          // global shapes, every chunk
  Strategy strategy;                            // the plan on this model: mesh, parameter and input specs
  std::optional<PartitionedGraph> partitioned;  // the per-rank template (world > 1, or asked for)
  ShardingResult sharding;                      // every value's spec, with `partitioned`
  std::vector<ShardingSpec> param_specs;        // per trainable parameter
  std::vector<Shape> param_shapes;              // global
  const Mesh& mesh() const { return strategy.mesh; }
};

// `plan` must name the mesh (tp x dp or parts over `world` ranks); its schedule's chunks and its
// dtype shape the training graph.
Expected<GlobalProgram> build_global_program(Graph forward, const TrainingSpec& spec, const Plan& plan, int64_t world,
                                             const GlobalProgramOptions& opts);

struct RankProgramOptions {
  std::string device = "cpu";   // fusion is CPU-only
  bool fuse = true;             // CPU fusion and in-place outputs
  std::set<ValueId> keep;       // values readable after a run (besides the outputs)
  bool slice_constants = true;  // false: constants keep the global tensors (shape-only programs)
};

struct RankProgram {
  int64_t rank = 0;
  Mesh mesh;                                // the mesh of the run
  TrainingGraph train;                      // the rank's training graph: local shapes, recomputation applied
  std::optional<ScheduleOptions> schedule;  // unset: no schedule, instructions in line
  std::vector<ScheduledOp> order;           // the scheduler's order (empty without a schedule)
  RecomputeReport recompute;
  std::map<int, int64_t> saved_bytes;  // activations kept for backward per layer (with a schedule)
  std::map<int, int> saved_count;
  ProgramLayout program;   // what the executor runs (fused, memory-planned)
  double param_bytes = 0;  // this rank's parameters
  // of them, the bytes this rank's optimizer updates and keeps moments for (all, or under the
  // distributed optimizer its pieces: updated_bytes_of)
  double updated_bytes = 0;
  int collectives = 0;     // inserted by the partition
};

Expected<RankProgram> build_rank_program(const GlobalProgram& global, int64_t rank, const RankProgramOptions& opts = {});

// The bytes of parameter `param` (local shapes of `g`) a rank's optimizer updates: its piece when
// the program reduce-scatters its gradient `grad` (FlatReduceScatter), or under the distributed
// optimizer (`zero`) when it is replicated over the mesh's dp axis (its gradient whole: a tied
// table across stages, executor/zero.h add_whole); else all of it.
double updated_bytes_of(const Graph& g, ValueId param, ValueId grad, const ShardingSpec& spec, const Mesh& mesh, bool zero);

// One call: the global program and rank `rank`'s program of `forward` under `plan`.
Expected<RankProgram> build_rank_program(const Graph& forward, const Plan& plan, int64_t rank, const TrainingSpec& spec = {},
                                         const RankProgramOptions& opts = {});

}  // namespace oases
