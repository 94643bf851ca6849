#include "graph/graph.h"

#include <algorithm>
#include <queue>
#include <set>

#include <boost/graph/adjacency_list.hpp>

namespace oases {

namespace {
struct EdgeData {
  ValueId value = kNoId;
  int slot = 0;
};
using BGraph = boost::adjacency_list<boost::listS, boost::listS, boost::bidirectionalS, Node, EdgeData>;
using Vertex = BGraph::vertex_descriptor;

Vertex as_vertex(void* p) {
  return static_cast<Vertex>(p);
}
}  // namespace

struct Graph::Impl {
  BGraph g;
};

std::string Node::describe() const {
  std::string d = domain.empty() ? op_type : domain + "." + op_type;
  return fmt::format("[{}] node '{}'", d, name);
}

std::string describe_value(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  return fmt::format("'{}': {}{}", val.name, dtype_name(val.dtype), val.has_shape ? shape_str(val.shape) : "[?]");
}

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Graph::Graph(const Graph& other) : impl_(std::make_unique<Impl>()) {
  rebuild_from(other);
}

Graph& Graph::operator=(const Graph& other) {
  if (this != &other) {
    impl_ = std::make_unique<Impl>();
    rebuild_from(other);
  }
  return *this;
}

void Graph::rebuild_from(const Graph& other) {
  name = other.name;
  producer_name = other.producer_name;
  producer_version = other.producer_version;
  ir_version = other.ir_version;
  opset_imports = other.opset_imports;
  source_path = other.source_path;
  values_ = other.values_;
  value_by_name_ = other.value_by_name_;
  inputs_ = other.inputs_;
  outputs_ = other.outputs_;
  initializers_ = other.initializers_;
  live_nodes_ = other.live_nodes_;
  name_counter_ = other.name_counter_;
  vertex_of_.assign(other.vertex_of_.size(), nullptr);
  for (size_t i = 0; i < other.vertex_of_.size(); ++i) {
    if (!other.vertex_of_[i]) continue;
    Vertex v = boost::add_vertex(other.impl_->g[as_vertex(other.vertex_of_[i])], impl_->g);
    vertex_of_[i] = v;
  }
  for (size_t i = 0; i < vertex_of_.size(); ++i) {
    if (!vertex_of_[i]) continue;
    const Node& n = impl_->g[as_vertex(vertex_of_[i])];
    for (int s = 0; s < n.num_inputs(); ++s) {
      if (n.inputs[s] != kNoId) add_edge_for(n.id, s, n.inputs[s]);
    }
  }
}

int64_t Graph::default_opset() const {
  auto it = opset_imports.find("");
  if (it != opset_imports.end()) return it->second;
  it = opset_imports.find("ai.onnx");
  return it != opset_imports.end() ? it->second : 0;
}

ValueId Graph::add_value(const std::string& nm, DType dtype, Shape shape, bool has_shape) {
  Value v;
  v.id = static_cast<ValueId>(values_.size());
  v.name = nm.empty() ? unique_name("v") : nm;
  if (value_by_name_.count(v.name)) v.name = unique_name(v.name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.has_shape = has_shape;
  value_by_name_[v.name] = v.id;
  values_.push_back(std::move(v));
  return values_.back().id;
}

ValueId Graph::add_input(const std::string& nm, DType dtype, Shape shape) {
  ValueId id = add_value(nm, dtype, std::move(shape), true);
  values_[id].is_input = true;
  inputs_.push_back(id);
  return id;
}

ValueId Graph::add_initializer(const std::string& nm, Tensor t) {
  ValueId id = add_value(nm, t.dtype(), t.shape(), true);
  values_[id].constant = std::move(t);
  values_[id].is_initializer = true;
  initializers_.push_back(id);
  return id;
}

ValueId Graph::add_constant(const std::string& name_hint, Tensor t) {
  ValueId id = add_value(unique_name(name_hint), t.dtype(), t.shape(), true);
  values_[id].constant = std::move(t);
  return id;
}

ValueId Graph::find_value(const std::string& nm) const {
  auto it = value_by_name_.find(nm);
  return it == value_by_name_.end() ? kNoId : it->second;
}

void Graph::rename_value(ValueId v, const std::string& new_name) {
  Value& val = value(v);
  if (val.name == new_name) return;
  auto it = value_by_name_.find(val.name);
  if (it != value_by_name_.end() && it->second == v) value_by_name_.erase(it);
  val.name = new_name;
  value_by_name_[new_name] = v;
}

std::string Graph::unique_name(const std::string& prefix) {
  for (;;) {
    std::string n = fmt::format("{}__{}", prefix, name_counter_++);
    if (!value_by_name_.count(n)) return n;
  }
}

void Graph::set_constant(ValueId v, Tensor t) {
  Value& val = value(v);
  val.dtype = t.dtype();
  val.shape = t.shape();
  val.has_shape = true;
  val.constant = std::move(t);
}

void Graph::add_output(ValueId v) {
  outputs_.push_back(v);
}

void Graph::remove_input(ValueId v) {
  inputs_.erase(std::remove(inputs_.begin(), inputs_.end(), v), inputs_.end());
  value(v).is_input = false;
}

void Graph::remove_initializer(ValueId v) {
  initializers_.erase(std::remove(initializers_.begin(), initializers_.end(), v), initializers_.end());
  value(v).is_initializer = false;
}

bool Graph::is_output(ValueId v) const {
  return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}

NodeId Graph::add_node(const std::string& op_type, const std::vector<ValueId>& ins, const std::vector<ValueId>& outs, AttrMap attrs,
                       const std::string& nm, const std::string& domain) {
  Node n;
  n.id = static_cast<NodeId>(vertex_of_.size());
  n.op_type = op_type;
  n.domain = domain;
  n.name = nm.empty() ? fmt::format("{}_{}", op_type, n.id) : nm;
  n.attrs = std::move(attrs);
  n.opset = static_cast<int>(domain.empty() ? default_opset() : 1);
  Vertex vd = boost::add_vertex(n, impl_->g);
  vertex_of_.push_back(vd);
  ++live_nodes_;
  Node& node_ref = impl_->g[vd];
  node_ref.inputs.assign(ins.size(), kNoId);
  for (size_t s = 0; s < ins.size(); ++s) set_input(node_ref.id, static_cast<int>(s), ins[s]);
  node_ref.outputs.assign(outs.size(), kNoId);
  for (size_t s = 0; s < outs.size(); ++s) set_output(node_ref.id, static_cast<int>(s), outs[s]);
  return node_ref.id;
}

NodeId Graph::add_node_new_outputs(const std::string& op_type, const std::vector<ValueId>& ins, int num_outputs, AttrMap attrs,
                                   const std::string& nm, const std::string& domain) {
  std::string base = nm.empty() ? unique_name(op_type) : nm;
  std::vector<ValueId> outs;
  for (int i = 0; i < num_outputs; ++i) outs.push_back(add_value(unique_name(base + "_out")));
  return add_node(op_type, ins, outs, std::move(attrs), base, domain);
}

void Graph::remove_node(NodeId id) {
  Node& n = node(id);
  for (int s = 0; s < n.num_inputs(); ++s) {
    if (n.inputs[s] != kNoId) remove_use(n.inputs[s], id, s);
  }
  for (ValueId o : n.outputs) {
    if (o != kNoId && values_[o].producer == id) {
      values_[o].producer = kNoId;
      values_[o].producer_slot = -1;
    }
  }
  Vertex vd = as_vertex(vertex_of_[id]);
  boost::clear_vertex(vd, impl_->g);
  boost::remove_vertex(vd, impl_->g);
  vertex_of_[id] = nullptr;
  --live_nodes_;
}

bool Graph::alive(NodeId id) const {
  return id >= 0 && static_cast<size_t>(id) < vertex_of_.size() && vertex_of_[id] != nullptr;
}

Node& Graph::node(NodeId id) {
  if (!alive(id)) throw OasesError(fmt::format("internal: node id {} is not alive", id));
  return impl_->g[as_vertex(vertex_of_[id])];
}

const Node& Graph::node(NodeId id) const {
  if (!alive(id)) throw OasesError(fmt::format("internal: node id {} is not alive", id));
  return impl_->g[as_vertex(vertex_of_[id])];
}

std::vector<NodeId> Graph::nodes() const {
  std::vector<NodeId> out;
  out.reserve(live_nodes_);
  for (size_t i = 0; i < vertex_of_.size(); ++i) {
    if (vertex_of_[i]) out.push_back(static_cast<NodeId>(i));
  }
  return out;
}

NodeId Graph::find_node(const std::string& nm) const {
  for (size_t i = 0; i < vertex_of_.size(); ++i) {
    if (vertex_of_[i] && impl_->g[as_vertex(vertex_of_[i])].name == nm) return static_cast<NodeId>(i);
  }
  return kNoId;
}

void Graph::add_use(ValueId v, NodeId n, int slot) {
  values_[v].uses.push_back(Use{n, slot});
}

void Graph::remove_use(ValueId v, NodeId n, int slot) {
  auto& u = values_[v].uses;
  auto it = std::find(u.begin(), u.end(), Use{n, slot});
  if (it != u.end()) u.erase(it);
}

void Graph::add_edge_for(NodeId consumer, int slot, ValueId v) {
  NodeId p = values_[v].producer;
  if (p == kNoId || !alive(p)) return;
  boost::add_edge(as_vertex(vertex_of_[p]), as_vertex(vertex_of_[consumer]), EdgeData{v, slot}, impl_->g);
}

void Graph::remove_edge_for(NodeId consumer, int slot) {
  Vertex vd = as_vertex(vertex_of_[consumer]);
  boost::remove_in_edge_if(
      vd, [&](const BGraph::edge_descriptor& e) { return impl_->g[e].slot == slot; }, impl_->g);
}

void Graph::set_input(NodeId id, int slot, ValueId v) {
  Node& n = node(id);
  if (slot >= n.num_inputs()) n.inputs.resize(static_cast<size_t>(slot) + 1, kNoId);
  ValueId old = n.inputs[slot];
  if (old != kNoId) {
    remove_use(old, id, slot);
    remove_edge_for(id, slot);
  }
  n.inputs[slot] = v;
  if (v != kNoId) {
    add_use(v, id, slot);
    add_edge_for(id, slot, v);
  }
}

void Graph::set_inputs(NodeId id, const std::vector<ValueId>& vs) {
  Node& n = node(id);
  for (int s = n.num_inputs() - 1; s >= 0; --s) set_input(id, s, kNoId);
  n.inputs.clear();
  for (size_t s = 0; s < vs.size(); ++s) set_input(id, static_cast<int>(s), vs[s]);
}

void Graph::set_output(NodeId id, int slot, ValueId v) {
  Node& n = node(id);
  if (slot >= static_cast<int>(n.outputs.size())) n.outputs.resize(static_cast<size_t>(slot) + 1, kNoId);
  ValueId old = n.outputs[slot];
  if (old != kNoId && values_[old].producer == id) {
    // consumers of the old value lose their edge from this node
    for (const Use& u : values_[old].uses) remove_edge_for(u.node, u.slot);
    values_[old].producer = kNoId;
    values_[old].producer_slot = -1;
  }
  n.outputs[slot] = v;
  if (v != kNoId) {
    Value& val = values_[v];
    if (val.producer != kNoId && alive(val.producer) && val.producer != id) {
      Node& prev = node(val.producer);
      for (auto& o : prev.outputs) {
        if (o == v) o = kNoId;
      }
    }
    for (const Use& u : val.uses) remove_edge_for(u.node, u.slot);
    val.producer = id;
    val.producer_slot = slot;
    for (const Use& u : val.uses) add_edge_for(u.node, u.slot, v);
  }
}

void Graph::replace_all_uses(ValueId from, ValueId to) {
  if (from == to) return;
  std::vector<Use> uses_copy = values_[from].uses;
  for (const Use& u : uses_copy) set_input(u.node, u.slot, to);
  for (auto& o : outputs_) {
    if (o == from) o = to;
  }
}

std::vector<NodeId> Graph::predecessors(NodeId id) const {
  std::vector<NodeId> out;
  Vertex vd = as_vertex(vertex_of_.at(id));
  for (auto [it, end] = boost::in_edges(vd, impl_->g); it != end; ++it) {
    NodeId p = impl_->g[boost::source(*it, impl_->g)].id;
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

std::vector<NodeId> Graph::successors(NodeId id) const {
  std::vector<NodeId> out;
  Vertex vd = as_vertex(vertex_of_.at(id));
  for (auto [it, end] = boost::out_edges(vd, impl_->g); it != end; ++it) {
    NodeId c = impl_->g[boost::target(*it, impl_->g)].id;
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

Expected<std::vector<NodeId>> Graph::topo_order() const {
  // Kahn's algorithm over the boost edges; a min-heap on node id keeps the model's order.
  std::vector<int> indegree(vertex_of_.size(), 0);
  for (size_t i = 0; i < vertex_of_.size(); ++i) {
    if (vertex_of_[i]) indegree[i] = static_cast<int>(boost::in_degree(as_vertex(vertex_of_[i]), impl_->g));
  }
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (size_t i = 0; i < vertex_of_.size(); ++i) {
    if (vertex_of_[i] && indegree[i] == 0) ready.push(static_cast<NodeId>(i));
  }
  std::vector<NodeId> order;
  order.reserve(live_nodes_);
  while (!ready.empty()) {
    NodeId n = ready.top();
    ready.pop();
    order.push_back(n);
    for (auto [it, end] = boost::out_edges(as_vertex(vertex_of_[n]), impl_->g); it != end; ++it) {
      NodeId c = impl_->g[boost::target(*it, impl_->g)].id;
      if (--indegree[c] == 0) ready.push(c);
    }
  }
  if (order.size() != live_nodes_) {
    for (size_t i = 0; i < vertex_of_.size(); ++i) {
      if (vertex_of_[i] && indegree[i] > 0) {
        const Node& n = node(static_cast<NodeId>(i));
        return error("the graph has a cycle through {} ({} nodes are on or behind cycles)", n.describe(), live_nodes_ - order.size());
      }
    }
  }
  return order;
}

Status Graph::validate() const {
  for (NodeId id : nodes()) {
    const Node& n = node(id);
    for (int s = 0; s < n.num_inputs(); ++s) {
      ValueId v = n.inputs[s];
      if (v == kNoId) continue;
      if (v < 0 || static_cast<size_t>(v) >= values_.size()) return error("{} input {} is not a value", n.describe(), s);
      const auto& u = values_[v].uses;
      if (std::find(u.begin(), u.end(), Use{id, s}) == u.end()) {
        return error("{} input {} ('{}') is missing from the value's uses", n.describe(), s, values_[v].name);
      }
      const Value& val = values_[v];
      if (val.producer == kNoId && !val.is_input && !val.is_constant()) {
        return error("{} reads '{}', which no node produces and which is neither an input nor an initializer", n.describe(), val.name);
      }
    }
    for (size_t s = 0; s < n.outputs.size(); ++s) {
      ValueId v = n.outputs[s];
      if (v != kNoId && values_[v].producer != id) return error("{} output {} has another producer", n.describe(), s);
    }
  }
  for (const Value& v : values_) {
    for (const Use& u : v.uses) {
      if (!alive(u.node)) return error("value '{}' is used by a removed node", v.name);
      if (node(u.node).input(u.slot) != v.id) return error("value '{}' has a stale use", v.name);
    }
  }
  for (ValueId o : outputs_) {
    const Value& v = values_[o];
    if (v.producer == kNoId && !v.is_input && !v.is_constant()) {
      return error("graph output '{}' is produced by no node", v.name);
    }
  }
  return Status::ok();
}

}  // namespace oases
