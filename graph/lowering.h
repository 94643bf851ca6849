// Partition lowering (OpSchema::lower): after the partitioner (planner/partition.h) has given every
// value of the per-rank template graph its local shape and inserted the conversions, each node
// whose op has a `lower` rule may rewrite itself: attributes that carry global shapes (Reshape's
// shape, Split's sizes, Slice's lengths) take the local ones, and ops with a distributed form
// (vocabulary-parallel cross-entropy, a Gather from a row-split table) become that form.
//
// The partitioner implements this interface; graph/ never sees planner/. After lowering, the
// partitioner re-runs every node's shape rule on the local graph and reports a node whose local
// shapes disagree with its specs (an op whose shard rule changes local shapes but which lacks the
// lower rule that rewrites its shape attributes).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/op_registry.h"
#include "graph/sharding.h"

namespace oases {

class LowerContext {
 public:
  virtual ~LowerContext() = default;
  // The local graph and the node being lowered (the node may be removed by its rule).
  virtual Graph& graph() = 0;
  virtual NodeId node_id() const = 0;
  Node& node() { return graph().node(node_id()); }
  virtual const Mesh& mesh() const = 0;
  // The spec of a value of the local graph (new values included).
  virtual ShardingSpec& spec(ValueId v) = 0;
  // The global (unpartitioned) shape of a value; its local shape is graph().value(v).shape.
  virtual Shape global_shape(ValueId v) = 0;
  // Adds a node with one new output in `out_spec`, whose local shape follows from `global_shape`;
  // it takes the scope, phase, chunk and origin of the node being lowered while that node lives.
  virtual ValueId emit(const std::string& op, const std::vector<ValueId>& ins, AttrMap attrs, DType dt, const Shape& global_shape,
                       const ShardingSpec& out_spec, const std::string& base, const std::string& domain = "") = 0;
  // Records the global shape of a value a rule added without emit.
  virtual void set_global_shape(ValueId v, const Shape& global) = 0;
  // Counts communicating nodes the rule added (PartitionedGraph::collectives).
  virtual void add_collectives(int n) = 0;
  // Values one rule leaves for a later one, by a key the rules agree on (the vocabulary-parallel
  // loss leaves its all-reduced row max and sum of exponentials for its gradient, which then needs
  // no collective of its own).
  virtual std::map<std::string, ValueId>& shared() = 0;

  // Attributes of a collective over mesh axis `a`: mesh_axis, group_size.
  AttrMap collective_attrs(int a) const {
    AttrMap m;
    m.set_int("mesh_axis", a);
    m.set_int("group_size", mesh().axis_size(a));
    return m;
  }
  const Shape& local_shape(ValueId v) { return graph().value(v).shape; }
  template <class... Args>
  Status fail(fmt::format_string<Args...> f, Args&&... args) {
    return Status::error(node().describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
};

}  // namespace oases
