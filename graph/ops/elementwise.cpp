// Elementwise ops with numpy broadcasting: unary math, binary arithmetic, comparisons, logic,
// Where, Clip, Cast, Identity.
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

namespace {

Status check_same_dtype(InferContext& c, int first, int last) {
  DType dt = DType::kUndefined;
  for (int i = first; i <= last && i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) continue;
    if (dt == DType::kUndefined) {
      dt = c.dtype(i);
    } else if (c.dtype(i) != dt) {
      return c.fail("inputs have different types ({} and {})", dtype_name(dt), dtype_name(c.dtype(i)));
    }
  }
  return Status::ok();
}

// Output of input 0's shape and dtype; `float_only`: input 0 must be floating.
OpSchema unary_schema(const std::string& op, double flops, bool float_only = false) {
  OpSchema s = same_as_input_schema(op, 1, 1);
  s.infer = [float_only](InferContext& c) {
    if (float_only && !is_floating(c.dtype(0))) {
      return c.fail("input '{}' has type {}, a floating type is required", c.input(0).name, dtype_name(c.dtype(0)));
    }
    c.set_output(0, c.dtype(0), c.shape(0));
    return Status::ok();
  };
  s.cost = [flops](const Graph& g, const Node& n) { return elementwise_cost(g, n, flops); };
  return s;
}

// Broadcasting output; `same_type`: the inputs share one dtype; `out`: the output dtype (kUndefined:
// the inputs').
OpSchema binary_schema(const std::string& op, int min_in, int max_in, bool same_type = true, DType out = DType::kUndefined) {
  OpSchema s;
  s.op_type = op;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.infer = [same_type, out](InferContext& c) {
    if (same_type) OASES_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs() - 1));
    return infer_broadcast(c, out);
  };
  s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 1.0); };
  return s;
}

// Sharding: linear ops pass partial sums through; nonlinear ones need them reduced first.
Status shard_additive(ShardContext& c) {
  return shard_elementwise(c, PartialPolicy::kAdditive);
}

// A unary op's gradient from a fused kernel that reads x and/or y.
Status unary_grad(GradContext& c, const char* op) {
  c.add_grad(0, c.op("UnaryGrad", {c.grad_out(0), c.input(0), c.output(0)}, AttrMap{{"op", Attribute::of_string(op)}}, kOasesDomain));
  return Status::ok();
}

ValueId one(GradContext& c, ValueId like) {
  return c.scalar(1.0, c.dtype(like));
}
ValueId sq(GradContext& c, ValueId v) {
  return c.op("Mul", {v, v});
}

// Trigonometric and hyperbolic ops, from their derivatives in terms of x (or y for Tan):
//   tan' = 1 + y², asin' = 1/√(1-x²), acos' = -1/√(1-x²), atan' = 1/(1+x²), sinh' = cosh,
//   cosh' = sinh, asinh' = 1/√(x²+1), acosh' = 1/√(x²-1), atanh' = 1/(1-x²)
struct TrigOp {
  const char* op;
  ValueId (*derivative)(GradContext& c, ValueId x, ValueId y);
  OpExample example;  // inside the op's domain, away from its poles
};
std::vector<TrigOp> trig_ops() {
  auto matrix = example("matrix", {ex_float({4, 6}, -1.2, 1.2)});
  auto inside = example("inside (-1, 1)", {ex_float({4, 6}, -0.8, 0.8)});
  return {
      {"Tan",
       [](GradContext& c, ValueId, ValueId y) {
         return c.op("Add", {one(c, y), sq(c, y)});
       },
       matrix},
      {"Asin",
       [](GradContext& c, ValueId x, ValueId) {
         return c.op("Reciprocal", {c.op("Sqrt", {c.op("Sub", {one(c, x), sq(c, x)})})});
       },
       inside},
      {"Acos",
       [](GradContext& c, ValueId x, ValueId) {
         return c.op("Neg", {c.op("Reciprocal", {c.op("Sqrt", {c.op("Sub", {one(c, x), sq(c, x)})})})});
       },
       inside},
      {"Atan",
       [](GradContext& c, ValueId x, ValueId) {
         return c.op("Reciprocal", {c.op("Add", {one(c, x), sq(c, x)})});
       },
       matrix},
      {"Sinh", [](GradContext& c, ValueId x, ValueId) { return c.op("Cosh", {x}); }, matrix},
      {"Cosh", [](GradContext& c, ValueId x, ValueId) { return c.op("Sinh", {x}); }, matrix},
      {"Asinh",
       [](GradContext& c, ValueId x, ValueId) {
         return c.op("Reciprocal", {c.op("Sqrt", {c.op("Add", {sq(c, x), one(c, x)})})});
       },
       matrix},
      {"Acosh",
       [](GradContext& c, ValueId x, ValueId) {
         return c.op("Reciprocal", {c.op("Sqrt", {c.op("Sub", {sq(c, x), one(c, x)})})});
       },
       example("above 1", {ex_float({4, 6}, 1.2, 3.0)})},
      {"Atanh",
       [](GradContext& c, ValueId x, ValueId) {
         return c.op("Reciprocal", {c.op("Sub", {one(c, x), sq(c, x)})});
       },
       inside},
  };
}

// Add, Sub, Mul, Div: y = a op b with broadcasting.
Status arithmetic_grad(GradContext& c, const std::string& op) {
  if (op == "Add") {
    for (int i = 0; i < 2; ++i) {
      if (c.needs(i)) c.add_grad(i, c.unbroadcast(c.grad_out(0), c.shape(c.input(i))));
    }
  } else if (op == "Sub") {
    if (c.needs(0)) c.add_grad(0, c.unbroadcast(c.grad_out(0), c.shape(c.input(0))));
    if (c.needs(1)) c.add_grad(1, c.unbroadcast(c.op("Neg", {c.grad_out(0)}), c.shape(c.input(1))));
  } else if (op == "Mul") {
    for (int i = 0; i < 2; ++i) {
      if (c.needs(i)) c.add_grad(i, c.unbroadcast(c.op("Mul", {c.grad_out(0), c.input(1 - i)}), c.shape(c.input(i))));
    }
  } else {  // Div
    ValueId dy = c.grad_out(0);
    if (c.needs(0)) c.add_grad(0, c.unbroadcast(c.op("Div", {dy, c.input(1)}), c.shape(c.input(0))));
    if (c.needs(1)) {
      // d(a/b)/db = -y/b
      ValueId t = c.op("Mul", {dy, c.op("Div", {c.output(0), c.input(1)})});
      c.add_grad(1, c.unbroadcast(c.op("Neg", {t}), c.shape(c.input(1))));
    }
  }
  return Status::ok();
}

Status pow_grad(GradContext& c) {
  ValueId a = c.input(0), b = c.input(1), dy = c.grad_out(0);
  DType dt = c.dtype(a);
  if (c.needs(0)) {
    ValueId bb = c.dtype(b) == dt ? b : c.op("Cast", {b}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(dt))}});
    ValueId pm1 = c.op("Pow", {a, c.op("Sub", {bb, c.scalar(1.0, dt)})});
    c.add_grad(0, c.unbroadcast(c.op("Mul", {dy, c.op("Mul", {bb, pm1})}), c.shape(a)));
  }
  if (c.needs(1)) {
    ValueId t = c.op("Mul", {dy, c.op("Mul", {c.output(0), c.op("Log", {a})})});
    c.add_grad(1, c.unbroadcast(t, c.shape(b)));
  }
  return Status::ok();
}

Status sum_grad(GradContext& c, bool mean) {
  ValueId dy = c.grad_out(0);
  int n = c.node().num_inputs();
  if (mean) dy = c.op("Div", {dy, c.scalar(n, c.dtype(dy))});
  for (int i = 0; i < n; ++i) {
    if (c.needs(i)) c.add_grad(i, c.unbroadcast(dy, c.shape(c.input(i))));
  }
  return Status::ok();
}

Status min_max_grad(GradContext& c, bool is_max) {
  int n = c.node().num_inputs();
  if (n == 1) {
    c.add_grad(0, c.grad_out(0));
    return Status::ok();
  }
  if (n != 2) return c.fail("only one or two inputs are differentiable");
  // ties go to the first input
  ValueId first = c.op(is_max ? "GreaterOrEqual" : "LessOrEqual", {c.input(0), c.input(1)});
  ValueId zero = c.scalar(0.0, c.dtype(c.grad_out(0)));
  if (c.needs(0)) c.add_grad(0, c.unbroadcast(c.op("Where", {first, c.grad_out(0), zero}), c.shape(c.input(0))));
  if (c.needs(1)) c.add_grad(1, c.unbroadcast(c.op("Where", {first, zero, c.grad_out(0)}), c.shape(c.input(1))));
  return Status::ok();
}

// Bool examples of the logic ops: a [4, 6] against a broadcast [6].
Tensor bool_matrix() {
  Tensor a(DType::kBool, {4, 6});
  for (int i = 0; i < 24; ++i) a.mutable_data<uint8_t>()[i] = (i * 7) % 3 == 0;
  return a;
}
Tensor bool_row() {
  Tensor b(DType::kBool, {6});
  for (int i = 0; i < 6; ++i) b.mutable_data<uint8_t>()[i] = i % 2;
  return b;
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  // --- unary math (flops per element are rough: a transcendental counts as several operations) --
  {
    OpSchema s = unary_schema("Identity", 1);
    s.traits = kTraitRelayout;
    s.view_of_input = 0;
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.grad_out(0));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) { return shard_same_as_input(c, PartialPolicy::kAdditive); };
    s.examples = examples_of({example("matrix", {ex_float({4, 6}, -2.0, 2.0)})});
    r.add(std::move(s));
  }
  {
    OpSchema s = unary_schema("Neg", 1);
    s.grad = [](GradContext& c) {
      c.add_grad(0, c.op("Neg", {c.grad_out(0)}));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) { return shard_same_as_input(c, PartialPolicy::kAdditive); };
    s.examples = examples_of({example("matrix", {ex_float({4, 6}, -2.0, 2.0)})});
    r.add(std::move(s));
  }
  // derivatives a fused kernel computes from x and/or y (oases.UnaryGrad)
  struct Unary {
    const char* op;
    double flops;
    bool float_only;
    OpExample example;
    uint32_t traits = 0;
  };
  const OpExample matrix = example("matrix", {ex_float({4, 6}, -2.0, 2.0)});
  const OpExample positive = example("positive", {ex_float({4, 6}, 0.5, 2.0)});
  for (const Unary& u :
       {Unary{"Abs", 1, false, matrix}, Unary{"Relu", 1, false, matrix, kTraitActivation}, Unary{"Reciprocal", 1, true, positive},
        Unary{"Sqrt", 4, true, positive}, Unary{"Exp", 4, true, matrix}, Unary{"Log", 4, true, positive}, Unary{"Erf", 4, true, matrix},
        Unary{"Tanh", 4, true, matrix}, Unary{"Sigmoid", 4, true, matrix}, Unary{"Sin", 4, true, matrix}, Unary{"Cos", 4, true, matrix},
        Unary{"Softplus", 4, true, matrix}, Unary{"Softsign", 4, true, matrix}}) {
    OpSchema s = unary_schema(u.op, u.flops, u.float_only);
    s.traits = u.traits;
    s.grad = [op = u.op](GradContext& c) { return unary_grad(c, op); };
    s.shard = shard_nonlinear;
    s.examples = examples_of({u.example});
    r.add(std::move(s));
  }
  for (const TrigOp& t : trig_ops()) {
    OpSchema s = unary_schema(t.op, 4, true);
    s.grad = [derivative = t.derivative](GradContext& c) {
      c.add_grad(0, c.op("Mul", {c.grad_out(0), derivative(c, c.input(0), c.output(0))}));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.examples = examples_of({t.example});
    r.add(std::move(s));
  }
  // piecewise constant: no gradient flows
  for (const char* op : {"Sign", "Floor", "Ceil", "Round"}) {
    OpSchema s = unary_schema(op, 1, std::string(op) != "Sign");
    s.differentiable = false;
    s.shard = shard_nonlinear;
    s.examples = examples_of({example("matrix", {ex_float({4, 6}, -3, 3)})});
    r.add(std::move(s));
  }
  {
    // Clip: min/max inputs (opset 11+) become float attributes "min"/"max" when constant.
    OpSchema s = same_as_input_schema("Clip", 1, 3);
    s.normalize = [](InferContext& c) -> Status {
      for (auto [slot, name] : {std::pair<int, const char*>{1, "min"}, {2, "max"}}) {
        auto moved = operand_to_float_attr(c, slot, name, /*required_constant=*/false);
        if (!moved) return moved.status();
      }
      trim_inputs(c);
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      if (c.node().num_inputs() > 1) return c.fail("Clip with run-time min/max is not differentiable here");
      AttrMap a{{"op", Attribute::of_string("Clip")}};
      if (c.attrs().has("min")) a.set_float("min", c.attrs().get_float("min", 0));
      if (c.attrs().has("max")) a.set_float("max", c.attrs().get_float("max", 0));
      c.add_grad(0, c.op("UnaryGrad", {c.grad_out(0), c.input(0), c.output(0)}, a, kOasesDomain));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.examples = examples_of(
        {example("min max", {ex_float({4, 6}, -2, 2)}, AttrMap{{"min", Attribute::of_float(-0.5f)}, {"max", Attribute::of_float(0.7f)}})});
    r.add(std::move(s));
  }

  // --- binary arithmetic ----------------------------------------------------------------------
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    const std::string name = op;
    OpSchema s = binary_schema(op, 2, 2);
    s.oldest_version = 7;  // opset 7 introduced numpy broadcasting; later versions only add types
    s.grad = [name](GradContext& c) { return arithmetic_grad(c, name); };
    if (name == "Add" || name == "Sub") {
      s.shard = shard_additive;
    } else if (name == "Mul") {
      s.shard = [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kMultiplicative); };
    } else {
      s.shard = [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kFirstOnly); };
    }
    s.examples = examples_of({example("broadcast", {ex_float({2, 3, 4}), ex_float({3, 1}, 0.5, 1.5)}),
                              example("scalar", {ex_float({1}, 0.5, 1.5), ex_float({2, 3}, 0.5, 1.5)})});
    r.add(std::move(s));
  }
  {
    OpSchema s = binary_schema("Pow", 2, 2, /*same_type=*/false);
    s.oldest_version = 7;
    s.grad = pow_grad;
    s.shard = shard_nonlinear;
    Tensor three(DType::kF64, {});
    *three.mutable_data<double>() = 3.0;
    s.examples = examples_of({example("constant exponent", {ex_float({2, 4}, 0.5, 1.5), ex_data(three)}),
                              example("both", {ex_float({2, 4}, 0.5, 1.5), ex_float({4}, 0.5, 2.0)})});
    r.add(std::move(s));
  }
  {
    OpSchema s = binary_schema("Mod", 2, 2);
    s.differentiable = false;  // integer-valued steps
    s.shard = shard_nonlinear;
    s.examples =
        examples_of({example("float fmod", {ex_float({4, 6}, -3, 3), ex_float({6}, 0.5, 1.5)}, AttrMap{{"fmod", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
  for (const char* op : {"Sum", "Mean"}) {
    const bool mean = std::string(op) == "Mean";
    OpSchema s = binary_schema(op, 1, INT_MAX);
    s.grad = [mean](GradContext& c) { return sum_grad(c, mean); };
    s.shard = shard_additive;
    s.examples = mean ? examples_of({example("two", {ex_float({2, 4}), ex_float({4})})})
                      : examples_of({example("three", {ex_float({2, 4}), ex_float({4}), ex_float({2, 1})})});
    r.add(std::move(s));
  }
  for (const char* op : {"Min", "Max"}) {
    const bool is_max = std::string(op) == "Max";
    OpSchema s = binary_schema(op, 1, INT_MAX);
    s.grad = [is_max](GradContext& c) { return min_max_grad(c, is_max); };
    s.shard = shard_nonlinear;
    s.examples = is_max ? examples_of({example("same shape", {ex_float({2, 4}), ex_float({2, 4})})})
                        : examples_of({example("broadcast", {ex_float({2, 4}), ex_float({4})})});
    r.add(std::move(s));
  }

  // --- comparisons and logic: bool results, no gradient -------------------------------------
  // (their examples feed the split-state table only)
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    OpSchema s = binary_schema(op, 2, 2, true, DType::kBool);
    s.differentiable = false;
    s.shard = shard_nonlinear;
    s.examples = examples_of({example("broadcast", {ex_float({4, 6}), ex_float({6})})});
    r.add(std::move(s));
  }
  for (const char* op : {"And", "Or", "Xor"}) {
    OpSchema s = binary_schema(op, 2, 2, true, DType::kBool);
    s.differentiable = false;
    s.shard = shard_nonlinear;
    s.examples = examples_of({example("broadcast", {ex_data(bool_matrix()), ex_data(bool_row())})});
    r.add(std::move(s));
  }
  {
    OpSchema s = same_as_input_schema("Not", 1, 1);
    s.infer = [](InferContext& c) {
      if (c.dtype(0) != DType::kBool) return c.fail("input must be bool, got {}", dtype_name(c.dtype(0)));
      c.set_output(0, DType::kBool, c.shape(0));
      return Status::ok();
    };
    s.differentiable = false;
    s.shard = shard_nonlinear;
    s.examples = examples_of({example("matrix", {ex_data(bool_matrix())})});
    r.add(std::move(s));
  }
  for (const char* op : {"IsNaN", "IsInf"}) {
    OpSchema s = same_as_input_schema(op, 1, 1);
    s.infer = [](InferContext& c) {
      c.set_output(0, DType::kBool, c.shape(0));
      return Status::ok();
    };
    s.differentiable = false;
    s.shard = shard_nonlinear;
    s.examples = examples_of({example("matrix", {ex_float({4, 6}, -3, 3)})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Where";
    s.min_inputs = s.max_inputs = 3;
    s.non_differentiable_inputs = {0};
    s.infer = [](InferContext& c) {
      if (c.dtype(0) != DType::kBool) return c.fail("condition must be bool, got {}", dtype_name(c.dtype(0)));
      OASES_RETURN_IF_ERROR(check_same_dtype(c, 1, 2));
      OASES_RETURN_IF_ERROR(infer_broadcast(c));
      c.set_output(0, c.dtype(1), c.graph().value(c.node().outputs[0]).shape);
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      ValueId zero = c.scalar(0.0, c.dtype(c.grad_out(0)));
      if (c.needs(1)) c.add_grad(1, c.unbroadcast(c.op("Where", {c.input(0), c.grad_out(0), zero}), c.shape(c.input(1))));
      if (c.needs(2)) c.add_grad(2, c.unbroadcast(c.op("Where", {c.input(0), zero, c.grad_out(0)}), c.shape(c.input(2))));
      return Status::ok();
    };
    s.shard = shard_nonlinear;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 1.0); };
    Tensor cond(DType::kBool, {2, 4});
    for (int i = 0; i < 8; ++i) cond.mutable_data<uint8_t>()[i] = i % 2;
    s.examples = examples_of({example("broadcast", {ex_data(cond), ex_float({2, 4}), ex_float({4})})});
    r.add(std::move(s));
  }

  // --- type conversion ----------------------------------------------------------------------
  {
    OpSchema s = same_as_input_schema("Cast", 1, 1);
    s.traits = kTraitRelayout;
    s.infer = [](InferContext& c) {
      int64_t to = c.attrs().get_int("to", 0);
      DType dt = dtype_from_onnx(static_cast<int>(to));
      if (dt == DType::kUndefined) return c.fail("unsupported target type {} (ONNX data type number)", to);
      c.set_output(0, dt, c.shape(0));
      return Status::ok();
    };
    s.grad = [](GradContext& c) {
      DType in = c.dtype(c.input(0));
      c.add_grad(0, c.op("Cast", {c.grad_out(0)}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(in))}}));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) {
      bool to_float = is_floating(c.graph().value(c.node().outputs[0]).dtype);
      return shard_same_as_input(c, to_float ? PartialPolicy::kAdditive : PartialPolicy::kNone);
    };
    s.examples = examples_of({example("to float64", {ex_float({2, 4})}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kF64))}})});
    r.add(std::move(s));
  }
  {
    // CastLike(x, like) becomes Cast(x) with "to" taken from the second input's type: it never
    // runs nor meets a plan.
    OpSchema s = same_as_input_schema("CastLike", 2, 2);
    s.traits = kTraitNoKernel;
    s.differentiable = false;
    s.normalize = [](InferContext& c) -> Status {
      c.node().attrs.set_int("to", dtype_to_onnx(c.dtype(1)));
      c.node().op_type = "Cast";
      c.graph().set_input(c.node().id, 1, kNoId);
      trim_inputs(c);
      return Status::ok();
    };
    s.shard = shard_replicated_only;
    r.add(std::move(s));
  }
}

}  // namespace oases
