// Plans whose parts split differently: every recognised part of a transformer (the token
// embedding, each block's attention and MLP, the head with its loss) runs Megatron's split over its
// own tensor-parallel degree t, the other N/t ranks of the world data-parallel for that part (the
// per-op hybrid tp x dp of the Oases planner), optionally with sequence parallelism.
//
// How the executor realises it exactly: a mesh whose axes give every degree t a tp axis (t
// consecutive ranks) and a dp axis (the rest), as compound axes over binary base axes when the
// degrees differ (graph/sharding.h); the weights of a part split over its tp axis; and a Layout
// marker (graph/ops/collectives.cpp) on the value entering each part, [B, T, C] split over the part's
// dp axis on the batch (and over its tp axis on the sequence with sequence parallelism), whose
// gradient is the layout the value had. Between parts of different degrees the partitioner then
// all-gathers (or slices) the batch over the minor dp axes, forward and backward.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/sharding.h"
#include "planner/strategy.h"

namespace oases {

struct PartAxes {
  int tp = -1, dp = -1;  // mesh axes (-1: a group of one)
};

// A mesh over `ranks` ranks with a tp and a dp axis for every degree in `degrees`: the classic
// {"dp", "tp"} mesh for one degree; binary base axes m0..m(k-1) (ranks = 2^k, at most 128) with
// compound axes over every run of them otherwise. Errors say why the degrees cannot mix.
Expected<Mesh> mesh_for_degrees(int64_t ranks, const std::set<int64_t>& degrees, std::map<int64_t, PartAxes>* axes);

// The parts of a model in chain order (embedding, layer.0.attn, layer.0.mlp, ..., head); only
// those the structure has.
std::vector<std::string> model_parts(const ModelStructure& ms);

// Whether every graph input with a batch dimension is read by one part alone (token ids by the
// embedding; targets are added later and read by the loss): hybrid layouts need it. Else the reason.
Status hybrid_inputs_supported(const Graph& forward);

// Applies per-part layouts to the forward graph `g` (before the loss and autodiff): inserts the
// Layout markers and returns the strategy (mesh, weight specs, sequence-parallel pins). `layouts`
// has one entry per part of model_parts(); errors name the part and the size its degree does not
// divide. With one degree and one sequence-parallel choice for all parts this is
// megatron_strategy and nothing is inserted.
Expected<Strategy> apply_part_layouts(Graph& g, const std::vector<PartLayout>& layouts, int64_t ranks, const StrategyOptions& opt);

// Specs of the training graph's batch inputs (dim 0 over the dp axis of the part reading them;
// the loss's targets over the head's); split_batch_inputs calls it for mixed layouts. With micro-batch
// chunks the split lands on each chunk's slice (see split_batch_inputs).
Status split_batch_inputs_by_part(const Graph& train, const std::vector<PartLayout>& layouts, Strategy* s,
                                  const std::map<ValueId, std::vector<ValueId>>& chunks = {});

// True when the layouts need the hybrid machinery (degrees or sequence parallelism differ).
bool layouts_are_mixed(const std::vector<PartLayout>& layouts);

// The planner's part of a node scope: "embedding", "head" (final norm, head, loss),
// "layer.N.attn", "layer.N.mlp", or "" for scopes outside any part.
std::string part_of_scope(const std::string& scope);
// The parts whose collective matmuls the layouts ask for (sequence parallel over tp >= 2 only).
void select_collective_matmuls(const std::vector<PartLayout>& layouts, Strategy* st);

}  // namespace oases
