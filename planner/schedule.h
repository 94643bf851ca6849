// The schedules of the Oases paper, as two decisions on a rank's training graph:
//
//  * what backward recomputes (activation checkpointing): nothing (plain); the whole block from
//    its input, forward collectives included (default_checkpoint, overlap_checkpoint); or the block
//    from its input, the outputs of its forward collectives and the residual between its two
//    sub-layers, so no forward collective is ever repeated (optim_comm_checkpoint, oases);
//  * the order of the instructions: micro-batch chunks one after another, or interleaved per
//    sub-layer so that one chunk's collective flies while the next chunk computes, forward and
//    backward, across block boundaries without draining (overlap_checkpoint, oases).
//
// Collectives become a start and a wait: the start as soon as the input is ready, the wait just
// before the first reader. Every rank derives the same order from the same graph, so the ranks of a
// group issue their collectives in one order.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/program_order.h"

namespace oases {

enum class CheckpointMode { kNone, kBlock, kCommOptimized };

struct ScheduleOptions {
  std::string name = "plain";
  CheckpointMode checkpoint = CheckpointMode::kNone;
  bool interleave = false;  // chunks interleaved per sub-layer
};

// plain | default_checkpoint | optim_comm_checkpoint | overlap_checkpoint | oases
Expected<ScheduleOptions> schedule_by_name(const std::string& name);

// The forward "stage" of every node: 2·layer + sub-layer (0 attention, 1 MLP) from the block
// scopes, raised by one after each forward collective (what follows an all-reduce belongs with the
// next sub-layer), inherited along the data flow; -1 before the first block.
// With collective_step false, collectives do not raise the stage: 2·layer + sub-layer of the block
// a node belongs to (what checkpointing and the saved-memory report group by).
std::vector<int> forward_stages(const Graph& g, bool collective_step = true);

struct RecomputeReport {
  int nodes = 0;        // recompute nodes added
  int collectives = 0;  // of which collectives (default checkpointing repeats them)
};

// Rewrites backward readers of block-internal forward values to read recomputed copies, made from
// the values the mode keeps (each forward node recomputed at most once per block and chunk;
// dropout copies replay the original node's random stream).
Expected<RecomputeReport> apply_recompute(Graph& g, CheckpointMode mode);

// The instruction order of one rank.
Expected<std::vector<ScheduledOp>> schedule_program(const Graph& g, const ScheduleOptions& opt);

// Issues a rank's instructions in the order given, with its collectives' starts and waits: a
// collective starts where it is issued; an instruction reading its output waits for it first
// (unless it is a collective on the same channel: that channel's thread runs them in order);
// finish() waits for every collective not awaited yet, in the order they started. The in-stage
// schedules (schedule_program) and the pipeline's stage programs (planner/pipeline_program.h)
// both order their instructions through it.
class CommIssuer {
 public:
  explicit CommIssuer(const Graph& g) : g_(g) {}
  void issue(NodeId id);  // its waits, then the start of a collective or the compute instruction
  void wait(NodeId c);    // wait for a started collective here (nothing when it was awaited)
  void finish();
  const std::vector<ScheduledOp>& order() const { return order_; }
  std::vector<ScheduledOp> take() { return std::move(order_); }

 private:
  const Graph& g_;
  std::vector<ScheduledOp> order_;
  std::map<ValueId, NodeId> pending_;  // made by a started collective not yet awaited
  std::set<NodeId> waited_;
  std::vector<NodeId> started_;
};

// Bytes of forward activations each block keeps for the backward pass under `order` (values made
// by the block's forward nodes that a later backward or recompute instruction reads), by layer.
std::map<int, int64_t> saved_activation_bytes(const Graph& g, const std::vector<ScheduledOp>& order);
std::map<int, int> saved_activation_count(const Graph& g, const std::vector<ScheduledOp>& order);

}  // namespace oases
