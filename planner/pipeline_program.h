// The program of one rank of a pipeline (issue 15): the training graph of the whole model,
// chunked into M micro-batches of K chunks each and partitioned over one stage's tp x dp mesh
// (every stage has the same inner layout), is cut at block boundaries into stage graphs.
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

#include <string>
#include <vector>

#include "planner/pipeline.h"
#include "planner/rank_program.h"

namespace oases {

struct PipelineLayout {
  int stages = 1;
  int micro_batches = 1;
  int chunks = 1;               // K: chunks of one micro-batch (the intra-stage schedule's)
  int64_t stage_ranks = 1;      // ranks of one stage's mesh (tp x dp)
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  std::vector<StageCut> cuts;   // block ranges, one per stage
  // Emulated hosts (oases-train --hosts): the host of each world rank and the link between hosts,
  // written on the transfers ("hosts", "inter_gbps", "inter_latency_us") so their sender choice,
  // order and emulation know them; empty: one machine.
  std::vector<int64_t> hosts;
  double inter_gbps = 0, inter_latency_us = 0;
  int64_t world() const { return stages * stage_ranks; }
  int stage_of_rank(int64_t world_rank) const { return static_cast<int>(world_rank / stage_ranks); }
  int64_t first_rank(int stage) const { return stage * stage_ranks; }
};

// Every node's stages (usually one; copied forward nodes several), by NodeId; errors name a node
// that cannot be placed.
struct StageAssignment {
  std::vector<std::vector<int>> stages;  // by NodeId; empty for dead ids
  std::vector<std::vector<int>> param_holders;  // per trainable parameter: the stages reading it
  int blocks = 0;
};
Expected<StageAssignment> assign_stages(const Graph& g, const std::vector<ValueId>& params, const std::vector<StageCut>& cuts, int stages);

// Number of transformer blocks the node scopes of `g` name (the largest block index + 1).
int count_blocks(const Graph& g);

struct StageProgramInfo {
  int stage = 0;
  std::vector<size_t> param_index;  // of the stage's parameters: their index in the global training graph's params
  std::vector<bool> counts_in_norm;  // per stage parameter: false for the copies of a tied weight past its first holder
  int sends = 0, receives = 0;       // cross-stage transfers of this rank per step
  int peak_in_flight = 0;            // micro-batches whose forward ran and backward has not, at most
  std::vector<PipeStep> steps;
};

// The program world rank `world_rank` runs: its stage's graph, recomputation applied, ordered as
// above, fused and memory-planned. `global` must be chunked into micro_batches x chunks chunks and
// partitioned over one stage's mesh (or be a one-rank stage).
Expected<RankProgram> build_stage_program(const GlobalProgram& global, const PipelineLayout& pl, int64_t world_rank,
                                          const RankProgramOptions& opts, StageProgramInfo* info);

}  // namespace oases
