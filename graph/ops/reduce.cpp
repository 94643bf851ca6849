// Reductions. Canonical form: axes in the "axes" attribute (ReduceSum takes them as an input
// from opset 13, the others from opset 18), keepdims, noop_with_empty_axes; empty axes reduce
// everything unless noop_with_empty_axes is set. ArgMax/ArgMin give int64 indices; TopK the k
// largest (or smallest) values along an axis with their int64 indices, canonical attr "k".
#include "graph/autodiff.h"
#include "graph/lowering.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

namespace {

Status infer_reduce(InferContext& c) {
  int64_t rank = c.rank(0);
  std::vector<int64_t> axes = c.attrs().get_ints("axes");
  bool keepdims = c.attrs().get_int("keepdims", 1) != 0;
  bool noop = c.attrs().get_int("noop_with_empty_axes", 0) != 0;
  if (axes.empty()) {
    if (noop) {
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    }
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  OASES_ASSIGN_OR_RETURN(auto norm, normalize_axes(c, axes, rank));
  c.node().attrs.set_ints("axes", norm);
  Shape out;
  for (int64_t i = 0; i < rank; ++i) {
    bool reduced = std::find(norm.begin(), norm.end(), i) != norm.end();
    if (!reduced) {
      out.push_back(c.shape(0)[i]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

// Sum/Mean: broadcast dy back over the reduced axes. Max/Min: to the elements equal to the result.
// L1: sign(x); Prod: y / x (inputs free of zeros); LogSum: 1 / Σx = exp(-y); LogSumExp: exp(x - y).
Status reduce_grad(GradContext& c, const std::string& kind) {
  ValueId x = c.input(0), dy = c.grad_out(0), y = c.output(0);
  const Shape& xs = c.shape(x);
  std::vector<int64_t> axes = c.attrs().get_ints("axes");
  Shape kept = xs;
  for (int64_t a : axes) kept[a] = 1;
  if (axes.empty()) kept = xs;  // noop_with_empty_axes
  ValueId dyk = c.op("Reshape", {dy}, AttrMap{{"shape", Attribute::of_ints(kept)}});
  ValueId yk = c.op("Reshape", {y}, AttrMap{{"shape", Attribute::of_ints(kept)}});
  ValueId g = c.op("Expand", {dyk}, AttrMap{{"shape", Attribute::of_ints(xs)}});
  DType dt = c.dtype(x);
  if (kind == "ReduceMean") {
    int64_t n = shape_numel(xs) / std::max<int64_t>(1, shape_numel(kept));
    g = c.op("Div", {g, c.scalar(static_cast<double>(n), dt)});
  } else if (kind == "ReduceSumSquare") {
    g = c.op("Mul", {g, c.op("Mul", {x, c.scalar(2.0, dt)})});
  } else if (kind == "ReduceL2") {
    g = c.op("Mul", {g, c.op("Div", {x, yk})});
  } else if (kind == "ReduceMax" || kind == "ReduceMin") {
    ValueId hit = c.op("Equal", {x, yk});
    g = c.op("Where", {hit, g, c.scalar(0.0, dt)});
  } else if (kind == "ReduceL1") {
    g = c.op("Mul", {g, c.op("Sign", {x})});
  } else if (kind == "ReduceProd") {
    g = c.op("Mul", {g, c.op("Div", {yk, x})});
  } else if (kind == "ReduceLogSum") {
    g = c.op("Mul", {g, c.op("Exp", {c.op("Neg", {yk})})});
  } else if (kind == "ReduceLogSumExp") {
    g = c.op("Mul", {g, c.op("Exp", {c.op("Sub", {x, yk})})});
  }
  c.add_grad(0, g);
  return Status::ok();
}

// Sum and Mean over a sharded dim give partial sums (the local Mean is rescaled when the graph
// is partitioned); the other reductions need their reduced dims whole.
Status shard_reduce(ShardContext& c, bool additive) {
  std::vector<int64_t> axes = c.node().attrs.get_ints("axes");
  bool keep = c.node().attrs.get_int("keepdims", 1) != 0;
  size_t rank = c.in(0).rank();
  if (axes.empty() && c.out_shape(0).size() == rank && c.out_shape(0) == c.in_shape(0)) {
    c.set_out(0, c.in(0));  // noop_with_empty_axes
    return Status::ok();
  }
  std::vector<bool> red(rank, false);
  for (int64_t a : axes) red[static_cast<size_t>(a)] = true;
  ShardingSpec in = c.in(0);
  if (!additive) {
    in = in.without_partial();
    for (size_t d = 0; d < rank; ++d) {
      if (red[d]) in.dims[d] = DimSpec{};
    }
    c.require(0, in);
  }
  ShardingSpec out;
  out.partial = in.partial;
  for (size_t d = 0; d < rank; ++d) {
    if (red[d]) {
      if (in.dims[d].axis >= 0) out.partial |= 1u << in.dims[d].axis;
      if (keep) out.dims.push_back(DimSpec{});
    } else {
      out.dims.push_back(in.dims[d]);
    }
  }
  c.set_out(0, out);
  return Status::ok();
}

// A mean over split dims is the local mean, scaled to a share of the global mean (its partial sum
// over the splitting axes completes it).
Status lower_reduce_mean(LowerContext& c) {
  Graph& g = c.graph();
  NodeId id = c.node_id();
  Node& n = g.node(id);
  const ShardingSpec in = c.spec(n.inputs[0]);
  int64_t parts = 1;
  for (int64_t a : n.attrs.get_ints("axes")) {
    const DimSpec& d = in.dims[static_cast<size_t>(a)];
    if (d.axis >= 0) parts *= c.mesh().axis_size(d.axis);
  }
  if (parts == 1) return Status::ok();
  ValueId out = n.outputs[0];
  ValueId tmp = g.add_value(g.unique_name(n.name + "_local_mean"), g.value(out).dtype, g.value(out).shape, true);
  c.spec(tmp) = ShardingSpec(c.spec(out));
  c.set_global_shape(tmp, c.global_shape(out));
  g.set_output(id, 0, tmp);
  Tensor f(g.value(out).dtype, {});
  store_from_double(f.raw_mutable(), f.dtype(), 0, 1.0 / static_cast<double>(parts));
  NodeId mul = g.add_node("Mul", {tmp, g.add_constant("mean_share", f)}, {out}, {}, g.unique_name(g.node(id).name + "_share"));
  g.node(mul).scope = g.node(id).scope;
  g.node(mul).phase = g.node(id).phase;
  return Status::ok();
}

// One axis dropped, and every axis kept as size 1, on inputs uniform in [lo, hi].
std::vector<OpExample> reduce_examples(double lo, double hi) {
  return {
      example("one axis", {ex_float({2, 4, 6}, lo, hi)}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(0)}}),
      example("all", {ex_float({2, 4}, lo, hi)}, AttrMap{{"keepdims", Attribute::of_int(1)}})};
}

}  // namespace

void register_reduce_ops(OpRegistry& r) {
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                         "ReduceLogSum", "ReduceLogSumExp"}) {
    const std::string kind = op;
    OpSchema s;
    s.op_type = op;
    s.oldest_version = 1;  // axes as an attribute, the canonical form
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.normalize = [](InferContext& c) -> Status {
      if (c.has_input(1)) {
        auto moved = operand_to_ints_attr(c, 1, "axes");
        if (!moved) return moved.status();
      }
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = infer_reduce;
    s.non_differentiable_inputs = {1};
    s.grad = [kind](GradContext& c) { return reduce_grad(c, kind); };
    const bool additive = kind == "ReduceSum" || kind == "ReduceMean";
    s.shard = [additive](ShardContext& c) { return shard_reduce(c, additive); };
    if (kind == "ReduceMean") s.lower = lower_reduce_mean;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{static_cast<double>(g.value(n.inputs[0]).numel()), io_bytes(g, n)}; };
    // positive inputs for Prod and LogSum: away from Prod's zeros and LogSum's domain edge
    const bool positive = kind == "ReduceProd" || kind == "ReduceLogSum";
    s.examples = examples_of(positive ? reduce_examples(0.5, 1.5) : reduce_examples(-1.0, 1.0));
    r.add(std::move(s));
  }
  for (const char* op : {"ArgMax", "ArgMin"}) {
    OpSchema s;
    s.op_type = op;
    s.oldest_version = 1;  // later versions add negative axes and select_last_index
    s.min_inputs = s.max_inputs = 1;
    s.foldable = true;
    s.differentiable = false;  // integer indices
    s.infer = [](InferContext& c) {
      int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), c.rank(0));
      if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 0), c.rank(0));
      c.node().attrs.set_int("axis", axis);
      Shape out = c.shape(0);
      if (c.attrs().get_int("keepdims", 1)) {
        out[axis] = 1;
      } else {
        out.erase(out.begin() + axis);
      }
      c.set_output(0, DType::kI64, out);
      return Status::ok();
    };
    s.shard = shard_replicated_only;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{static_cast<double>(g.value(n.inputs[0]).numel()), io_bytes(g, n)}; };
    s.examples = examples_of(
        {example("middle axis", {ex_float({2, 4, 6})}, AttrMap{{"axis", Attribute::of_int(1)}, {"keepdims", Attribute::of_int(0)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "TopK";
    s.oldest_version = 1;  // TopK-1 holds k as an attribute, the canonical form
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.min_outputs = s.max_outputs = 2;
    s.non_differentiable_inputs = {1};
    s.differentiable = false;  // the indices are integers; the values would need a scatter of dy
    s.normalize = [](InferContext& c) -> Status {
      if (!c.has_input(1)) return Status::ok();
      auto moved = operand_to_ints_attr(c, 1, "k");
      if (!moved) return moved.status();
      std::vector<int64_t> k = c.attrs().get_ints("k");
      if (k.size() != 1) return c.fail("K must hold one value, got [{}]", fmt::join(k, ","));
      c.node().attrs.set_int("k", k[0]);
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), rank);
      if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", -1), rank);
      if (!c.attrs().has("k")) return c.fail("K is missing");
      int64_t k = c.attrs().get_int("k", 0);
      if (k < 0 || k > c.shape(0)[axis]) {
        return c.fail("k {} is outside [0, {}] (axis {} of {})", k, c.shape(0)[axis], axis, shape_str(c.shape(0)));
      }
      if (c.dtype(0) == DType::kBool) return c.fail("input must be numeric, got bool");
      c.node().attrs.set_int("axis", axis);
      Shape out = c.shape(0);
      out[axis] = k;
      c.set_output(0, c.dtype(0), out);
      c.set_output(1, DType::kI64, out);
      return Status::ok();
    };
    s.shard = shard_replicated_only;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{2.0 * static_cast<double>(g.value(n.inputs[0]).numel()), io_bytes(g, n)}; };
    s.examples = examples_of({example("last axis", {ex_float({4, 6})}, AttrMap{{"k", Attribute::of_int(2)}}, 2)});
    r.add(std::move(s));
  }
}

}  // namespace oases
