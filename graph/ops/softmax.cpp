// Softmax and LogSoftmax along one axis (opset 13 semantics: the axis alone, default -1).
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

void register_softmax_ops(OpRegistry& r) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const bool log = std::string(op) == "LogSoftmax";
    OpSchema s;
    s.op_type = op;
    s.min_inputs = s.max_inputs = 1;
    s.infer = [](InferContext& c) {
      int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), c.rank(0));
      if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", -1), c.rank(0));
      if (!is_floating(c.dtype(0))) return c.fail("input must be floating, got {}", dtype_name(c.dtype(0)));
      c.node().attrs.set_int("axis", axis);
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [log](GradContext& c) {
      AttrMap a{{"axis", Attribute::of_int(c.attrs().get_int("axis", -1))}, {"log", Attribute::of_int(log)}};
      c.add_grad(0, c.op("SoftmaxGrad", {c.grad_out(0), c.output(0)}, a, kOasesDomain));
      return Status::ok();
    };
    // the softmax axis whole
    s.shard = [](ShardContext& c) {
      int64_t axis = c.node().attrs.get_int("axis", -1);
      c.require_no_partial();
      c.require_replicated_dims(0, axis, axis + 1);
      c.set_out(0, c.in(0));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 6.0); };
    s.examples = log ? examples_of({example("last axis", {ex_float({4, 6}, -2, 2)})})
                     : examples_of({example("middle axis", {ex_float({2, 4, 6}, -2, 2)}, AttrMap{{"axis", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
}

}  // namespace oases
