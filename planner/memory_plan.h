// Static memory plan: every intermediate value gets an offset in one arena, reusing space of
// values whose last reader has run (best-fit free list, 64-byte aligned). View ops (Reshape,
// Squeeze, ...) share their input's storage; constants and graph inputs live outside the arena.
// In-place: a node whose kernel may overwrite one of its inputs (`inplace_outputs` names the
// pairs) writes its output over that input when the input's storage has no reader after this node
// (a collective: none after its wait and none between its start and its wait).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "graph/passes/fusion.h"

#include "graph/graph.h"

namespace oases {

struct ValueSlot {
  enum class Kind { kNone, kArena, kConstant, kInput, kView };
  Kind kind = Kind::kNone;
  int64_t offset = 0;  // kArena: byte offset in the arena
  size_t bytes = 0;
  ValueId root = kNoId;  // kView: the value whose storage it shares (never itself a view)
};

// One step of a program for the planner: a compute node defines its outputs and reads its inputs
// at the same step; a collective defines its outputs where it starts and reads its inputs until
// the step where it is awaited.
struct PlanStep {
  NodeId node = kNoId;
  bool defines = true;
  bool uses = true;
};

struct MemoryPlan {
  std::vector<ValueSlot> slots;  // indexed by ValueId
  size_t arena_bytes = 0;        // peak
  size_t total_bytes = 0;        // what a plan without reuse would need
  int inplace = 0;               // outputs written over an input
  // The (output, input slot) pairs whose input buffer the node's kernel may overwrite with that
  // output (graph/passes/fusion.h inplace_outputs); taken where the bytes and dtypes agree.
  using InplaceFn = std::function<std::vector<InplacePair>(const Graph&, const Node&)>;
  // Builds the plan for nodes run in `order`; values in `keep` stay allocated to the end.
  static MemoryPlan build(const Graph& g, const std::vector<NodeId>& order, const std::set<ValueId>& keep,
                          const InplaceFn& inplace_input = {});
  // Steps with collectives split into start and wait (a collective's inputs are read until its wait).
  static MemoryPlan build(const Graph& g, const std::vector<PlanStep>& steps, const std::set<ValueId>& keep,
                          const InplaceFn& inplace_input = {});
};

// The arena values alive together at the step where the most arena bytes are (a value lives from
// the step that defines it to its last reader, a view's bytes counted with its root's; values in
// `keep` and the graph's outputs to the end), largest first: what --memory-report lists.
struct LiveValue {
  ValueId value = kNoId;
  size_t bytes = 0;
};
struct LivePeak {
  size_t step = 0, bytes = 0;  // the step and the bytes alive at it
  std::vector<LiveValue> values;
};
LivePeak live_peak(const Graph& g, const std::vector<PlanStep>& steps, const MemoryPlan& plan, const std::set<ValueId>& keep);

}  // namespace oases
