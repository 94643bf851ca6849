#include "graph/ops/op_utils.h"

namespace oases::ops {

double io_bytes(const Graph& g, const Node& n) {
  double b = 0;
  for (ValueId v : n.inputs) {
    if (v != kNoId) b += static_cast<double>(g.value(v).nbytes());
  }
  for (ValueId v : n.outputs) {
    if (v != kNoId) b += static_cast<double>(g.value(v).nbytes());
  }
  return b;
}

double out_numel(const Graph& g, const Node& n, int slot) {
  ValueId v = n.output(slot);
  return v == kNoId ? 0.0 : static_cast<double>(g.value(v).numel());
}

OpCost elementwise_cost(const Graph& g, const Node& n, double flops_per_element) {
  return OpCost{flops_per_element * out_numel(g, n), io_bytes(g, n)};
}

OpSchema same_as_input_schema(const std::string& op_type, int min_in, int max_in) {
  OpSchema s;
  s.op_type = op_type;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.infer = [](InferContext& c) {
    c.set_output(0, c.dtype(0), c.shape(0));
    return Status::ok();
  };
  s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 1.0); };
  return s;
}

Status infer_broadcast(InferContext& c, DType out) {
  Shape s;
  bool first = true;
  DType dt = DType::kUndefined;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) continue;
    if (first) {
      s = c.shape(i);
      dt = c.dtype(i);
      first = false;
      continue;
    }
    auto b = broadcast_shapes(s, c.shape(i));
    if (!b) return c.fail("{}", b.status().message());
    s = *b;
  }
  c.set_output(0, out == DType::kUndefined ? dt : out, s);
  return Status::ok();
}

std::function<std::vector<OpExample>()> examples_of(std::vector<OpExample> examples) {
  return [ex = std::move(examples)] { return ex; };
}

OpExample example(std::string name, std::vector<ExampleInput> inputs, AttrMap attrs, int outputs) {
  return OpExample{std::move(name), std::move(inputs), std::move(attrs), outputs};
}

}  // namespace oases::ops
