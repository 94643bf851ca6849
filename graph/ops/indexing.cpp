// Indexing: Gather (embeddings), GatherElements, GatherND, ScatterND and ScatterElements (cache
// and mask updates), Trilu (causal masks), CumSum (position ids), OneHot.
#include "graph/autodiff.h"
#include "graph/lowering.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

namespace {

Status check_reduction(InferContext& c) {
  std::string red = c.attrs().get_string("reduction", "none");
  if (red != "none" && red != "add" && red != "mul" && red != "max" && red != "min") {
    return c.fail("reduction must be none, add, mul, max or min, got '{}'", red);
  }
  if (red != "none" && c.dtype(0) == DType::kBool) return c.fail("reduction '{}' on bool data", red);
  if (c.dtype(2) != c.dtype(0)) {
    return c.fail("updates have type {}, data {}", dtype_name(c.dtype(2)), dtype_name(c.dtype(0)));
  }
  return Status::ok();
}

// GatherND: data [B.., D..] (b = batch_dims), indices [B.., I.., m] int64 with m <= rank - b;
// out [B.., I.., D(b+m)..].
Status infer_gather_nd(InferContext& c) {
  const Shape &d = c.shape(0), &ix = c.shape(1);
  int64_t b = c.attrs().get_int("batch_dims", 0);
  if (c.dtype(1) != DType::kI64) return c.fail("indices '{}' must be int64, got {}", c.input(1).name, dtype_name(c.dtype(1)));
  if (d.empty() || ix.empty()) return c.fail("data {} and indices {} must have rank >= 1", shape_str(d), shape_str(ix));
  int64_t r = static_cast<int64_t>(d.size()), q = static_cast<int64_t>(ix.size());
  if (b < 0 || b >= std::min(r, q)) return c.fail("batch_dims {} must be below the ranks of data {} and indices {}", b, r, q);
  int64_t m = ix.back();
  if (m < 1 || m > r - b) {
    return c.fail("indices {} index {} dims of data {} past {} batch dims", shape_str(ix), m, shape_str(d), b);
  }
  for (int64_t i = 0; i < b; ++i) {
    if (d[i] != ix[i]) return c.fail("batch dim {} differs: data {}, indices {}", i, shape_str(d), shape_str(ix));
  }
  Shape out(ix.begin(), ix.end() - 1);
  out.insert(out.end(), d.begin() + b + m, d.end());
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

// ScatterND: data [D..], indices [J.., m] int64, updates [J.., D(m)..]; out like data.
Status infer_scatter_nd(InferContext& c) {
  const Shape &d = c.shape(0), &ix = c.shape(1), &u = c.shape(2);
  if (c.dtype(1) != DType::kI64) return c.fail("indices '{}' must be int64, got {}", c.input(1).name, dtype_name(c.dtype(1)));
  if (d.empty() || ix.empty()) return c.fail("data {} and indices {} must have rank >= 1", shape_str(d), shape_str(ix));
  int64_t m = ix.back();
  if (m < 1 || m > static_cast<int64_t>(d.size())) {
    return c.fail("indices {} index {} dims of data {}", shape_str(ix), m, shape_str(d));
  }
  Shape want(ix.begin(), ix.end() - 1);
  want.insert(want.end(), d.begin() + m, d.end());
  if (u != want) {
    return c.fail("updates {} must be {} for data {} and indices {}", shape_str(u), shape_str(want), shape_str(d), shape_str(ix));
  }
  OASES_RETURN_IF_ERROR(check_reduction(c));
  c.set_output(0, c.dtype(0), d);
  return Status::ok();
}

// ScatterElements: data [D..], indices and updates [I..] of data's rank; out like data.
Status infer_scatter_elements(InferContext& c) {
  const Shape &d = c.shape(0), &ix = c.shape(1);
  int64_t rank = static_cast<int64_t>(d.size());
  int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), rank);
  if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 0), rank);
  if (c.dtype(1) != DType::kI64 && c.dtype(1) != DType::kI32) {
    return c.fail("indices '{}' must be int32 or int64, got {}", c.input(1).name, dtype_name(c.dtype(1)));
  }
  if (static_cast<int64_t>(ix.size()) != rank || c.shape(2) != ix) {
    return c.fail("indices {} and updates {} must have one shape, of the rank of data {}", shape_str(ix), shape_str(c.shape(2)),
                  shape_str(d));
  }
  for (int64_t i = 0; i < rank; ++i) {
    if (i != axis && ix[i] > d[i]) return c.fail("indices {} exceed data {} on axis {}", shape_str(ix), shape_str(d), i);
  }
  OASES_RETURN_IF_ERROR(check_reduction(c));
  c.node().attrs.set_int("axis", axis);
  c.set_output(0, c.dtype(0), d);
  return Status::ok();
}

// Gather from a table sharded along the gathered axis (a vocabulary-parallel embedding): each
// rank gathers the rows it holds and zeros the others, so the output is a partial sum.
Status shard_gather(ShardContext& c) {
  size_t axis = static_cast<size_t>(c.node().attrs.get_int("axis", 0));
  ShardingSpec data = c.in(0), idx = c.in(1).without_partial();
  uint32_t used = 0;
  for (const auto& d : data.dims) {
    if (d.axis >= 0) used |= 1u << d.axis;
  }
  for (auto& d : idx.dims) {
    if (d.axis >= 0 && ((used >> d.axis) & 1u)) d = DimSpec{};
  }
  if (data.dims[axis].segments > 1) data.dims[axis] = DimSpec{};
  c.require(0, data);
  c.require(1, idx);
  ShardingSpec out;
  out.partial = data.partial;
  for (size_t d = 0; d < axis; ++d) out.dims.push_back(data.dims[d]);
  for (const auto& d : idx.dims) out.dims.push_back(d);
  for (size_t d = axis + 1; d < data.dims.size(); ++d) out.dims.push_back(data.dims[d]);
  if (data.dims[axis].axis >= 0) out.partial |= 1u << data.dims[axis].axis;
  c.set_out(0, out);
  return Status::ok();
}

// A Gather from a row-split table masks ids outside its rows.
Status lower_gather(LowerContext& c) {
  Node& n = c.node();
  size_t axis = static_cast<size_t>(n.attrs.get_int("axis", 0));
  int split = c.spec(n.inputs[0]).dims[axis].axis;
  if (split < 0) return Status::ok();
  if (axis != 0) return error("{}: a table split along gathered axis {} is not supported", n.describe(), axis);
  n.op_type = "ShardedGather";
  n.domain = kOasesDomain;
  n.attrs = c.collective_attrs(split);
  return Status::ok();
}

// zeros of v's shape (not v * 0, which is NaN where v is infinite, e.g. a mask table)
ValueId zeros_like(GradContext& c, ValueId v) {
  return c.zeros(c.shape(v), c.dtype(v));
}

// Gradients of the element/ND gathers and scatters: the gather of dy is the scatter's transpose,
// summed where indices repeat (reduction "add"); an assigning scatter blocks dy where it wrote
// (indices unique, as ONNX requires).
Status gather_elements_grad(GradContext& c, bool nd) {
  AttrMap a{{"reduction", Attribute::of_string("add")}};
  if (!nd) a.set_int("axis", c.attrs().get_int("axis", 0));
  if (nd && c.attrs().get_int("batch_dims", 0) != 0) return c.fail("the gradient of GatherND with batch_dims is not supported");
  c.add_grad(0, c.op(nd ? "ScatterND" : "ScatterElements", {zeros_like(c, c.input(0)), c.input(1), c.grad_out(0)}, a));
  return Status::ok();
}

Status scatter_grad(GradContext& c, bool nd) {
  std::string red = c.attrs().get_string("reduction", "none");
  if (red != "none" && red != "add") return c.fail("the gradient of a scatter with reduction '{}' is not supported", red);
  AttrMap axis;
  if (!nd) axis.set_int("axis", c.attrs().get_int("axis", 0));
  if (c.needs(0)) {
    c.add_grad(0, red == "add" ? c.op("Identity", {c.grad_out(0)})
                               : c.op(nd ? "ScatterND" : "ScatterElements", {c.grad_out(0), c.input(1), zeros_like(c, c.input(2))}, axis));
  }
  if (c.needs(2)) c.add_grad(2, c.op(nd ? "GatherND" : "GatherElements", {c.grad_out(0), c.input(1)}, axis));
  return Status::ok();
}

OpCost index_read_cost(const Graph& g, const Node& n) {
  double indices = static_cast<double>(g.value(n.inputs[1]).nbytes());
  return OpCost{0, indices + 2 * static_cast<double>(g.value(n.outputs[0]).nbytes())};
}

OpCost one_pass_cost(const Graph& g, const Node& n) {
  return OpCost{out_numel(g, n), io_bytes(g, n)};
}

}  // namespace

void register_indexing_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.op_type = "Gather";
    s.min_inputs = s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      if (rank < 1) return c.fail("data must have rank >= 1");
      int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), rank);
      if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 0), rank);
      if (c.dtype(1) != DType::kI64 && c.dtype(1) != DType::kI32) {
        return c.fail("indices '{}' must be int32 or int64, got {}", c.input(1).name, dtype_name(c.dtype(1)));
      }
      c.node().attrs.set_int("axis", axis);
      const Shape& d = c.shape(0);
      Shape out(d.begin(), d.begin() + axis);
      for (int64_t x : c.shape(1)) out.push_back(x);
      out.insert(out.end(), d.begin() + axis + 1, d.end());
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) {
      return OpCost{
          0, io_bytes(g, n) - static_cast<double>(g.value(n.inputs[0]).nbytes()) + 2 * static_cast<double>(g.value(n.outputs[0]).nbytes())};
    };
    s.grad = [](GradContext& c) {
      AttrMap a{{"axis", Attribute::of_int(c.attrs().get_int("axis", 0))}, {"data_shape", Attribute::of_ints(c.shape(c.input(0)))}};
      c.add_grad(0, c.op("GatherGrad", {c.grad_out(0), c.input(1), c.input(0)}, a, kOasesDomain));
      return Status::ok();
    };
    s.shard = shard_gather;
    s.lower = lower_gather;
    s.examples = examples_of({example("repeated rows accumulate", {ex_float({6, 4}), ex_ints({4, 0, 4, 2, -1, 1}, {2, 3})}),
                              example("axis 1", {ex_float({2, 5, 4}), ex_ints({3, 1}, {2})}, AttrMap{{"axis", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "GatherElements";
    s.min_inputs = s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), rank);
      if (axis < 0) return c.fail("axis out of range");
      if (c.rank(1) != rank) return c.fail("indices rank {} differs from data rank {}", c.rank(1), rank);
      if (c.dtype(1) != DType::kI64 && c.dtype(1) != DType::kI32) {
        return c.fail("indices '{}' must be int32 or int64, got {}", c.input(1).name, dtype_name(c.dtype(1)));
      }
      // Off the axis, output position i reads data at i: indices may not be larger there.
      const Shape& d = c.shape(0);
      const Shape& ix = c.shape(1);
      for (int64_t i = 0; i < rank; ++i) {
        if (i != axis && ix[i] > d[i]) return c.fail("indices {} exceed data {} on axis {}", shape_str(ix), shape_str(d), i);
      }
      c.node().attrs.set_int("axis", axis);
      c.set_output(0, c.dtype(0), c.shape(1));
      return Status::ok();
    };
    s.cost = index_read_cost;
    s.grad = [](GradContext& c) { return gather_elements_grad(c, false); };
    s.shard = shard_replicated_only;
    s.examples = examples_of(
        {example("along columns, repeats", {ex_float({4, 6}), ex_ints({0, 5, 5, 1, 2, 3, 4, 4, 0, 1, 1, 2}, {4, 3})},
                 AttrMap{{"axis", Attribute::of_int(1)}}),
         example("rotate-half reads, negative indices", {ex_float({3, 4}), ex_ints({1, 1, 0, 3, -1, 2, 2, 0, 0, 3, 1, 1, 2, 2, 0}, {3, 5})},
                 AttrMap{{"axis", Attribute::of_int(1)}}),
         example("axis 0", {ex_float({4, 2}), ex_ints({3, 0, 3, 3, 1, 2}, {3, 2})})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "GatherND";
    s.min_inputs = s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.infer = infer_gather_nd;
    s.cost = index_read_cost;
    s.grad = [](GradContext& c) { return gather_elements_grad(c, true); };
    s.shard = shard_replicated_only;
    s.examples =
        examples_of({example("rows, repeats", {ex_float({4, 6}), ex_ints({3, 0, 3}, {3, 1})}),
                     example("slices of rows, one read twice", {ex_float({3, 4, 2}), ex_ints({0, 1, 2, 3, 0, 1, -1, 0}, {2, 2, 2})})});
    r.add(std::move(s));
  }
  for (const char* op : {"ScatterND", "ScatterElements"}) {
    const bool nd = std::string(op) == "ScatterND";
    OpSchema s;
    s.op_type = op;
    s.min_inputs = s.max_inputs = 3;
    s.non_differentiable_inputs = {1};
    s.infer = nd ? infer_scatter_nd : infer_scatter_elements;
    s.cost = one_pass_cost;
    s.grad = [nd](GradContext& c) { return scatter_grad(c, nd); };
    s.shard = shard_replicated_only;
    s.examples =
        nd ? examples_of({example("rows", {ex_float({4, 6}), ex_ints({3, 0}, {2, 1}), ex_float({2, 6})}),
                          example("add", {ex_float({4, 6}), ex_ints({3, 3}, {2, 1}), ex_float({2, 6})},
                                  AttrMap{{"reduction", Attribute::of_string("add")}})})
           : examples_of({example("rows", {ex_float({4, 6}), ex_ints({0, 1, 2, 3, 0, 1, 3, 2, 1, 0, 2, 3}, {2, 6}), ex_float({2, 6})},
                                  AttrMap{{"axis", Attribute::of_int(0)}}),
                          example("add", {ex_float({4, 6}), ex_ints({0, 0, 2, 3, 0, 1, 0, 2, 1, 0, 2, 3}, {2, 6}), ex_float({2, 6})},
                                  AttrMap{{"axis", Attribute::of_int(0)}, {"reduction", Attribute::of_string("add")}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Trilu";
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      if (c.has_input(1)) {
        const Tensor* t = c.constant(1);
        if (!t) return c.fail("k ('{}') must be constant", c.input(1).name);
        c.node().attrs.set_int("k", static_cast<int64_t>(t->item()));
        c.graph().set_input(c.node().id, 1, kNoId);
      }
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      if (c.rank(0) < 2) return c.fail("input must have rank >= 2, got {}", shape_str(c.shape(0)));
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("Trilu", {c.grad_out(0)}, c.attrs()));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      c.require_replicated_dims(0, static_cast<int64_t>(c.in(0).rank()) - 2, static_cast<int64_t>(c.in(0).rank()));
      c.set_out(0, c.in(0));
      return Status::ok();
    };
    s.cost = one_pass_cost;
    s.examples = examples_of({example("lower", {ex_float({2, 4, 4})}, AttrMap{{"upper", Attribute::of_int(0)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "CumSum";
    s.min_inputs = s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      if (c.has_input(1)) {
        const Tensor* t = c.constant(1);
        if (!t) return c.fail("axis ('{}') must be constant", c.input(1).name);
        c.node().attrs.set_int("axis", static_cast<int64_t>(t->item()));
        c.graph().set_input(c.node().id, 1, kNoId);
      }
      trim_inputs(c);
      return Status::ok();
    };
    s.min_inputs = 1;
    s.infer = [](InferContext& c) {
      int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), c.rank(0));
      if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 0), c.rank(0));
      c.node().attrs.set_int("axis", axis);
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      AttrMap a = c.attrs();
      a.set_int("reverse", a.get_int("reverse", 0) ? 0 : 1);
      c.add_grad(0, c.op("CumSum", {c.grad_out(0)}, a));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      int64_t axis = c.node().attrs.get_int("axis", 0);
      c.require_replicated_dims(0, axis, axis + 1);
      c.set_out(0, c.in(0));
      return Status::ok();
    };
    s.cost = one_pass_cost;
    s.examples = examples_of(
        {example("exclusive", {ex_float({4, 4})}, AttrMap{{"axis", Attribute::of_int(1)}, {"exclusive", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "OneHot";
    s.min_inputs = s.max_inputs = 3;
    s.non_differentiable_inputs = {0, 1, 2};
    s.infer = [](InferContext& c) {
      const Tensor* depth = c.constant(1);
      if (!depth) return c.fail("depth ('{}') must be constant", c.input(1).name);
      int64_t d = static_cast<int64_t>(depth->item());
      if (d <= 0) return c.fail("depth must be positive, got {}", d);
      int64_t out_rank = c.rank(0) + 1;
      int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), out_rank);
      if (axis < 0) return c.fail("axis out of range");
      Shape out = c.shape(0);
      out.insert(out.begin() + axis, d);
      c.node().attrs.set_int("axis", axis);
      c.node().attrs.set_int("depth", d);
      c.set_output(0, c.dtype(2), out);
      return Status::ok();
    };
    s.differentiable = false;  // indices in, constants out
    s.shard = shard_replicated_only;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    r.add(std::move(s));
  }
}

}  // namespace oases
