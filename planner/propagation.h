// Sharding propagation over a whole (training) graph: seeds fix the specs of some values (the
// strategy's parameters, the batch inputs); every node's sharding rule then gives its outputs'
// specs in topological order, and records where a consumer needs an input in another spec than its
// producer gives (a conversion: all-reduce, reduce-scatter, all-gather, all-to-all or local slice).
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"
#include "graph/sharding.h"

namespace oases {

struct Conversion {
  NodeId consumer = kNoId;  // kNoId: a graph output, or (slot -1) every reader of a pinned value
  int slot = 0;             // input slot, index in the graph outputs, or -1
  ValueId value = kNoId;
  ShardingSpec from, to;
};

struct ShardingResult {
  Mesh mesh;
  std::vector<ShardingSpec> specs;  // by ValueId: the spec each value is produced in
  std::vector<Conversion> conversions;
};

// `outputs`: required specs of graph outputs (by output index); missing ones default to replicated.
// `pins`: values every reader must see in the given spec (sequence parallelism pins the residual
// stream to a split of the sequence); the conversion happens once, where the value is made.
Expected<ShardingResult> propagate_sharding(const Graph& g, const Mesh& mesh, const std::map<ValueId, ShardingSpec>& seeds,
                                            const std::map<size_t, ShardingSpec>& outputs,
                                            const std::map<ValueId, ShardingSpec>& pins = {});

}  // namespace oases
