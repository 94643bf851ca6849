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
  NodeId consumer = kNoId;  // kNoId: a graph output
  int slot = 0;             // input slot, or index in the graph outputs
  ValueId value = kNoId;
  ShardingSpec from, to;
};

struct ShardingResult {
  Mesh mesh;
  std::vector<ShardingSpec> specs;  // by ValueId: the spec each value is produced in
  std::vector<Conversion> conversions;
};

// `outputs`: required specs of graph outputs (by output index); missing ones default to replicated.
Expected<ShardingResult> propagate_sharding(const Graph& g, const Mesh& mesh, const std::map<ValueId, ShardingSpec>& seeds,
                                            const std::map<size_t, ShardingSpec>& outputs);

}  // namespace oases
