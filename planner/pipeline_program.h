// The program of one rank of a pipeline (issue 15): the training graph of the whole model,
// chunked into M micro-batches of K chunks each and partitioned over a stage's own mesh (its tp x dp
// layout and intra-stage schedule; stages may differ), is cut at block boundaries into stage graphs.
// Every stage's partition is of the same training graph, so the model's own values have the same
// ids in all of them: a value crossing between stages of different layouts is found by its id (a
// gradient, by its output slot), laid out as its sender's partition says on the sending mesh and as
// its receiver's says on the receiving one.
//
// Where nodes go:
//   * forward nodes of block b go to the stage holding b; the loss to the last stage; other forward
//     nodes that read activations follow their producers (the embedding sits in stage 0, the final
//     norm and the head in the last);
//   * forward nodes that read only inputs and constants (embeddings, masks, position and rotary
//     tables, weight casts and transposes) are copied into every stage that reads them, so masks
//     are computed where they are used and a tied weight is held by both stages that use it;
//   * backward and recompute nodes go with the forward node they derive from (a node copied into
//     several stages: the first of them); nodes derived from none (gradient sums) follow the
//     first stage among their inputs' producers.
// Every value read in a stage that another stage makes becomes an oases.Reshard between the two
// stage meshes (sender: the input is its tile, the output empty; receiver: no input, the value
// itself as output), on channel 1. A parameter held by several stages (a tied embedding and head)
// gets its summed gradient where the sum is made and sends it to the other holders, so every copy
// takes the same update and the copies stay bit-equal; the gradient norm counts it once.
//
// The order of a stage's instructions: its pipeline steps (planner/pipeline.h stage_steps), each
// step the instructions of that micro-batch's forward or backward in the intra-stage schedule's
// order (planner/schedule.h: chunks interleaved inside the micro-batch for overlap_checkpoint and
// oases); nodes of no micro-batch (weight transposes, gradient sums over micro-batches, the
// data-parallel all-reduces) as soon as their inputs are ready. The cross-stage transfers follow
// one global order (by their issue times in the pipeline simulated with unit times, then stage,
// direction, micro-batch and value), the same on every rank: each rank starts its transfers in
// that order, a send right after its producer and a receive right after the previous transfer, so
// no two ranks wait on each other in opposite orders.
#pragma once

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "planner/pipeline.h"
#include "planner/rank_program.h"
#include "planner/reshard.h"

namespace oases {

// Every node's stages (usually one; copied forward nodes several), by NodeId; errors name a node
// that cannot be placed.
struct StageAssignment {
  std::vector<std::vector<int>> stages;  // by NodeId; empty for dead ids
  std::vector<std::vector<int>> param_holders;  // per trainable parameter: the stages reading it
  int blocks = 0;
};
Expected<StageAssignment> assign_stages(const Graph& g, const std::vector<ValueId>& params, const std::vector<StageCut>& cuts, int stages);

// Marks every value that one stage makes and another reads with an oases.Whole node before its
// readers on the other stages (the partitioner reduces what is partial there, on the maker's stage,
// and dissolves the marker). Returns the number of marked values.
Expected<int> mark_stage_crossings(Graph& g, const std::vector<ValueId>& params, const std::vector<StageCut>& cuts);

// Number of transformer blocks the node scopes of `g` name (the largest block index + 1).
int count_blocks(const Graph& g);

struct StageProgramInfo {
  int stage = 0;
  std::vector<size_t> param_index;  // of the stage's parameters: their index in the global training graph's params
  std::vector<bool> counts_in_norm;  // per stage parameter: false for the copies of a tied weight past its first holder
  int sends = 0, receives = 0;       // cross-stage transfers of this rank per step
  int peak_in_flight = 0;            // micro-batches whose forward ran and backward has not, at most
  std::vector<PipeStep> steps;
  // A schedule that splits the backward (zb-h1): the names of the nodes run in W steps (before
  // the CPU fusion, which may merge some into nodes of other names).
  std::set<std::string> weight_nodes;
  // This rank's transfers, one line each in the global order ("from>to micro value shape src-layout
  // -> dst-layout"): every rank of two stages must list the same transfers between them, or the
  // run would wait forever (compared across the world before the first step).
  std::vector<std::string> transfers;
  std::vector<std::string> transfer_nodes;  // the Reshard node of each of `transfers`
};

// The stages' block ranges of a staged plan whose stages all have their "blocks" (as
// build_stage_globals leaves them); an error says which stage has none.
Expected<std::vector<StageCut>> stage_cuts_of(const Plan& plan);

// The program world rank `world_rank` runs: its stage's graph, recomputation applied, ordered as
// above, fused and memory-planned. `plan` is the pipeline with its stages resolved (each stage's
// blocks and ranks, the micro-batches: StageGlobals::plan); `stage_globals[s]` is stage s's
// program: the same model and training spec chunked into micro_batches x chunks chunks,
// partitioned over that stage's mesh of plan.stage_ranks(s) ranks (stages may share one). The
// transfers between stages are planned for `machine` (every world rank's host and the links).
Expected<RankProgram> build_stage_program(const std::vector<const GlobalProgram*>& stage_globals, const Plan& plan,
                                          const ReshardCluster& machine, int64_t world_rank, const RankProgramOptions& opts,
                                          StageProgramInfo* info);
// Every stage with the layout of `global`.
Expected<RankProgram> build_stage_program(const GlobalProgram& global, const Plan& plan, const ReshardCluster& machine, int64_t world_rank,
                                          const RankProgramOptions& opts, StageProgramInfo* info);

// Every stage's program of a pipeline, its plan with the stages resolved and the machine its
// transfers are planned for: what build_stage_program makes each rank's program from.
struct StageGlobals {
  GlobalProgram first;  // stage 0's program, and that of every stage on the same mesh
  // Per stage: its own program where its layout differs from the first stage's, one shared by
  // the stages that agree; null: `first` (empty: every stage's is `first`).
  std::vector<std::shared_ptr<const GlobalProgram>> own;
  // The plan with what a run leaves open fixed: each stage's blocks (as cut) and ranks, the
  // micro-batches. What oases-train --export-plan writes.
  Plan plan;
  // The hosts of the world's ranks and their links (build_stage_globals: one machine, its shared
  // memory as this machine prices it; oases-train --hosts and the simulator set their own).
  ReshardCluster machine;
  const GlobalProgram& program(int stage) const {
    const auto k = static_cast<size_t>(stage);
    return k < own.size() && own[k] ? *own[k] : first;
  }
  std::vector<const GlobalProgram*> programs() const;  // per stage
};
// build_stage_program for `world_rank` of sg's pipeline.
Expected<RankProgram> build_stage_program(const StageGlobals& sg, int64_t world_rank, const RankProgramOptions& opts, StageProgramInfo* info);

// The one builder. Every program a plan's ranks run, one stage or many: a plan of one stage is
// its GlobalProgram over `world` ranks (planner/rank_program.h), several stages
// build_stage_globals's (`world` then the stages' meshes together).
Expected<StageGlobals> build_plan_programs(Graph forward, const TrainingSpec& spec, const Plan& plan, int64_t world,
                                           const GlobalProgramOptions& opts);
// The program world rank `world_rank` runs of them: build_rank_program of the one mesh, or
// build_stage_program of the rank's stage (`info`: what the stage holds; needed with stages).
Expected<RankProgram> build_rank_program(const StageGlobals& sg, int64_t world_rank, const RankProgramOptions& opts,
                                         StageProgramInfo* info = nullptr);

// The programs of the stages of `plan` (planner/plan.h: each stage a block range on its own mesh)
// for `forward`. Each program holds all plan.micro_batches x K chunks (K: the first stage's chunks
// of one micro-batch), cut into stages later. The stages' block ranges are their "blocks" (none:
// balanced) over the blocks `forward` has; the values crossing them are marked in every program
// (GlobalProgramOptions::stage_cuts). Stages of one layout share one program. Errors name the
// model or the stage.
Expected<StageGlobals> build_stage_globals(Graph forward, const TrainingSpec& spec, const Plan& plan, const GlobalProgramOptions& opts);

// Compares what every rank says of its transfers (StageProgramInfo::transfers, with its stage, by
// world rank): an error names the first two ranks of a pair of stages whose lists differ.
Status check_stage_transfers(const std::vector<int>& stage_of, const std::vector<std::vector<std::string>>& transfers);

}  // namespace oases
