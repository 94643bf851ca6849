// The partitioner: a global graph plus a sharding result become one local graph per rank.
// Conversions become collective nodes (reductions first, then gathers and all-to-alls, then local
// slices), every value gets its local shape, nodes whose attributes carry shapes are rewritten, and
// ops with a distributed form are lowered (vocabulary-parallel embedding and cross-entropy, means
// over split dims). All ranks share one template; constants and parameters are sliced per rank.
#pragma once

#include <functional>

#include <map>
#include <vector>

#include "graph/graph.h"
#include "planner/propagation.h"

namespace oases {

struct PartitionedGraph {
  Mesh mesh;
  Graph local;                      // local shapes; constants still hold the global tensors
  std::vector<ShardingSpec> specs;  // by ValueId of `local`
  int collectives = 0;              // communicating nodes inserted
};

Expected<PartitionedGraph> partition_graph(const Graph& global, const ShardingResult& sharding);

// The graph rank `rank` runs: the template with every constant sliced to its spec.
Graph local_graph_for_rank(const PartitionedGraph& pg, int64_t rank);

// Removes an oases.Whole marker: its output takes the place of its input (the producer now writes
// it, the input's readers read it), so the value keeps the id every stage's partition knows it by.
void dissolve_whole_marker(Graph& g, NodeId marker);
// Every Whole marker of `g` dissolved (an unpartitioned program, where nothing is partial).
void dissolve_whole_markers(Graph& g);

}  // namespace oases

namespace oases {

// Merges the data-parallel all-reduces of gradients (AllReduce over `mesh_axis` whose result is a
// graph output) into buckets of about `bucket_bytes`, in the order the gradients become ready;
// returns the number of buckets. With `group` (a pipeline: the stage of a node), a bucket never
// joins all-reduces of different groups.
int bucket_gradient_all_reduces(PartitionedGraph& pg, int mesh_axis, int64_t bucket_bytes, const std::function<int(NodeId)>& group = {});

// The distributed optimizer (ZeRO stage 1, `--zero 1`): every all-reduce (sum) of float32
// gradients that only writes graph outputs becomes a FlatReduceScatter over the same group, so each
// member receives its contiguous piece of every gradient of the bucket (graph/tiles.h flat_piece):
// the gradient outputs become those pieces, the optimizer updates only them and all-gathers the
// parameters back (executor/zero.h). The group is the one the gradient was summed over: the
// ranks that hold the parameter replicated (the data-parallel group; a gradient made whole before
// it crosses pipeline stages, a tied weight's, stays all-reduced). Returns the nodes changed.
int shard_gradient_reductions(PartitionedGraph& pg);
// The mesh axis over which the distributed optimizer also shares the state of a parameter laid out
// by `spec` whose gradient the program gives whole (a tied table summed across stages): the dp
// axis when it has more than one rank and the parameter is replicated over it, else -1.
int zero_whole_axis(const ShardingSpec& spec, const Mesh& mesh);

}  // namespace oases
