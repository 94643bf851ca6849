// Ops that move or re-view data without arithmetic: Reshape, Flatten, Transpose, Squeeze,
// Unsqueeze, Expand, Concat, Split, Slice, Tile, Pad, and the shape queries Shape and Size.
// Canonical form keeps resolved operands as attributes: Reshape "shape" holds the final dims
// (no -1; a 0 left there is an empty dim, marked allowzero), Slice holds per-axis effective
// start/step and output length.
#include "graph/autodiff.h"
#include "graph/lowering.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

#include <cmath>

namespace oases {

using namespace ops;

namespace {

Status move_ints(InferContext& c, int slot, const char* attr) {
  auto moved = operand_to_ints_attr(c, slot, attr);
  if (!moved) return moved.status();
  return Status::ok();
}

Status infer_reshape(InferContext& c) {
  if (!c.attrs().has("shape")) return c.fail("target shape is missing");
  std::vector<int64_t> spec = c.attrs().get_ints("shape");
  bool allowzero = c.attrs().get_int("allowzero", 0) != 0;
  const Shape& in = c.shape(0);
  Shape out(spec.size());
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t d = spec[i];
    if (d == 0 && !allowzero) {
      if (i >= in.size()) return c.fail("shape {} copies dim {} of a rank-{} input", fmt::join(spec, ","), i, in.size());
      d = in[i];
    }
    if (d == -1) {
      if (infer_at >= 0) return c.fail("shape [{}] has more than one -1", fmt::join(spec, ","));
      infer_at = static_cast<int>(i);
      continue;
    }
    if (d < 0) return c.fail("shape [{}] has a negative dim", fmt::join(spec, ","));
    out[i] = d;
    if (__builtin_mul_overflow(known, d, &known)) {
      return c.fail("cannot reshape {} to [{}]: the target overflows", shape_str(in), fmt::join(spec, ","));
    }
  }
  int64_t total = shape_numel(in);
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) {
      return c.fail("cannot reshape {} ({} elements) to [{}]", shape_str(in), total, fmt::join(spec, ","));
    }
    out[infer_at] = total / known;
  } else if (known != total) {
    return c.fail("cannot reshape {} ({} elements) to [{}] ({} elements)", shape_str(in), total, fmt::join(spec, ","), known);
  }
  c.node().attrs.set_ints("shape", out);
  // the resolved dims are literal: a 0 left in them is an empty dim, not "copy the input's"
  if (std::find(out.begin(), out.end(), 0) != out.end()) {
    c.node().attrs.set_int("allowzero", 1);
  } else {
    c.node().attrs.erase("allowzero");
  }
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

Status infer_slice(InferContext& c) {
  const Shape& in = c.shape(0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> starts = c.attrs().get_ints("starts"), ends = c.attrs().get_ints("ends");
  std::vector<int64_t> axes = c.attrs().get_ints("axes"), steps = c.attrs().get_ints("steps");
  if (c.attrs().get_int("resolved", 0)) {
    Shape out = in;
    std::vector<int64_t> lens = c.attrs().get_ints("lengths");
    for (size_t i = 0; i < axes.size(); ++i) out[axes[i]] = lens[i];
    c.set_output(0, c.dtype(0), out);
    return Status::ok();
  }
  if (starts.size() != ends.size()) return c.fail("starts has {} entries, ends {}", starts.size(), ends.size());
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) return c.fail("starts, ends, axes and steps differ in length");
  Shape out = in;
  std::vector<int64_t> r_axes, r_starts, r_steps, r_lens;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t ax = normalize_axis(axes[i], rank);
    if (ax < 0) return c.fail("axis {} out of range for rank {}", axes[i], rank);
    int64_t dim = in[ax], step = steps[i];
    if (step == 0) return c.fail("step is 0 on axis {}", ax);
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0 && e > std::numeric_limits<int64_t>::min() / 2) e += dim;
    int64_t len;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      len = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      len = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    out[ax] = len;
    r_axes.push_back(ax);
    r_starts.push_back(s);
    r_steps.push_back(step);
    r_lens.push_back(len);
  }
  AttrMap& a = c.node().attrs;
  a.set_ints("axes", r_axes);
  a.set_ints("starts", r_starts);
  a.set_ints("steps", r_steps);
  a.set_ints("lengths", r_lens);
  a.erase("ends");
  a.set_int("resolved", 1);
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

Status infer_split(InferContext& c) {
  int64_t rank = c.rank(0);
  int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), rank);
  if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 0), rank);
  int64_t dim = c.shape(0)[axis];
  std::vector<int64_t> split = c.attrs().get_ints("split");
  int n = c.num_outputs();
  if (split.empty()) {
    int64_t parts = c.attrs().get_int("num_outputs", n);
    if (parts != n) return c.fail("num_outputs is {} but the node has {} outputs", parts, n);
    if (parts < 1) return c.fail("no outputs to split into");
    // Opset 18 lets the last part be smaller; before, equal parts must divide the dim.
    if (c.opset() > 0 && c.opset() < 18 && dim % parts != 0) {
      return c.fail("dim {} of {} does not split into {} equal parts (opset {}; give the sizes as the split input)", dim,
                    shape_str(c.shape(0)), parts, c.opset());
    }
    int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i) split.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  if (static_cast<int>(split.size()) != n) return c.fail("split has {} sizes for {} outputs", split.size(), n);
  // Checked one by one so a negative size is named as such and the sum cannot overflow.
  int64_t sum = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    if (split[i] < 0) return c.fail("split size {} (output {}) is negative", split[i], i);
    if (split[i] > dim - sum) {
      return c.fail("split sizes [{}] add up to more than dim {} of {}", fmt::join(split, ","), dim, shape_str(c.shape(0)));
    }
    sum += split[i];
  }
  if (sum != dim) return c.fail("split sizes [{}] do not add up to dim {} of {}", fmt::join(split, ","), dim, shape_str(c.shape(0)));
  c.node().attrs.set_ints("split", split);
  c.node().attrs.set_int("axis", axis);
  c.node().attrs.erase("num_outputs");
  for (int i = 0; i < n; ++i) {
    Shape s = c.shape(0);
    s[axis] = split[i];
    c.set_output(i, c.dtype(0), s);
  }
  return Status::ok();
}

// The gradient of an op that only re-views its input's elements (Reshape, Flatten, Squeeze,
// Unsqueeze): dy reshaped back to the input's shape.
Status reshape_back_grad(GradContext& c) {
  c.add_grad(0, c.op("Reshape", {c.grad_out(0)}, AttrMap{{"shape", Attribute::of_ints(c.shape(c.input(0)))}}));
  return Status::ok();
}

// Partition lowering of Reshape and Expand: the "shape" attribute takes the local shape.
Status lower_shape_to_local(LowerContext& c) {
  c.node().attrs.set_ints("shape", c.local_shape(c.node().outputs[0]));
  return Status::ok();
}

Attribute ints(std::vector<int64_t> v) {
  return Attribute::of_ints(std::move(v));
}

}  // namespace

namespace ops {

// A slice that keeps a whole dimension split over ranks keeps each rank's whole part: the
// lengths that were the global extent become the local one (SliceGrad: the same of its output,
// which is the sliced input's gradient).
Status lower_slice_lengths(LowerContext& c, bool grad) {
  Node& n = c.node();
  std::vector<int64_t> axes = n.attrs.get_ints("axes"), lens = n.attrs.get_ints("lengths");
  ValueId whole = grad ? n.outputs[0] : n.inputs[0];
  Shape in_local = c.local_shape(whole);
  Shape in_global = c.global_shape(whole);
  for (size_t i = 0; i < axes.size(); ++i) {
    size_t a = static_cast<size_t>(axes[i]);
    if (in_local[a] != in_global[a] && lens[i] == in_global[a]) lens[i] = in_local[a];
  }
  n.attrs.set_ints("lengths", lens);
  if (grad) n.attrs.set_ints("input_shape", in_local);
  return Status::ok();
}

}  // namespace ops

void register_shape_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.op_type = "Reshape";
    s.traits = kTraitRelayout;
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.view_of_input = 0;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "shape"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = infer_reshape;
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.grad = reshape_back_grad;
    s.shard = shard_reshape;
    s.lower = lower_shape_to_local;
    s.examples = examples_of({example("merge and split", {ex_float({2, 6})}, AttrMap{{"shape", ints({4, 3})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Flatten";
    s.traits = kTraitRelayout;
    s.min_inputs = s.max_inputs = 1;
    s.view_of_input = 0;
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      int64_t axis = c.attrs().get_int("axis", 1);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis > rank) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 1), rank);
      int64_t a = 1, b = 1;
      for (int64_t i = 0; i < rank; ++i) (i < axis ? a : b) *= c.shape(0)[i];
      c.set_output(0, c.dtype(0), {a, b});
      return Status::ok();
    };
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.grad = reshape_back_grad;
    s.shard = shard_reshape;
    s.examples = examples_of({example("axis 2", {ex_float({2, 4, 2})}, AttrMap{{"axis", Attribute::of_int(2)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Transpose";
    s.traits = kTraitRelayout;
    s.min_inputs = s.max_inputs = 1;
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      std::vector<int64_t> perm = c.attrs().get_ints("perm");
      if (perm.empty()) {
        for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
      }
      if (static_cast<int64_t>(perm.size()) != rank) return c.fail("perm has {} entries for rank {}", perm.size(), rank);
      std::vector<bool> seen(static_cast<size_t>(rank), false);
      Shape out;
      for (int64_t& p : perm) {
        int64_t q = normalize_axis(p, rank);
        if (q < 0 || seen[q]) return c.fail("perm [{}] is not a permutation", fmt::join(perm, ","));
        seen[q] = true;
        p = q;
        out.push_back(c.shape(0)[q]);
      }
      c.node().attrs.set_ints("perm", perm);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.grad = [](GradContext& c) {
      std::vector<int64_t> perm = c.attrs().get_ints("perm"), inv(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
      c.add_grad(0, c.op("Transpose", {c.grad_out(0)}, AttrMap{{"perm", Attribute::of_ints(inv)}}));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      std::vector<int64_t> perm = c.node().attrs.get_ints("perm");
      ShardingSpec out = ShardingSpec::replicated(perm.size());
      out.partial = c.in(0).partial;
      for (size_t i = 0; i < perm.size(); ++i) out.dims[i] = c.in(0).dims[static_cast<size_t>(perm[i])];
      c.set_out(0, out);
      return Status::ok();
    };
    s.examples = examples_of({example("rotate", {ex_float({2, 4, 6})}, AttrMap{{"perm", ints({2, 0, 1})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Squeeze";
    s.traits = kTraitRelayout;
    s.oldest_version = 1;  // before opset 13 the axes are an attribute, the canonical form
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.view_of_input = 0;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "axes"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      const Shape& in = c.shape(0);
      std::vector<int64_t> axes = c.attrs().get_ints("axes");
      if (axes.empty()) {
        for (size_t i = 0; i < in.size(); ++i) {
          if (in[i] == 1) axes.push_back(static_cast<int64_t>(i));
        }
      }
      OASES_ASSIGN_OR_RETURN(auto norm, normalize_axes(c, axes, c.rank(0)));
      Shape out;
      for (size_t i = 0; i < in.size(); ++i) {
        bool sq = std::find(norm.begin(), norm.end(), static_cast<int64_t>(i)) != norm.end();
        if (sq && in[i] != 1) return c.fail("cannot squeeze axis {} of {}: it is not 1", i, shape_str(in));
        if (!sq) out.push_back(in[i]);
      }
      c.node().attrs.set_ints("axes", norm);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.grad = reshape_back_grad;
    s.shard = shard_reshape;
    s.examples = examples_of({example("middle", {ex_float({2, 1, 4})}, AttrMap{{"axes", ints({1})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Unsqueeze";
    s.traits = kTraitRelayout;
    s.oldest_version = 1;  // before opset 13 the axes are an attribute, the canonical form
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.view_of_input = 0;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "axes"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      const Shape& in = c.shape(0);
      std::vector<int64_t> axes = c.attrs().get_ints("axes");
      int64_t out_rank = static_cast<int64_t>(in.size() + axes.size());
      OASES_ASSIGN_OR_RETURN(auto norm, normalize_axes(c, axes, out_rank));
      Shape out;
      size_t j = 0;
      for (int64_t i = 0; i < out_rank; ++i) {
        if (std::find(norm.begin(), norm.end(), i) != norm.end()) {
          out.push_back(1);
        } else {
          out.push_back(in[j++]);
        }
      }
      c.node().attrs.set_ints("axes", norm);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.grad = reshape_back_grad;
    s.shard = shard_reshape;
    s.examples = examples_of({example("two", {ex_float({2, 4})}, AttrMap{{"axes", ints({0, 2})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Expand";
    s.traits = kTraitRelayout;
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "shape"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      auto out = broadcast_shapes(c.shape(0), c.attrs().get_ints("shape"));
      if (!out) return c.fail("{}", out.status().message());
      c.node().attrs.set_ints("shape", *out);
      c.set_output(0, c.dtype(0), *out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.unbroadcast(c.grad_out(0), c.shape(c.input(0))));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kAdditive); };
    s.lower = lower_shape_to_local;
    s.examples = examples_of({example("broadcast", {ex_float({4, 1})}, AttrMap{{"shape", ints({2, 4, 6})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Concat";
    s.min_inputs = 1;
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      int64_t axis = normalize_axis(c.attrs().get_int("axis", 0), rank);
      if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", 0), rank);
      Shape out = c.shape(0);
      out[axis] = 0;
      for (int i = 0; i < c.num_inputs(); ++i) {
        const Shape& si = c.shape(i);
        if (static_cast<int64_t>(si.size()) != rank || c.dtype(i) != c.dtype(0)) {
          return c.fail("input {} {} does not match input 0 {}", i, describe_value(c.graph(), c.node().inputs[i]),
                        describe_value(c.graph(), c.node().inputs[0]));
        }
        for (int64_t d = 0; d < rank; ++d) {
          if (d != axis && si[d] != c.shape(0)[d]) {
            return c.fail("input {} has shape {}, input 0 {}: they differ outside axis {}", i, shape_str(si), shape_str(c.shape(0)), axis);
          }
        }
        out[axis] += si[axis];
      }
      c.node().attrs.set_int("axis", axis);
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.grad = [](GradContext& c) {
      int64_t axis = c.attrs().get_int("axis", 0);
      int n = c.node().num_inputs();
      std::vector<int64_t> sizes;
      for (int i = 0; i < n; ++i) sizes.push_back(c.shape(c.input(i))[axis]);
      auto parts = c.op_n("Split", {c.grad_out(0)}, n, AttrMap{{"axis", Attribute::of_int(axis)}, {"split", Attribute::of_ints(sizes)}});
      for (int i = 0; i < n; ++i) c.add_grad(i, parts[i]);
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      int64_t axis = c.node().attrs.get_int("axis", 0);
      size_t ax = static_cast<size_t>(axis);
      // equal parts each split alike along the axis make one segmented split (the inverse of Split's
      // rule: the gradient of a fused QKV's q, k and v)
      const DimSpec& d0 = c.in(0).dims[ax];
      bool segmented = d0.axis >= 0 && d0.segments == 1 && c.num_inputs() > 1;
      for (int i = 0; i < c.num_inputs() && segmented; ++i) {
        segmented = c.in(i) == c.in(0) && c.in_shape(i)[ax] == c.in_shape(0)[ax];
      }
      if (segmented) {
        c.set_out(0, c.in(0).with_dim(ax, d0.axis, c.num_inputs()));
        return Status::ok();
      }
      ShardingSpec ref = c.in(0).with_dim(static_cast<size_t>(axis), -1);
      uint32_t all_partial = ~0u;
      for (int i = 0; i < c.num_inputs(); ++i) all_partial &= c.in(i).partial;
      ref.partial = all_partial;
      for (int i = 0; i < c.num_inputs(); ++i) c.require(i, ref);
      c.set_out(0, ref);
      return Status::ok();
    };
    s.examples = examples_of({example("columns", {ex_float({2, 4}), ex_float({2, 2})}, AttrMap{{"axis", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Split";
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.max_outputs = INT_MAX;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "split"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = infer_split;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.grad = [](GradContext& c) {
      int64_t axis = c.attrs().get_int("axis", 0);
      std::vector<ValueId> parts;
      for (size_t i = 0; i < c.node().outputs.size(); ++i) {
        ValueId g = c.grad_out(static_cast<int>(i));
        ValueId o = c.output(static_cast<int>(i));
        parts.push_back(g != kNoId ? g : c.zeros(c.shape(o), c.dtype(o)));
      }
      c.add_grad(0, c.op("Concat", parts, AttrMap{{"axis", Attribute::of_int(axis)}}));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      size_t axis = static_cast<size_t>(c.node().attrs.get_int("axis", 0));
      std::vector<int64_t> split = c.node().attrs.get_ints("split");
      const DimSpec& d = c.in(0).dims[axis];
      bool equal = std::all_of(split.begin(), split.end(), [&](int64_t s) { return s == split[0]; });
      ShardingSpec out = c.in(0);
      if (d.axis >= 0) {
        if (d.segments == static_cast<int>(split.size()) && equal) {
          out.dims[axis] = DimSpec{d.axis, 1};  // each segment is one output, split over the axis
        } else {
          c.require(0, c.in(0).with_dim(axis, -1));
          out.dims[axis] = DimSpec{};
        }
      }
      for (int k = 0; k < c.num_outputs(); ++k) {
        if (c.has_output(k)) c.set_out(k, out);
      }
      return Status::ok();
    };
    s.lower = [](LowerContext& c) {
      Node& n = c.node();
      size_t axis = static_cast<size_t>(n.attrs.get_int("axis", 0));
      std::vector<int64_t> sizes;
      for (ValueId o : n.outputs) sizes.push_back(c.local_shape(o)[axis]);
      n.attrs.set_ints("split", sizes);
      return Status::ok();
    };
    s.examples =
        examples_of({example("three parts", {ex_float({2, 7})}, AttrMap{{"axis", Attribute::of_int(1)}, {"split", ints({2, 4, 1})}}, 3),
                     example("even parts", {ex_float({4, 6})}, AttrMap{{"axis", Attribute::of_int(0)}, {"split", ints({2, 2})}}, 2)});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Slice";
    s.min_inputs = 1;
    s.max_inputs = 5;
    s.non_differentiable_inputs = {1, 2, 3, 4};
    s.normalize = [](InferContext& c) -> Status {
      if (c.attrs().get_int("resolved", 0)) return Status::ok();
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "starts"));
      OASES_RETURN_IF_ERROR(move_ints(c, 2, "ends"));
      OASES_RETURN_IF_ERROR(move_ints(c, 3, "axes"));
      OASES_RETURN_IF_ERROR(move_ints(c, 4, "steps"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = infer_slice;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.grad = [](GradContext& c) {
      AttrMap a;
      for (const char* k : {"axes", "starts", "steps", "lengths"}) a.set_ints(k, c.attrs().get_ints(k));
      a.set_ints("input_shape", c.shape(c.input(0)));
      c.add_grad(0, c.op("SliceGrad", {c.grad_out(0)}, a, kOasesDomain));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      std::vector<int64_t> axes = c.node().attrs.get_ints("axes"), starts = c.node().attrs.get_ints("starts");
      std::vector<int64_t> steps = c.node().attrs.get_ints("steps"), lens = c.node().attrs.get_ints("lengths");
      Shape in = c.in_shape(0);
      ShardingSpec want = c.in(0);
      for (size_t i = 0; i < axes.size(); ++i) {
        size_t a = static_cast<size_t>(axes[i]);
        bool full = starts[i] == 0 && steps[i] == 1 && lens[i] == in[a];
        if (!full) want.dims[a] = DimSpec{};
      }
      c.require(0, want);
      c.set_out(0, want);
      return Status::ok();
    };
    s.lower = [](LowerContext& c) { return lower_slice_lengths(c, false); };
    s.examples =
        examples_of({example("steps", {ex_float({4, 7})},
                             AttrMap{{"starts", ints({1, 6})}, {"ends", ints({4, 0})}, {"axes", ints({0, 1})}, {"steps", ints({2, -2})}}),
                     example("columns", {ex_float({4, 6})}, AttrMap{{"starts", ints({1})}, {"ends", ints({5})}, {"axes", ints({1})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Tile";
    s.min_inputs = 1;
    s.max_inputs = 2;
    s.non_differentiable_inputs = {1};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "repeats"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      std::vector<int64_t> rep = c.attrs().get_ints("repeats");
      if (static_cast<int64_t>(rep.size()) != c.rank(0)) return c.fail("repeats has {} entries for rank {}", rep.size(), c.rank(0));
      Shape out = c.shape(0);
      for (size_t i = 0; i < out.size(); ++i) {
        if (rep[i] < 0) return c.fail("negative repeat {}", rep[i]);
        if (rep[i] > 0 && out[i] > std::numeric_limits<int64_t>::max() / rep[i]) {
          return c.fail("repeats [{}] of {} overflow", fmt::join(rep, ","), shape_str(c.shape(0)));
        }
        out[i] *= rep[i];
      }
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    // dy [r0·s0, r1·s1, ...] viewed as [r0, s0, r1, s1, ...], summed over the repeats
    s.grad = [](GradContext& c) {
      std::vector<int64_t> rep = c.attrs().get_ints("repeats");
      const Shape& xs = c.shape(c.input(0));
      Shape split;
      std::vector<int64_t> axes;
      for (size_t i = 0; i < xs.size(); ++i) {
        axes.push_back(static_cast<int64_t>(split.size()));
        split.push_back(rep[i]);
        split.push_back(xs[i]);
      }
      ValueId v = c.op("Reshape", {c.grad_out(0)}, AttrMap{{"shape", Attribute::of_ints(split)}});
      c.add_grad(0, c.op("ReduceSum", {v}, AttrMap{{"axes", Attribute::of_ints(axes)}, {"keepdims", Attribute::of_int(0)}}));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      std::vector<int64_t> rep = c.node().attrs.get_ints("repeats");
      ShardingSpec want = c.in(0).without_partial();
      for (size_t i = 0; i < rep.size(); ++i) {
        if (rep[i] != 1) want.dims[i] = DimSpec{};
      }
      c.require(0, want);
      c.set_out(0, want);
      return Status::ok();
    };
    s.examples = examples_of({example("rows and columns", {ex_float({2, 3})}, AttrMap{{"repeats", ints({2, 2})}})});
    r.add(std::move(s));
  }
  {
    // Pad: canonical attrs "pads" (2·rank, begins then ends, over all axes), "value", "mode"; a
    // constant_value known only at run time stays input 2.
    OpSchema s;
    s.op_type = "Pad";
    s.min_inputs = 1;
    s.max_inputs = 4;
    s.non_differentiable_inputs = {1, 2, 3};
    s.normalize = [](InferContext& c) -> Status {
      OASES_RETURN_IF_ERROR(move_ints(c, 1, "pads"));
      auto moved = operand_to_float_attr(c, 2, "value", /*required_constant=*/false);
      if (!moved) return moved.status();
      OASES_RETURN_IF_ERROR(move_ints(c, 3, "pad_axes"));
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      std::vector<int64_t> pads = c.attrs().get_ints("pads");
      std::vector<int64_t> axes = c.attrs().get_ints("pad_axes");
      if (!axes.empty()) {
        if (pads.size() != 2 * axes.size()) return c.fail("pads has {} entries for {} axes", pads.size(), axes.size());
        std::vector<int64_t> full(2 * rank, 0);
        for (size_t i = 0; i < axes.size(); ++i) {
          int64_t ax = normalize_axis(axes[i], rank);
          if (ax < 0) return c.fail("axis {} out of range", axes[i]);
          full[ax] = pads[i];
          full[ax + rank] = pads[i + axes.size()];
        }
        pads = full;
        c.node().attrs.erase("pad_axes");
        c.node().attrs.set_ints("pads", pads);
      }
      if (static_cast<int64_t>(pads.size()) != 2 * rank) return c.fail("pads has {} entries for rank {}", pads.size(), rank);
      std::string mode = c.attrs().get_string("mode", "constant");
      if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap") return c.fail("unknown mode '{}'", mode);
      Shape out = c.shape(0);
      for (int64_t i = 0; i < rank; ++i) {
        out[i] += pads[i] + pads[i + rank];
        if (out[i] < 0) return c.fail("pads [{}] make axis {} negative", fmt::join(pads, ","), i);
      }
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n)}; };
    s.grad = [](GradContext& c) {
      if (c.attrs().get_string("mode", "constant") != "constant") return c.fail("only constant padding is differentiable here");
      std::vector<int64_t> pads = c.attrs().get_ints("pads");
      const Shape& in = c.shape(c.input(0));
      int64_t rank = static_cast<int64_t>(in.size());
      std::vector<int64_t> axes, starts, steps, lens;
      for (int64_t d = 0; d < rank; ++d) {
        if (pads[d] < 0 || pads[d + rank] < 0) return c.fail("negative pads are not differentiable here");
        axes.push_back(d);
        starts.push_back(pads[d]);
        steps.push_back(1);
        lens.push_back(in[d]);
      }
      AttrMap a{{"axes", Attribute::of_ints(axes)},
                {"starts", Attribute::of_ints(starts)},
                {"steps", Attribute::of_ints(steps)},
                {"lengths", Attribute::of_ints(lens)},
                {"resolved", Attribute::of_int(1)}};
      c.add_grad(0, c.op("Slice", {c.grad_out(0)}, a));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      std::vector<int64_t> pads = c.node().attrs.get_ints("pads");
      size_t rank = c.in(0).rank();
      bool zero = c.node().attrs.get_float("value", 0.f) == 0.f && c.node().attrs.get_string("mode", "constant") == "constant" &&
                  c.node().num_inputs() < 3;
      ShardingSpec want = zero ? c.in(0) : c.in(0).without_partial();
      for (size_t i = 0; i < rank; ++i) {
        if (pads[i] != 0 || pads[i + rank] != 0) want.dims[i] = DimSpec{};
      }
      c.require(0, want);
      c.set_out(0, want);
      return Status::ok();
    };
    s.examples = examples_of({example("constant", {ex_float({2, 4})}, AttrMap{{"pads", ints({1, 0, 0, 2})}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Shape";
    s.traits = kTraitShapeOnly;
    s.min_inputs = s.max_inputs = 1;
    s.infer = [](InferContext& c) {
      int64_t rank = c.rank(0);
      int64_t start = c.attrs().get_int("start", 0), end = c.attrs().get_int("end", rank);
      if (start < 0) start += rank;
      if (end < 0) end += rank;
      start = std::clamp<int64_t>(start, 0, rank);
      end = std::clamp<int64_t>(end, 0, rank);
      c.node().attrs.set_int("start", start);
      c.node().attrs.set_int("end", end);
      c.set_output(0, DType::kI64, {std::max<int64_t>(0, end - start)});
      return Status::ok();
    };
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.differentiable = false;
    s.shard = shard_replicated_only;  // reads the whole (global) shape: folded into a constant before anything runs
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Size";
    s.traits = kTraitShapeOnly;
    s.min_inputs = s.max_inputs = 1;
    s.infer = [](InferContext& c) {
      c.set_output(0, DType::kI64, {});
      return Status::ok();
    };
    s.cost = [](const Graph&, const Node&) { return OpCost{}; };
    s.differentiable = false;
    s.shard = shard_replicated_only;  // reads the whole (global) shape: folded into a constant before anything runs
    r.add(std::move(s));
  }
}

}  // namespace oases
