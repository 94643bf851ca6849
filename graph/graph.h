// The IR: a dataflow graph whose nodes are the vertices of a boost::adjacency_list (list storage,
// so NodeIds and vertex descriptors stay valid across edits) and whose edges carry the value and
// input slot they feed. Values (named tensors with dtype and shape) live beside the graph; every
// edit goes through the methods below, which keep values, uses and edges consistent.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/attribute.h"
#include "graph/status.h"
#include "graph/tensor.h"

namespace oases {

using NodeId = int32_t;
using ValueId = int32_t;
constexpr int32_t kNoId = -1;

struct Use {
  NodeId node = kNoId;
  int slot = 0;
  bool operator==(const Use& o) const { return node == o.node && slot == o.slot; }
};

struct Value {
  ValueId id = kNoId;
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
  bool has_shape = false;
  NodeId producer = kNoId;  // kNoId for graph inputs and constants
  int producer_slot = -1;
  std::vector<Use> uses;
  Tensor constant;                     // defined for initializers and folded constants
  bool is_input = false;               // a graph input fed at run time
  bool is_initializer = false;         // an initializer of the model (a parameter or buffer)
  std::vector<std::string> dim_names;  // symbolic names of dims as the model wrote them ("" = fixed)

  bool is_constant() const { return constant.defined(); }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

struct Node {
  NodeId id = kNoId;
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the ONNX default domain; "oases" holds the project's own ops
  AttrMap attrs;
  std::vector<ValueId> inputs;   // kNoId marks an omitted optional input
  std::vector<ValueId> outputs;  // kNoId marks an omitted optional output
  int opset = 0;                 // version of `domain` the model imported
  std::string scope;             // block the node belongs to, e.g. "layer.3.attn" (set by passes)
  enum class Phase : uint8_t { kForward, kBackward, kLoss, kRecompute };
  Phase phase = Phase::kForward;  // backward nodes are made by autodiff, recompute ones by checkpointing
  NodeId origin = kNoId;          // backward/recompute nodes: the forward node they derive from
  int chunk = -1;                 // micro-batch chunk the node works on (-1: all, or not chunked)

  int num_inputs() const { return static_cast<int>(inputs.size()); }
  bool has_input(int i) const { return i < num_inputs() && inputs[i] != kNoId; }
  ValueId input(int i) const { return i < num_inputs() ? inputs[i] : kNoId; }
  ValueId output(int i) const { return i < static_cast<int>(outputs.size()) ? outputs[i] : kNoId; }
  // "op 'name'" for messages, e.g. "[Reshape] node '/h.0/attn/Reshape'".
  std::string describe() const;
};

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph& other);
  Graph& operator=(const Graph& other);
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;

  // --- model metadata -------------------------------------------------------------------
  std::string name;
  std::string producer_name, producer_version;
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opset_imports;  // domain -> version ("" is ai.onnx)
  std::string source_path;                       // the model file, for messages
  int64_t default_opset() const;

  // --- values ----------------------------------------------------------------------------
  ValueId add_value(const std::string& name, DType dtype = DType::kUndefined, Shape shape = {}, bool has_shape = false);
  // A graph input fed at run time.
  ValueId add_input(const std::string& name, DType dtype, Shape shape);
  // An initializer of the model (trainable parameter candidate when floating).
  ValueId add_initializer(const std::string& name, Tensor t);
  // A constant made by a pass (folded, or operand of a generated node).
  ValueId add_constant(const std::string& name_hint, Tensor t);
  Value& value(ValueId id) { return values_.at(static_cast<size_t>(id)); }
  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  ValueId find_value(const std::string& name) const;  // kNoId if absent
  size_t num_values() const { return values_.size(); }
  void rename_value(ValueId v, const std::string& new_name);
  // A fresh name with the given prefix, unique among values and nodes.
  std::string unique_name(const std::string& prefix);
  void set_constant(ValueId v, Tensor t);  // turns v into a constant (folding)

  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::vector<ValueId>& initializers() const { return initializers_; }
  void add_output(ValueId v);
  void set_outputs(std::vector<ValueId> outs) { outputs_ = std::move(outs); }
  void remove_input(ValueId v);
  void remove_initializer(ValueId v);  // stays a constant value if still used
  bool is_output(ValueId v) const;

  // --- nodes -----------------------------------------------------------------------------
  NodeId add_node(const std::string& op_type, const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs, AttrMap attrs = {},
                  const std::string& name = "", const std::string& domain = "");
  // Convenience: creates fresh output values named after the node.
  NodeId add_node_new_outputs(const std::string& op_type, const std::vector<ValueId>& inputs, int num_outputs, AttrMap attrs = {},
                              const std::string& name = "", const std::string& domain = "");
  void remove_node(NodeId id);
  bool alive(NodeId id) const;
  Node& node(NodeId id);
  const Node& node(NodeId id) const;
  size_t num_nodes() const { return live_nodes_; }
  NodeId max_node_id() const { return static_cast<NodeId>(vertex_of_.size()); }
  // Live nodes in insertion order.
  std::vector<NodeId> nodes() const;
  NodeId find_node(const std::string& name) const;  // kNoId if absent

  void set_input(NodeId n, int slot, ValueId v);  // v may be kNoId
  void set_inputs(NodeId n, const std::vector<ValueId>& vs);
  void set_output(NodeId n, int slot, ValueId v);
  // Every consumer (and graph output) of `from` reads `to` instead.
  void replace_all_uses(ValueId from, ValueId to);
  const std::vector<Use>& uses(ValueId v) const { return value(v).uses; }
  NodeId producer(ValueId v) const { return value(v).producer; }

  // Nodes whose outputs feed node n / that consume node n's outputs (graph edges).
  std::vector<NodeId> predecessors(NodeId n) const;
  std::vector<NodeId> successors(NodeId n) const;

  // Topological order, ties broken by node id (so the model's own order is kept where valid);
  // an error naming a node on the cycle when there is one.
  Expected<std::vector<NodeId>> topo_order() const;
  // Checks the invariants (uses, edges, producers); the message names the first violation.
  Status validate() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  // a deque: a Value stays where it is when values are added, so references to it stay valid
  std::deque<Value> values_;
  std::unordered_map<std::string, ValueId> value_by_name_;
  std::vector<void*> vertex_of_;  // NodeId -> vertex descriptor, nullptr once removed
  std::vector<ValueId> inputs_, outputs_, initializers_;
  size_t live_nodes_ = 0;
  int64_t name_counter_ = 0;

  void add_use(ValueId v, NodeId n, int slot);
  void remove_use(ValueId v, NodeId n, int slot);
  void add_edge_for(NodeId consumer, int slot, ValueId v);
  void remove_edge_for(NodeId consumer, int slot);
  void rebuild_from(const Graph& other);
};

// "name: dtype[shape]" of a value, for messages and dumps.
std::string describe_value(const Graph& g, ValueId v);

}  // namespace oases
