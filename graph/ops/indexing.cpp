// Indexing: Gather (embeddings), GatherElements, Trilu (causal masks), CumSum (position ids),
// OneHot.
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"

namespace oases {

using namespace ops;

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
    s.cost = [](const Graph& g, const Node& n) { return OpCost{0, io_bytes(g, n) - static_cast<double>(g.value(n.inputs[0]).nbytes()) + 2 * static_cast<double>(g.value(n.outputs[0]).nbytes())}; };
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
      c.node().attrs.set_int("axis", axis);
      c.set_output(0, c.dtype(0), c.shape(1));
      return Status::ok();
    };
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
    r.add(std::move(s));
  }

  // --- gradient rules -------------------------------------------------------------------
  r.find_mutable("", "Gather")->grad = [](GradContext& c) {
    AttrMap a{{"axis", Attribute::of_int(c.attrs().get_int("axis", 0))}, {"data_shape", Attribute::of_ints(c.shape(c.input(0)))}};
    c.add_grad(0, c.op("GatherGrad", {c.grad_out(0), c.input(1)}, a, kOasesDomain));
    return Status::ok();
  };
  r.find_mutable("", "Trilu")->grad = [](GradContext& c) {
    c.add_grad(0, c.op("Trilu", {c.grad_out(0)}, c.attrs()));
    return Status::ok();
  };
  r.find_mutable("", "CumSum")->grad = [](GradContext& c) {
    AttrMap a = c.attrs();
    a.set_int("reverse", a.get_int("reverse", 0) ? 0 : 1);
    c.add_grad(0, c.op("CumSum", {c.grad_out(0)}, a));
    return Status::ok();
  };
}

}  // namespace oases
