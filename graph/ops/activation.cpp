// Activations with parameters, and the fused forms the canonicalising passes produce:
// Gelu (ONNX 20; also the fused Erf and Tanh forms of older exports), oases.Silu (x·σ(x)) and
// oases.SwiGLU (silu(gate) ⊙ up, LLaMA's MLP).
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

void register_activation_ops(OpRegistry& r) {
  for (const char* op : {"LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish", "ThresholdedRelu"}) {
    OpSchema s = same_as_input_schema(op, 1, 1);
    s.infer = [](InferContext& c) {
      if (!is_floating(c.dtype(0))) return c.fail("input must be floating, got {}", dtype_name(c.dtype(0)));
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [op](GradContext& c) {
      AttrMap a = c.attrs();
      a.set_string("op", op);
      c.add_grad(0, c.op("UnaryGrad", {c.grad_out(0), c.input(0), c.output(0)}, a, kOasesDomain));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    // ThresholdedRelu's threshold (default 1) away from the sampled points: the derivative jumps there
    s.examples = std::string(op) == "ThresholdedRelu"
                     ? examples_of({example("matrix", {ex_float({4, 6}, -2.0, 2.0)}, AttrMap{{"alpha", Attribute::of_float(0.05f)}})})
                     : examples_of({example("matrix", {ex_float({4, 6}, -2.0, 2.0)})});
    r.add(std::move(s));
  }
  {
    OpSchema s = same_as_input_schema("Gelu", 1, 1);
    s.traits = kTraitActivation;
    s.infer = [](InferContext& c) {
      std::string approx = c.attrs().get_string("approximate", "none");
      if (approx != "none" && approx != "tanh") return c.fail("approximate must be 'none' or 'tanh', got '{}'", approx);
      if (!is_floating(c.dtype(0))) return c.fail("input must be floating, got {}", dtype_name(c.dtype(0)));
      c.node().attrs.set_string("approximate", approx);  // canonical: explicit, as the fusion writes it
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("GeluGrad", {c.grad_out(0), c.input(0)},
                         AttrMap{{"approximate", Attribute::of_string(c.attrs().get_string("approximate", "none"))}}, kOasesDomain));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 8.0); };
    s.examples = examples_of({example("erf", {ex_float({4, 6}, -3, 3)}),
                              example("tanh", {ex_float({4, 6}, -3, 3)}, AttrMap{{"approximate", Attribute::of_string("tanh")}})});
    r.add(std::move(s));
  }
  {
    OpSchema s = same_as_input_schema("PRelu", 2, 2);
    s.infer = [](InferContext& c) { return infer_broadcast(c); };
    s.grad = [](GradContext& c) {
      // y = x if x >= 0 else s·x
      ValueId x = c.input(0), s = c.input(1), dy = c.grad_out(0);
      ValueId pos = c.op("GreaterOrEqual", {x, c.scalar(0.0, c.dtype(x))});
      if (c.needs(0)) c.add_grad(0, c.op("Where", {pos, dy, c.op("Mul", {dy, s})}));
      if (c.needs(1)) c.add_grad(1, c.unbroadcast(c.op("Where", {pos, c.scalar(0.0, c.dtype(x)), c.op("Mul", {dy, x})}), c.shape(s)));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.examples = examples_of({example("slope per column", {ex_float({4, 6}, -2, 2), ex_float({6})})});
    r.add(std::move(s));
  }
  {
    OpSchema s = same_as_input_schema("Silu", 1, 1);
    s.domain = kOasesDomain;
    s.doc = "x * sigmoid(x)";
    s.traits = kTraitActivation;
    s.grad = [](GradContext& c) {
      c.add_grad(0,
                 c.op("UnaryGrad", {c.grad_out(0), c.input(0), c.output(0)}, AttrMap{{"op", Attribute::of_string("Silu")}}, kOasesDomain));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 5.0); };
    s.examples = examples_of({example("matrix", {ex_float({4, 6}, -3, 3)})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.domain = kOasesDomain;
    s.op_type = "SwiGLU";
    s.doc = "silu(gate) * up";
    s.min_inputs = s.max_inputs = 2;
    s.traits = kTraitActivation;
    s.infer = [](InferContext& c) {
      if (c.shape(0) != c.shape(1) || c.dtype(0) != c.dtype(1)) {
        return c.fail("gate {} and up {} must have equal shapes and types", describe_value(c.graph(), c.node().inputs[0]),
                      describe_value(c.graph(), c.node().inputs[1]));
      }
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      auto d = c.op_n("SwiGLUGrad", {c.grad_out(0), c.input(0), c.input(1)}, 2, {}, kOasesDomain);
      c.add_grad(0, d[0]);
      c.add_grad(1, d[1]);
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 6.0); };
    s.examples = examples_of({example("matrix", {ex_float({4, 6}, -3, 3), ex_float({4, 6})})});
    r.add(std::move(s));
  }
}

}  // namespace oases
