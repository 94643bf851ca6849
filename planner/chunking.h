// Micro-batch chunks for the overlapped schedules: the batch is split into K chunks and every
// node that depends on a batch input is repeated per chunk, working on rows [k·B/K, (k+1)·B/K);
// nodes that do not (weights, constants, position tables) stay shared. Values reduced over the
// batch (the loss's sum and count) become sums over the chunks.
//
// It is done with the sharding machinery: the graph is split over a virtual mesh axis "chunk" with
// the batch inputs split on their first dim, and the one-chunk template is unrolled K times, its
// chunk-axis collectives becoming local sums, concatenations and slices. Autodiff on the result
// gives one backward pass per chunk, and the parameter gradients summed over the chunks in a fixed
// order.
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"

namespace oases {

// K == 1 returns the graph unchanged. Errors name an input whose batch does not divide by K.
// `versions` (optional) receives, per value of `g` that depends on the batch, its value in each
// chunk (chunk 0 keeps the value's id), so that what was decided per value of the unchunked graph
// (sequence-parallel pins) can be applied to every chunk.
Expected<Graph> chunk_batch(const Graph& g, int chunks, std::map<ValueId, std::vector<ValueId>>* versions = nullptr);

}  // namespace oases
