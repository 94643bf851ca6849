#include "planner/partition.h"

#include <algorithm>
#include <map>
#include <cstring>

#include <fmt/format.h>

#include "graph/autodiff.h"
#include "graph/lowering.h"
#include "graph/op_registry.h"
#include "graph/tiles.h"

namespace oases {

namespace {

class Partitioner {
 public:
  Partitioner(const Graph& global, const ShardingResult& sr) : global_(global), sr_(sr) {}

  Expected<PartitionedGraph> run() {
    pg_.mesh = sr_.mesh;
    pg_.local = global_;
    pg_.specs = sr_.specs;
    Graph& g = pg_.local;
    // every original value takes its local shape
    for (size_t v = 0; v < global_.num_values(); ++v) {
      Value& val = g.value(static_cast<ValueId>(v));
      if (!val.has_shape) continue;
      val.shape = pg_.specs[v].local_shape(global_.value(static_cast<ValueId>(v)).shape, pg_.mesh);
    }
    OASES_RETURN_IF_ERROR(insert_conversions());
    OASES_RETURN_IF_ERROR(lower_nodes());
    // constants a lowering added after the last spec it set (ReduceMean's share, a loss's row
    // count) are whole scalars: give every value a spec, so local_graph_for_rank reads none past the end
    if (pg_.specs.size() < g.num_values()) pg_.specs.resize(g.num_values());
    OASES_RETURN_IF_ERROR(verify());
    return std::move(pg_);
  }

 private:
  const Graph& global_;
  const ShardingResult& sr_;
  PartitionedGraph pg_;
  std::map<std::pair<ValueId, size_t>, ValueId> converted_;  // (value, hash of target spec) -> value
  std::map<std::string, ValueId> shared_;                      // LowerContext::shared

  ShardingSpec& spec(ValueId v) {
    if (static_cast<size_t>(v) >= pg_.specs.size()) pg_.specs.resize(static_cast<size_t>(v) + 1);
    return pg_.specs[static_cast<size_t>(v)];
  }

  // Emits a node with one output in `out_spec`; the output's local shape comes from `global_shape`.
  ValueId emit(const std::string& op, const std::vector<ValueId>& ins, AttrMap attrs, DType dt, const Shape& global_shape,
               const ShardingSpec& spec_in, const std::string& base, NodeId like, const std::string& domain = "") {
    Graph& g = pg_.local;
    const ShardingSpec out_spec = spec_in;  // spec_in may live in the spec table, which spec(out) grows
    std::string name = g.unique_name(base);
    ValueId out = g.add_value(g.unique_name(name + "_out"), dt, out_spec.local_shape(global_shape, pg_.mesh), true);
    NodeId n = g.add_node(op, ins, {out}, std::move(attrs), name, domain);
    if (like != kNoId && g.alive(like)) {
      const Node& l = g.node(like);
      Node& nn = g.node(n);
      nn.scope = l.scope;
      nn.phase = l.phase;
      nn.chunk = l.chunk;
      nn.origin = l.origin != kNoId ? l.origin : like;
    }
    spec(out) = out_spec;
    global_shape_[out] = global_shape;
    return out;
  }
  std::map<ValueId, Shape> global_shape_;
  Shape global_shape_of(ValueId v) {
    auto it = global_shape_.find(v);
    if (it != global_shape_.end()) return it->second;
    return global_.value(v).shape;
  }

  // The axis C with outer = (inner, C) major first (inner's base axes a major prefix of outer's),
  // or -1: an outer split is an inner split of which each rank keeps a C-th.
  int minor_axis(int outer, int inner) const {
    const Mesh& m = pg_.mesh;
    auto bases = [&](int a) { return m.is_base(a) ? std::vector<int>{a} : m.parts[static_cast<size_t>(a)]; };
    std::vector<int> o = bases(outer), i = bases(inner);
    if (i.size() >= o.size() || !std::equal(i.begin(), i.end(), o.begin())) return -1;
    std::vector<int> rest(o.begin() + static_cast<long>(i.size()), o.end());
    for (int a = 0; a < m.num_axes(); ++a) {
      if (bases(a) == rest) return a;
    }
    return -1;
  }

  AttrMap coll_attrs(int a) {
    AttrMap m;
    m.set_int("mesh_axis", a);
    m.set_int("group_size", pg_.mesh.sizes[static_cast<size_t>(a)]);
    return m;
  }

  Expected<ValueId> convert(ValueId v, const ShardingSpec& to, NodeId like) {
    auto key = std::make_pair(v, to.hash());
    auto it = converted_.find(key);
    if (it != converted_.end()) return it->second;
    const Mesh& m = pg_.mesh;
    ShardingSpec cur = spec(v);
    ValueId val = v;
    Shape gs = global_shape_of(v);
    DType dt = pg_.local.value(v).dtype;
    std::string base = pg_.local.value(v).name;
    NodeId producer = pg_.local.value(v).producer;
    NodeId anchor = producer != kNoId ? producer : like;
    // 0. a dimension moving between nested axes (compound meshes: dp over (m0 m1) -> dp over m0):
    //    gather over, or slice along, the minor axes only
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      int A = cur.dims[d].axis, B = to.dims[d].axis;
      if (A < 0 || B < 0 || A == B || cur.dims[d].segments != 1 || to.dims[d].segments != 1) continue;
      int C = minor_axis(A, B);
      bool gather = C >= 0;
      if (!gather) C = minor_axis(B, A);
      if (C < 0) continue;
      AttrMap at = coll_attrs(C);
      at.set_int("dim", static_cast<int64_t>(d));
      at.set_int("segments", 1);
      ShardingSpec next = cur.with_dim(d, B);
      if (next.validate(gs, m).is_ok() == false) continue;
      val = emit(gather ? "AllGather" : "ShardSlice", {val}, at, dt, gs, next, base + (gather ? "/all_gather" : "/shard_slice"), anchor,
                 kOasesDomain);
      cur = next;
      if (gather) ++pg_.collectives;
    }
    // 1. pending sums
    for (int a = 0; a < m.num_axes(); ++a) {
      if (!cur.is_partial(a) || to.is_partial(a)) continue;
      int e = to.dim_of_axis(a);
      if (e >= 0 && cur.dims[e].axis < 0 && cur.dim_of_axis(a) < 0) {
        AttrMap at = coll_attrs(a);
        at.set_int("dim", e);
        at.set_int("segments", to.dims[e].segments);
        ShardingSpec next = cur.with_partial(a, false).with_dim(static_cast<size_t>(e), a, to.dims[e].segments);
        val = emit("ReduceScatter", {val}, at, dt, gs, next, base + "/reduce_scatter", anchor, kOasesDomain);
        cur = next;
      } else {
        ShardingSpec next = cur.with_partial(a, false);
        val = emit("AllReduce", {val}, coll_attrs(a), dt, gs, next, base + "/all_reduce", anchor, kOasesDomain);
        cur = next;
      }
      ++pg_.collectives;
    }
    // 2. dimensions leaving an axis (or moving to another dimension)
    for (int a = 0; a < m.num_axes(); ++a) {
      int d = cur.dim_of_axis(a), e = to.dim_of_axis(a);
      if (d < 0) continue;
      if (e == d && cur.dims[d].segments == to.dims[e].segments) continue;
      if (e >= 0 && e != d && cur.dims[d].segments == 1 && to.dims[e].segments == 1 && cur.dims[e].axis < 0) {
        AttrMap at = coll_attrs(a);
        at.set_int("split_dim", e);
        at.set_int("concat_dim", d);
        ShardingSpec next = cur.with_dim(static_cast<size_t>(d), -1).with_dim(static_cast<size_t>(e), a);
        val = emit("AllToAll", {val}, at, dt, gs, next, base + "/all_to_all", anchor, kOasesDomain);
        cur = next;
      } else {
        AttrMap at = coll_attrs(a);
        at.set_int("dim", d);
        at.set_int("segments", cur.dims[d].segments);
        ShardingSpec next = cur.with_dim(static_cast<size_t>(d), -1);
        val = emit("AllGather", {val}, at, dt, gs, next, base + "/all_gather", anchor, kOasesDomain);
        cur = next;
      }
      ++pg_.collectives;
    }
    // 3. dimensions arriving on an axis: local slices
    for (int a = 0; a < m.num_axes(); ++a) {
      int e = to.dim_of_axis(a);
      if (e < 0 || (cur.dims[e].axis == a && cur.dims[e].segments == to.dims[e].segments)) continue;
      if (cur.dims[e].axis >= 0) {
        return error("cannot convert '{}' from {} to {}: dimension {} is split over two axes", base, spec(v).to_string(&m),
                     to.to_string(&m), e);
      }
      AttrMap at = coll_attrs(a);
      at.set_int("dim", e);
      at.set_int("segments", to.dims[e].segments);
      ShardingSpec next = cur.with_dim(static_cast<size_t>(e), a, to.dims[e].segments);
      val = emit("ShardSlice", {val}, at, dt, gs, next, base + "/shard_slice", anchor, kOasesDomain);
      cur = next;
    }
    if (cur != to) {
      return error("cannot convert '{}' from {} to {} (a partial sum cannot be created from whole values)", base, spec(v).to_string(&m),
                   to.to_string(&m));
    }
    converted_[key] = val;
    return val;
  }

  Status insert_conversions() {
    Graph& g = pg_.local;
    for (const Conversion& c : sr_.conversions) {
      NodeId like = c.consumer != kNoId ? c.consumer : g.value(c.value).producer;
      if (c.slot == -1) {
        // a pinned value: every reader gets the converted one (the spec recorded for the value is
        // already the pinned one, so convert from what the producer gives)
        std::vector<Use> readers = g.uses(c.value);
        bool was_output = g.is_output(c.value);
        spec(c.value) = c.from;
        OASES_ASSIGN_OR_RETURN(ValueId nv, convert(c.value, c.to, like));
        g.value(c.value).shape = c.from.local_shape(global_.value(c.value).shape, pg_.mesh);
        for (const Use& u : readers) g.set_input(u.node, u.slot, nv);
        if (was_output) g.replace_all_uses(c.value, nv);
        continue;
      }
      OASES_ASSIGN_OR_RETURN(ValueId nv, convert(c.value, c.to, like));
      if (c.consumer == kNoId) {
        std::vector<ValueId> outs = g.outputs();
        outs[static_cast<size_t>(c.slot)] = nv;
        g.set_outputs(outs);
      } else {
        g.set_input(c.consumer, c.slot, nv);
      }
    }
    return Status::ok();
  }

  // The context a lowering rule sees: this partitioner, at one node.
  class NodeLowering final : public LowerContext {
   public:
    NodeLowering(Partitioner& p, NodeId id) : p_(p), id_(id) {}
    Graph& graph() override { return p_.pg_.local; }
    NodeId node_id() const override { return id_; }
    const Mesh& mesh() const override { return p_.pg_.mesh; }
    ShardingSpec& spec(ValueId v) override { return p_.spec(v); }
    Shape global_shape(ValueId v) override { return p_.global_shape_of(v); }
    void set_global_shape(ValueId v, const Shape& global) override { p_.global_shape_[v] = global; }
    ValueId emit(const std::string& op, const std::vector<ValueId>& ins, AttrMap attrs, DType dt, const Shape& global_shape,
                 const ShardingSpec& out_spec, const std::string& base, const std::string& domain) override {
      return p_.emit(op, ins, std::move(attrs), dt, global_shape, out_spec, base, id_, domain);
    }
    void add_collectives(int n) override { p_.pg_.collectives += n; }
    std::map<std::string, ValueId>& shared() override { return p_.shared_; }

   private:
    Partitioner& p_;
    NodeId id_;
  };

  Status lower_nodes() {
    Graph& g = pg_.local;
    const Mesh& m = pg_.mesh;
    // layout markers for this mesh did their work (the conversions before them): drop them (on
    // another mesh, the chunk axis of micro-batching, they stay for the real partition)
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& n = g.node(id);
      if (n.domain != kOasesDomain || n.op_type != "Layout" || n.attrs.get_string("mesh", "") != m.to_string()) continue;
      ValueId in = n.inputs[0], out = n.outputs[0];
      g.remove_node(id);
      g.replace_all_uses(out, in);
    }
    // Whole markers (values leaving a pipeline stage, made whole by the conversion before them)
    for (NodeId id : g.nodes()) {
      if (!g.alive(id) || g.node(id).domain != kOasesDomain || g.node(id).op_type != "Whole") continue;
      ValueId in = g.node(id).inputs[0], out = g.node(id).outputs[0];
      spec(out) = spec(in);
      global_shape_[out] = global_shape_of(in);
      dissolve_whole_marker(g, id);
    }
    // every op with a partition lowering rewrites its node (graph/lowering.h)
    const OpRegistry& reg = OpRegistry::global();
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const OpSchema* s = reg.find(g.node(id).domain, g.node(id).op_type);
      if (!s || !s->lower) continue;
      NodeLowering ctx(*this, id);
      OASES_RETURN_IF_ERROR(s->lower(ctx));
    }
    return Status::ok();
  }

  Status verify() {
    Graph& g = pg_.local;
    OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
    for (NodeId id : order) {
      Node& n = g.node(id);
      std::vector<Shape> want;
      for (ValueId o : n.outputs) want.push_back(o == kNoId ? Shape{} : g.value(o).shape);
      Status st = infer_node(g, id);
      if (!st.is_ok()) return error("partitioning: {}", st.message());
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (n.outputs[k] == kNoId) continue;
        if (g.value(n.outputs[k]).shape != want[k]) {
          return error(
              "partitioning: {} gives output '{}' the local shape {}, its spec {} needs {} (an attribute still holds a global "
              "shape: does the op's schema lack a lower rule?)",
              n.describe(), g.value(n.outputs[k]).name, shape_str(g.value(n.outputs[k]).shape), spec(n.outputs[k]).to_string(&pg_.mesh),
              shape_str(want[k]));
        }
      }
    }
    return g.validate();
  }
};

}  // namespace

Expected<PartitionedGraph> partition_graph(const Graph& global, const ShardingResult& sharding) {
  Partitioner p(global, sharding);
  return p.run();
}

Graph local_graph_for_rank(const PartitionedGraph& pg, int64_t rank) {
  Graph g = pg.local;
  for (size_t v = 0; v < g.num_values(); ++v) {
    Value& val = g.value(static_cast<ValueId>(v));
    if (!val.is_constant()) continue;
    const ShardingSpec& s = pg.specs[v];
    if (s.is_replicated() && val.constant.shape() == val.shape) {
      // parameters are updated in place: every rank owns its copy (threads share the template)
      if (val.is_initializer) val.constant = val.constant.clone();
      continue;
    }
    val.constant = slice_for_rank(val.constant, s, pg.mesh, rank);
  }
  return g;
}

}  // namespace oases

namespace oases {

namespace {

int bucket_in_order(PartitionedGraph& pg, const std::vector<NodeId>& cands, int64_t bucket_bytes) {
  Graph& g = pg.local;
  int buckets = 0;
  size_t i = 0;
  while (i < cands.size()) {
    std::vector<NodeId> bucket;
    int64_t bytes = 0;
    while (i < cands.size() &&
           (bucket.empty() || bytes + static_cast<int64_t>(g.value(g.node(cands[i]).inputs[0]).nbytes()) <= bucket_bytes)) {
      bytes += static_cast<int64_t>(g.value(g.node(cands[i]).inputs[0]).nbytes());
      bucket.push_back(cands[i++]);
    }
    if (bucket.size() > 1) {
      std::vector<ValueId> ins, outs;
      AttrMap attrs = g.node(bucket[0]).attrs;
      std::string scope = g.node(bucket.back()).scope;
      Node::Phase phase = g.node(bucket.back()).phase;
      for (NodeId b : bucket) {
        ins.push_back(g.node(b).inputs[0]);
        outs.push_back(g.node(b).outputs[0]);
      }
      for (NodeId b : bucket) g.remove_node(b);
      NodeId nb = g.add_node("AllReduce", ins, outs, attrs, g.unique_name("grad_bucket"), kOasesDomain);
      g.node(nb).scope = scope;
      g.node(nb).phase = phase;
      g.node(nb).chunk = -1;
      pg.collectives -= static_cast<int>(bucket.size()) - 1;
    }
    ++buckets;
  }
  return buckets;
}

}  // namespace

int bucket_gradient_all_reduces(PartitionedGraph& pg, int mesh_axis, int64_t bucket_bytes, const std::function<int(NodeId)>& group) {
  Graph& g = pg.local;
  auto order = g.topo_order();
  if (!order) return 0;
  // candidates in readiness order (per group): single-input all-reduces over the axis feeding a
  // graph output
  std::map<int, std::vector<NodeId>> groups;
  for (NodeId id : *order) {
    const Node& n = g.node(id);
    if (n.domain != kOasesDomain || n.op_type != "AllReduce" || n.inputs.size() != 1) continue;
    if (n.attrs.get_int("mesh_axis", -1) != mesh_axis || n.attrs.get_string("op", "sum") != "sum") continue;
    if (!g.is_output(n.outputs[0]) || g.value(n.inputs[0]).dtype != DType::kF32) continue;
    groups[group ? group(id) : 0].push_back(id);
  }
  int buckets = 0;
  for (const auto& [key, cands] : groups) buckets += bucket_in_order(pg, cands, bucket_bytes);
  return buckets;
}

int shard_gradient_reductions(PartitionedGraph& pg) {
  Graph& g = pg.local;
  int changed = 0;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (n.domain != kOasesDomain || n.op_type != "AllReduce" || n.attrs.get_string("op", "sum") != "sum") continue;
    const int64_t axis = n.attrs.get_int("mesh_axis", -1);
    if (axis < 0 || axis >= pg.mesh.num_axes() || pg.mesh.axis_size(static_cast<int>(axis)) <= 1) continue;
    bool gradients = true;
    for (ValueId in : n.inputs) gradients = gradients && g.value(in).dtype == DType::kF32;
    for (ValueId out : n.outputs) gradients = gradients && g.is_output(out) && g.uses(out).empty();
    if (!gradients) continue;
    std::vector<ValueId> ins = n.inputs, outs = n.outputs;
    AttrMap attrs = n.attrs;
    attrs.erase("op");
    const int64_t members = pg.mesh.axis_size(static_cast<int>(axis));
    std::string name = n.name, scope = n.scope;
    Node::Phase phase = n.phase;
    int chunk = n.chunk;
    g.remove_node(id);
    for (size_t i = 0; i < outs.size(); ++i) {
      g.value(outs[i]).shape = Shape{flat_piece(shape_numel(g.value(ins[i]).shape), members)};
      if (static_cast<size_t>(outs[i]) < pg.specs.size()) pg.specs[static_cast<size_t>(outs[i])] = ShardingSpec::replicated(1);
    }
    NodeId z = g.add_node("FlatReduceScatter", ins, outs, attrs, name + "/zero", kOasesDomain);
    g.node(z).scope = scope;
    g.node(z).phase = phase;
    g.node(z).chunk = chunk;
    ++changed;
  }
  return changed;
}

int zero_whole_axis(const ShardingSpec& spec, const Mesh& mesh) {
  const int dp = mesh.axis("dp");
  return dp >= 0 && mesh.axis_size(dp) > 1 && !spec.uses_axis(dp) ? dp : -1;
}

void dissolve_whole_marker(Graph& g, NodeId marker) {
  ValueId in = g.node(marker).inputs[0], out = g.node(marker).outputs[0];
  g.remove_node(marker);
  NodeId p = g.producer(in);
  if (p == kNoId) {
    g.replace_all_uses(out, in);
    return;
  }
  const std::vector<ValueId>& outs = g.node(p).outputs;
  int slot = static_cast<int>(std::find(outs.begin(), outs.end(), in) - outs.begin());
  g.value(out).shape = g.value(in).shape;
  g.set_output(p, slot, out);
  g.replace_all_uses(in, out);
}

void dissolve_whole_markers(Graph& g) {
  for (NodeId id : g.nodes()) {
    if (g.alive(id) && g.node(id).domain == kOasesDomain && g.node(id).op_type == "Whole") dissolve_whole_marker(g, id);
  }
}

}  // namespace oases
