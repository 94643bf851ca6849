#include "planner/partition.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "graph/autodiff.h"
#include "graph/op_registry.h"

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
    OASES_RETURN_IF_ERROR(verify());
    return std::move(pg_);
  }

 private:
  const Graph& global_;
  const ShardingResult& sr_;
  PartitionedGraph pg_;
  std::map<std::pair<ValueId, size_t>, ValueId> converted_;  // (value, hash of target spec) -> value

  ShardingSpec& spec(ValueId v) {
    if (static_cast<size_t>(v) >= pg_.specs.size()) pg_.specs.resize(static_cast<size_t>(v) + 1);
    return pg_.specs[static_cast<size_t>(v)];
  }

  // Emits a node with one output in `out_spec`; the output's local shape comes from `global_shape`.
  ValueId emit(const std::string& op, const std::vector<ValueId>& ins, AttrMap attrs, DType dt, const Shape& global_shape,
               const ShardingSpec& out_spec, const std::string& base, NodeId like, const std::string& domain = "") {
    Graph& g = pg_.local;
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

  ValueId scalar(float v) { return pg_.local.add_constant("partition_const", Tensor::scalar_f32(v)); }

  // Vocabulary-parallel cross-entropy (scores' classes split over axis a).
  Status lower_cross_entropy(NodeId id, int a, bool nll) {
    Graph& g = pg_.local;
    Node n = g.node(id);
    if (n.has_input(2)) return error("{}: class weights with a vocabulary-parallel loss are not supported", n.describe());
    ValueId scores = n.inputs[0], labels = n.inputs[1];
    ShardingSpec ss = spec(scores);
    Shape gs = global_shape_of(scores);
    Shape rows_g = global_shape_of(labels);
    ShardingSpec rows_spec = spec(labels);
    ShardingSpec stat_spec = ss.with_dim(1, -1);  // [N, 1, ...]
    Shape stat_g = gs;
    stat_g[1] = 1;
    DType dt = g.value(scores).dtype;
    std::string base = n.name + "/vocab_parallel";
    ValueId z = scores;
    ValueId s = kNoId;
    if (!nll) {
      ValueId m_loc = emit("ReduceMax", {scores}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(1)}}, dt,
                           stat_g, stat_spec, base + "/max", id);
      AttrMap mx = coll_attrs(a);
      mx.set_string("op", "max");
      ValueId m = emit("AllReduce", {m_loc}, mx, dt, stat_g, stat_spec, base + "/all_reduce_max", id, kOasesDomain);
      z = emit("Sub", {scores, m}, {}, dt, gs, ss, base + "/shift", id);
      ValueId e = emit("Exp", {z}, {}, dt, gs, ss, base + "/exp", id);
      ValueId s_loc = emit("ReduceSum", {e}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(0)}}, dt, rows_g,
                           rows_spec.with_partial(a, false), base + "/sum_exp", id);
      s = emit("AllReduce", {s_loc}, coll_attrs(a), dt, rows_g, rows_spec, base + "/all_reduce_sum", id, kOasesDomain);
      pg_.collectives += 2;
    }
    ValueId t_loc = emit("ShardedPick", {z, labels}, coll_attrs(a), dt, rows_g, rows_spec, base + "/pick", id, kOasesDomain);
    ValueId t = emit("AllReduce", {t_loc}, coll_attrs(a), dt, rows_g, rows_spec, base + "/all_reduce_pick", id, kOasesDomain);
    ++pg_.collectives;
    ValueId per_row = nll ? emit("Neg", {t}, {}, dt, rows_g, rows_spec, base + "/nll", id)
                          : emit("Sub", {emit("Log", {s}, {}, dt, rows_g, rows_spec, base + "/log_sum", id), t}, {}, dt, rows_g, rows_spec,
                                 base + "/loss_rows", id);
    ValueId valid = kNoId;
    if (n.attrs.has("ignore_index")) {
      ValueId ig = g.add_constant("ignore_index", Tensor::from_int64({n.attrs.get_int("ignore_index", -100)}, {}));
      ValueId lab = labels;
      if (g.value(labels).dtype != DType::kI64) {
        lab = emit("Cast", {labels}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kI64))}}, DType::kI64, rows_g, rows_spec,
                   base + "/labels64", id);
      }
      ValueId eq = emit("Equal", {lab, ig}, {}, DType::kBool, rows_g, rows_spec, base + "/ignored", id);
      ValueId keep = emit("Not", {eq}, {}, DType::kBool, rows_g, rows_spec, base + "/kept", id);
      valid = emit("Cast", {keep}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(dt))}}, dt, rows_g, rows_spec, base + "/valid", id);
      per_row = emit("Mul", {per_row, valid}, {}, dt, rows_g, rows_spec, base + "/masked", id);
    }
    std::string red = n.attrs.get_string("reduction", "mean");
    ValueId loss_out = n.outputs[0];
    std::vector<int64_t> all;
    for (size_t d = 0; d < rows_g.size(); ++d) all.push_back(static_cast<int64_t>(d));
    ValueId result = per_row;
    if (red != "none") {
      ShardingSpec scalar_spec = spec(loss_out);
      ValueId total = emit("ReduceSum", {per_row}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt, {},
                           scalar_spec, base + "/total", id);
      result = total;
      if (red == "mean") {
        ValueId count = valid != kNoId
                            ? emit("ReduceSum", {valid}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt,
                                   {}, scalar_spec, base + "/count", id)
                            : g.add_constant("rows", Tensor::scalar_f32(static_cast<float>(shape_numel(rows_g))));
        result = emit("Div", {total, count}, {}, dt, {}, scalar_spec, base + "/mean", id);
      }
    }
    // the loss value keeps its id: re-point its producer
    NodeId last = g.value(result).producer;
    std::vector<ValueId> log_prob;
    if (!nll && n.output(1) != kNoId) log_prob.push_back(n.outputs[1]);
    g.remove_node(id);
    g.set_output(last, 0, loss_out);
    if (!log_prob.empty()) {
      ValueId ls = emit("Unsqueeze", {emit("Log", {s}, {}, dt, rows_g, rows_spec, base + "/log_sum2", kNoId)},
                        AttrMap{{"axes", Attribute::of_ints({1})}}, dt, stat_g, stat_spec, base + "/lse", kNoId);
      NodeId lp = g.value(emit("Sub", {z, ls}, {}, dt, gs, ss, base + "/log_prob", kNoId)).producer;
      g.set_output(lp, 0, log_prob[0]);
    }
    return Status::ok();
  }

  // Gradient of the vocabulary-parallel cross-entropy: (softmax - onehot) · coefficient.
  Status lower_cross_entropy_grad(NodeId id, int a, bool nll) {
    Graph& g = pg_.local;
    Node n = g.node(id);
    if (n.has_input(3)) return error("{}: class weights with a vocabulary-parallel loss are not supported", n.describe());
    ValueId dloss = n.inputs[0], scores = n.inputs[1], labels = n.inputs[2];
    ShardingSpec ss = spec(scores);
    Shape gs = global_shape_of(scores), rows_g = global_shape_of(labels);
    ShardingSpec rows_spec = spec(labels);
    Shape stat_g = gs;
    stat_g[1] = 1;
    ShardingSpec stat_spec = ss.with_dim(1, -1);
    DType dt = g.value(scores).dtype;
    std::string base = n.name + "/vocab_parallel";
    ValueId p;
    if (nll) {
      p = emit("Mul", {scores, scalar(0.f)}, {}, dt, gs, ss, base + "/zeros", id);
    } else {
      ValueId m_loc = emit("ReduceMax", {scores}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(1)}}, dt,
                           stat_g, stat_spec, base + "/max", id);
      AttrMap mx = coll_attrs(a);
      mx.set_string("op", "max");
      ValueId m = emit("AllReduce", {m_loc}, mx, dt, stat_g, stat_spec, base + "/all_reduce_max", id, kOasesDomain);
      ValueId e = emit("Exp", {emit("Sub", {scores, m}, {}, dt, gs, ss, base + "/shift", id)}, {}, dt, gs, ss, base + "/exp", id);
      ValueId s_loc = emit("ReduceSum", {e}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(1)}}, dt, stat_g,
                           stat_spec, base + "/sum_exp", id);
      ValueId s = emit("AllReduce", {s_loc}, coll_attrs(a), dt, stat_g, stat_spec, base + "/all_reduce_sum", id, kOasesDomain);
      p = emit("Div", {e, s}, {}, dt, gs, ss, base + "/softmax", id);
      pg_.collectives += 2;
    }
    AttrMap oh = coll_attrs(a);
    if (n.attrs.has("ignore_index")) oh.set_int("ignore_index", n.attrs.get_int("ignore_index", -100));
    ValueId diff = emit("ShardedOneHotSub", {p, labels}, oh, dt, gs, ss, base + "/minus_onehot", id, kOasesDomain);
    std::string red = n.attrs.get_string("reduction", "mean");
    ValueId coef = dloss;
    if (red == "none") {
      coef = emit("Unsqueeze", {dloss}, AttrMap{{"axes", Attribute::of_ints({1})}}, dt, stat_g, stat_spec, base + "/coef", id);
    } else if (red == "mean") {
      ValueId count;
      std::vector<int64_t> all;
      for (size_t d = 0; d < rows_g.size(); ++d) all.push_back(static_cast<int64_t>(d));
      if (n.attrs.has("ignore_index")) {
        ValueId ig = g.add_constant("ignore_index", Tensor::from_int64({n.attrs.get_int("ignore_index", -100)}, {}));
        ValueId lab = labels;
        if (g.value(labels).dtype != DType::kI64) {
          lab = emit("Cast", {labels}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kI64))}}, DType::kI64, rows_g, rows_spec,
                     base + "/labels64", id);
        }
        ValueId keep = emit("Not", {emit("Equal", {lab, ig}, {}, DType::kBool, rows_g, rows_spec, base + "/ignored", id)}, {}, DType::kBool,
                            rows_g, rows_spec, base + "/kept", id);
        ValueId valid =
            emit("Cast", {keep}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(dt))}}, dt, rows_g, rows_spec, base + "/valid", id);
        count = emit("ReduceSum", {valid}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt, {},
                     ShardingSpec::replicated(0), base + "/count", id);
      } else {
        count = g.add_constant("rows", Tensor::scalar_f32(static_cast<float>(shape_numel(rows_g))));
      }
      coef = emit("Div", {dloss, count}, {}, dt, {}, spec(dloss), base + "/coef", id);
    }
    ValueId result = emit("Mul", {diff, coef}, {}, dt, gs, spec(n.outputs[0]), base + "/grad", id);
    NodeId last = g.value(result).producer;
    ValueId out = n.outputs[0];
    g.remove_node(id);
    g.set_output(last, 0, out);
    return Status::ok();
  }

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
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      Node& n = g.node(id);
      if (n.domain == kOasesDomain &&
          (n.op_type == "AllReduce" || n.op_type == "AllGather" || n.op_type == "ReduceScatter" || n.op_type == "ShardSlice" ||
           n.op_type == "AllToAll" || n.op_type == "ShardedPick" || n.op_type == "ShardedOneHotSub")) {
        continue;
      }
      auto local_out = [&](int k) { return g.value(n.outputs[static_cast<size_t>(k)]).shape; };
      const std::string& op = n.op_type;
      bool dflt = is_default_domain(n.domain);
      if (dflt && (op == "Reshape" || op == "Expand")) {
        n.attrs.set_ints("shape", local_out(0));
      } else if (dflt && op == "ConstantOfShape") {
        n.attrs.set_ints("shape", local_out(0));
      } else if (dflt && op == "Split") {
        int64_t axis = n.attrs.get_int("axis", 0);
        std::vector<int64_t> sizes;
        for (size_t k = 0; k < n.outputs.size(); ++k) sizes.push_back(g.value(n.outputs[k]).shape[static_cast<size_t>(axis)]);
        n.attrs.set_ints("split", sizes);
      } else if ((dflt && op == "Slice") || (n.domain == kOasesDomain && op == "SliceGrad")) {
        std::vector<int64_t> axes = n.attrs.get_ints("axes"), lens = n.attrs.get_ints("lengths");
        Shape in_local = op == "Slice" ? g.value(n.inputs[0]).shape : local_out(0);
        Shape in_global = op == "Slice" ? global_shape_of(n.inputs[0]) : global_shape_of(n.outputs[0]);
        for (size_t i = 0; i < axes.size(); ++i) {
          size_t a = static_cast<size_t>(axes[i]);
          if (in_local[a] != in_global[a] && lens[i] == in_global[a]) lens[i] = in_local[a];
        }
        n.attrs.set_ints("lengths", lens);
        if (op == "SliceGrad") n.attrs.set_ints("input_shape", local_out(0));
      } else if (n.domain == kOasesDomain && op == "GatherGrad") {
        n.attrs.set_ints("data_shape", local_out(0));
        size_t axis = static_cast<size_t>(n.attrs.get_int("axis", 0));
        const DimSpec& d = spec(n.outputs[0]).dims[axis];
        if (d.axis >= 0) {
          if (axis != 0) return error("{}: a table split along gathered axis {} is not supported", n.describe(), axis);
          n.attrs.set_int("row_mesh_axis", d.axis);
        }
        if (n.inputs.size() > 2) g.set_input(id, 2, kNoId);  // the table only carried its spec
      } else if (dflt && op == "ReduceMean") {
        // a mean over split dims: the local mean, scaled to a share of the global mean
        ShardingSpec in = spec(n.inputs[0]);
        int64_t parts = 1;
        for (int64_t a : n.attrs.get_ints("axes")) {
          const DimSpec& d = in.dims[static_cast<size_t>(a)];
          if (d.axis >= 0) parts *= m.axis_size(d.axis);
        }
        if (parts > 1) {
          ValueId out = n.outputs[0];
          ValueId tmp = g.add_value(g.unique_name(n.name + "_local_mean"), g.value(out).dtype, g.value(out).shape, true);
          spec(tmp) = spec(out);
          global_shape_[tmp] = global_shape_of(out);
          g.set_output(id, 0, tmp);
          Tensor f(g.value(out).dtype, {});
          store_from_double(f.raw_mutable(), f.dtype(), 0, 1.0 / static_cast<double>(parts));
          NodeId mul = g.add_node("Mul", {tmp, g.add_constant("mean_share", f)}, {out}, {}, g.unique_name(n.name + "_share"));
          g.node(mul).scope = g.node(id).scope;
          g.node(mul).phase = g.node(id).phase;
        }
      } else if (dflt && op == "Gather") {
        size_t axis = static_cast<size_t>(n.attrs.get_int("axis", 0));
        const DimSpec& d = spec(n.inputs[0]).dims[axis];
        if (d.axis >= 0) {
          if (axis != 0) return error("{}: a table split along gathered axis {} is not supported", n.describe(), axis);
          n.op_type = "ShardedGather";
          n.domain = kOasesDomain;
          n.attrs = coll_attrs(d.axis);
        }
      } else if (dflt && (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss")) {
        const DimSpec& d = spec(n.inputs[0]).dims[1];
        if (d.axis >= 0) OASES_RETURN_IF_ERROR(lower_cross_entropy(id, d.axis, op == "NegativeLogLikelihoodLoss"));
      } else if (n.domain == kOasesDomain && (op == "SoftmaxCrossEntropyGrad" || op == "NLLLossGrad")) {
        const DimSpec& d = spec(n.inputs[1]).dims[1];
        if (d.axis >= 0) OASES_RETURN_IF_ERROR(lower_cross_entropy_grad(id, d.axis, op == "NLLLossGrad"));
      } else if ((dflt && op == "Dropout") || (n.domain == kOasesDomain && op == "DropoutGrad")) {
        // the mask is drawn from each element's index in the whole tensor, so every layout replays
        // the same mask: record the whole shape (once) and the axis splitting each dim
        const ShardingSpec& s = spec(n.inputs[0]);
        if (!s.is_replicated()) {
          if (!n.attrs.has("mask_shape")) n.attrs.set_ints("mask_shape", global_shape_of(n.inputs[0]));
          std::vector<int64_t> axes = n.attrs.get_ints("shard_axes", std::vector<int64_t>(s.rank(), -1));
          for (size_t d = 0; d < s.rank(); ++d) {
            if (s.dims[d].axis >= 0) axes[d] = s.dims[d].axis;
          }
          n.attrs.set_ints("shard_axes", axes);
        }
      }
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
          return error("partitioning: {} gives output '{}' the local shape {}, its spec {} needs {}", n.describe(),
                       g.value(n.outputs[k]).name, shape_str(g.value(n.outputs[k]).shape), spec(n.outputs[k]).to_string(&pg_.mesh),
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

int bucket_gradient_all_reduces(PartitionedGraph& pg, int mesh_axis, int64_t bucket_bytes) {
  Graph& g = pg.local;
  auto order = g.topo_order();
  if (!order) return 0;
  // candidates in readiness order: single-input all-reduces over the axis feeding a graph output
  std::vector<NodeId> cands;
  for (NodeId id : *order) {
    const Node& n = g.node(id);
    if (n.domain != kOasesDomain || n.op_type != "AllReduce" || n.inputs.size() != 1) continue;
    if (n.attrs.get_int("mesh_axis", -1) != mesh_axis || n.attrs.get_string("op", "sum") != "sum") continue;
    if (!g.is_output(n.outputs[0]) || g.value(n.inputs[0]).dtype != DType::kF32) continue;
    cands.push_back(id);
  }
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

}  // namespace oases
