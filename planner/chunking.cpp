#include "planner/chunking.h"

#include <fmt/format.h>

#include "graph/autodiff.h"
#include "graph/op_registry.h"
#include "planner/partition.h"
#include "planner/propagation.h"

namespace oases {

namespace {

class Unroller {
 public:
  Unroller(Graph& g, int k, std::vector<ShardingSpec> specs) : g_(g), K_(k), specs_(std::move(specs)) {}
  const std::map<ValueId, std::vector<ValueId>>& versions() const { return versions_; }

  Status run(const std::vector<ValueId>& inputs, const std::vector<Shape>& global_input_shapes) {
    OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g_.topo_order());
    // chunked inputs: the input keeps the whole batch; each chunk reads a slice of it
    for (size_t i = 0; i < inputs.size(); ++i) {
      ValueId in = inputs[i];
      if (!specs_[static_cast<size_t>(in)].uses_axis(0)) continue;
      Shape local = g_.value(in).shape;
      g_.value(in).shape = global_input_shapes[i];
      std::vector<ValueId> parts;
      for (int k = 0; k < K_; ++k) {
        ValueId part = g_.add_value(g_.unique_name(fmt::format("c{}/{}", k, g_.value(in).name)), g_.value(in).dtype, local, true);
        AttrMap a{{"axes", Attribute::of_ints({0})},
                  {"starts", Attribute::of_ints({k * local[0]})},
                  {"steps", Attribute::of_ints({1})},
                  {"lengths", Attribute::of_ints({local[0]})},
                  {"resolved", Attribute::of_int(1)}};
        NodeId s = g_.add_node("Slice", {in}, {part}, a, g_.unique_name(fmt::format("c{}/slice_{}", k, g_.value(in).name)));
        g_.node(s).chunk = k;
        parts.push_back(part);
      }
      versions_[in] = parts;
      // the original readers of the input now read chunk 0's slice (set below, node by node)
    }
    for (NodeId id : order) {
      if (!g_.alive(id)) continue;
      Node& n = g_.node(id);
      if (op_has_trait(n, kTraitCombinesChunks)) {
        OASES_RETURN_IF_ERROR(combine(id));
        continue;
      }
      bool variant = false;
      for (ValueId v : n.inputs) variant |= v != kNoId && versions_.count(v);
      if (!variant) continue;
      repeat(id);
    }
    return Status::ok();
  }

 private:
  Graph& g_;
  int K_;
  std::vector<ShardingSpec> specs_;
  std::map<ValueId, std::vector<ValueId>> versions_;  // variant value -> its value in each chunk

  ValueId version(ValueId v, int k) {
    auto it = versions_.find(v);
    return it == versions_.end() ? v : it->second[static_cast<size_t>(k)];
  }

  // A node reading chunk-dependent values: chunk 0 keeps the node, chunks 1.. get copies.
  // A dropout copy replays the unchunked node's mask: same key, offsets of its rows.
  static void dropout_chunk_attrs(AttrMap& a, const std::string& key, int k, const Shape& local) {
    if (!a.has("mask_shape")) return;
    a.set_string("key_node", a.get_string("key_node", key));
    std::vector<int64_t> axes = a.get_ints("shard_axes"), off = a.get_ints("mask_offsets", std::vector<int64_t>(axes.size(), 0));
    for (size_t d = 0; d < axes.size() && d < local.size(); ++d) {
      if (axes[d] == 0) {  // the chunk axis: a static offset
        off[d] += k * local[d];
        axes[d] = -1;
      }
    }
    a.set_ints("shard_axes", axes);
    a.set_ints("mask_offsets", off);
  }

  void repeat(NodeId id) {
    Node proto = g_.node(id);
    bool dropout = op_has_trait(proto, kTraitRandom);
    Shape local = proto.inputs.empty() || proto.inputs[0] == kNoId ? Shape{} : g_.value(proto.inputs[0]).shape;
    std::vector<std::vector<ValueId>> outs(proto.outputs.size());
    for (int k = 0; k < K_; ++k) {
      std::vector<ValueId> ins;
      for (ValueId v : proto.inputs) ins.push_back(v == kNoId ? kNoId : version(v, k));
      if (k == 0) {
        for (size_t s = 0; s < ins.size(); ++s) {
          if (ins[s] != proto.inputs[s]) g_.set_input(id, static_cast<int>(s), ins[s]);
        }
        Node& n = g_.node(id);
        n.chunk = 0;
        if (dropout) dropout_chunk_attrs(n.attrs, proto.name, 0, local);
        n.name = "c0/" + n.name;
        for (size_t o = 0; o < proto.outputs.size(); ++o) outs[o].push_back(proto.outputs[o]);
        continue;
      }
      std::vector<ValueId> new_outs;
      for (ValueId o : proto.outputs) {
        if (o == kNoId) {
          new_outs.push_back(kNoId);
          continue;
        }
        const Value& ov = g_.value(o);
        ValueId nv = g_.add_value(g_.unique_name(fmt::format("c{}/{}", k, ov.name)), ov.dtype, ov.shape, true);
        new_outs.push_back(nv);
      }
      AttrMap attrs = proto.attrs;
      if (dropout) dropout_chunk_attrs(attrs, proto.name, k, local);
      NodeId c = g_.add_node(proto.op_type, ins, new_outs, attrs, g_.unique_name(fmt::format("c{}/{}", k, proto.name)), proto.domain);
      Node& cn = g_.node(c);
      cn.scope = proto.scope;
      cn.phase = proto.phase;
      cn.opset = proto.opset;
      cn.chunk = k;
      for (size_t o = 0; o < new_outs.size(); ++o) outs[o].push_back(new_outs[o]);
    }
    for (size_t o = 0; o < proto.outputs.size(); ++o) {
      if (proto.outputs[o] != kNoId) versions_[proto.outputs[o]] = outs[o];
    }
  }

  NodeId add(const std::string& op, std::vector<ValueId> ins, std::vector<ValueId> outs, AttrMap a, const Node& like, int chunk) {
    NodeId n = g_.add_node(op, ins, outs, std::move(a), g_.unique_name(like.name + "/" + op));
    Node& nn = g_.node(n);
    nn.scope = like.scope;
    nn.phase = like.phase;
    nn.chunk = chunk;
    return n;
  }

  // A collective over the chunk axis becomes a local combination of the chunks' values.
  Status combine(NodeId id) {
    Node n = g_.node(id);
    ValueId in = n.inputs[0], out = n.outputs[0];
    const Value ov = g_.value(out);
    std::string op = n.op_type;
    int64_t dim = n.attrs.get_int("dim", 0);
    if (n.attrs.get_int("segments", 1) != 1) return error("{}: chunking a segmented dimension is not supported", n.describe());
    auto local_version = [&](int k) { return version(in, k); };
    g_.remove_node(id);
    if (op == "AllReduce" || op == "ReduceScatter") {
      bool mx = n.attrs.get_string("op", "sum") == "max";
      // sum (or max) in chunk order
      ValueId acc = local_version(0);
      for (int k = 1; k < K_; ++k) {
        bool last = k == K_ - 1 && op == "AllReduce";
        ValueId dst = last ? out : g_.add_value(g_.unique_name(ov.name + "/combine"), ov.dtype, g_.value(acc).shape, true);
        add(mx ? "Max" : "Add", {acc, local_version(k)}, {dst}, {}, n, -1);
        acc = dst;
      }
      if (op == "AllReduce") {
        if (K_ == 1) add("Identity", {acc}, {out}, {}, n, -1);
        return Status::ok();
      }
      // reduce-scatter: each chunk takes its slice of the sum
      std::vector<ValueId> parts;
      int64_t piece = g_.value(acc).shape[static_cast<size_t>(dim)] / K_;
      for (int k = 0; k < K_; ++k) {
        ValueId dst = k == 0 ? out : g_.add_value(g_.unique_name(fmt::format("c{}/{}", k, ov.name)), ov.dtype, ov.shape, true);
        add("Slice", {acc}, {dst}, slice_attrs(dim, k * piece, piece), n, k);
        parts.push_back(dst);
      }
      versions_[out] = parts;
      return Status::ok();
    }
    if (op == "AllGather") {
      std::vector<ValueId> ins;
      for (int k = 0; k < K_; ++k) ins.push_back(local_version(k));
      add("Concat", ins, {out}, AttrMap{{"axis", Attribute::of_int(dim)}}, n, -1);
      return Status::ok();
    }
    if (op == "ShardSlice") {
      std::vector<ValueId> parts;
      int64_t piece = ov.shape[static_cast<size_t>(dim)];
      for (int k = 0; k < K_; ++k) {
        ValueId dst = k == 0 ? out : g_.add_value(g_.unique_name(fmt::format("c{}/{}", k, ov.name)), ov.dtype, ov.shape, true);
        add("Slice", {in}, {dst}, slice_attrs(dim, k * piece, piece), n, k);
        parts.push_back(dst);
      }
      versions_[out] = parts;
      return Status::ok();
    }
    return error("{}: a {} over micro-batch chunks is not supported", n.describe(), op);
  }

  static AttrMap slice_attrs(int64_t dim, int64_t start, int64_t len) {
    return AttrMap{{"axes", Attribute::of_ints({dim})},
                   {"starts", Attribute::of_ints({start})},
                   {"steps", Attribute::of_ints({1})},
                   {"lengths", Attribute::of_ints({len})},
                   {"resolved", Attribute::of_int(1)}};
  }
};

}  // namespace

Expected<Graph> chunk_batch(const Graph& g, int chunks, std::map<ValueId, std::vector<ValueId>>* versions) {
  if (chunks <= 1) return g;
  Mesh mesh{{"chunk"}, {chunks}};
  std::map<ValueId, ShardingSpec> seeds;
  std::vector<ValueId> inputs = g.inputs();
  std::vector<Shape> shapes;
  for (ValueId v : inputs) {
    const Value& val = g.value(v);
    shapes.push_back(val.shape);
    if (val.shape.empty()) continue;
    if (val.shape[0] % chunks != 0) {
      return error("--chunks {} does not divide the batch size {} of input '{}'", chunks, val.shape[0], val.name);
    }
    seeds[v] = ShardingSpec::replicated(val.shape.size()).with_dim(0, 0);
  }
  OASES_ASSIGN_OR_RETURN(ShardingResult sr, propagate_sharding(g, mesh, seeds, {}));
  OASES_ASSIGN_OR_RETURN(PartitionedGraph pg, partition_graph(g, sr));
  Graph u = pg.local;
  Unroller un(u, chunks, pg.specs);
  OASES_RETURN_IF_ERROR(un.run(inputs, shapes));
  if (versions) *versions = un.versions();
  // check: every node's shapes still infer
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, u.topo_order());
  for (NodeId id : order) {
    std::vector<Shape> want;
    for (ValueId o : u.node(id).outputs) want.push_back(o == kNoId ? Shape{} : u.value(o).shape);
    Status st = infer_node(u, id);
    if (!st.is_ok()) return error("chunking: {}", st.message());
    const Node& n = u.node(id);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] != kNoId && u.value(n.outputs[k]).shape != want[k]) {
        return error("chunking: {} output {} has shape {}, expected {}", n.describe(), k, shape_str(u.value(n.outputs[k]).shape),
                     shape_str(want[k]));
      }
    }
  }
  OASES_RETURN_IF_ERROR(u.validate());
  return u;
}

}  // namespace oases
