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

OpSchema& add_unary(OpRegistry& r, const std::string& op, double flops, bool float_only = false) {
  OpSchema s = same_as_input_schema(op, 1, 1);
  s.infer = [float_only](InferContext& c) {
    if (float_only && !is_floating(c.dtype(0))) {
      return c.fail("input '{}' has type {}, a floating type is required", c.input(0).name, dtype_name(c.dtype(0)));
    }
    c.set_output(0, c.dtype(0), c.shape(0));
    return Status::ok();
  };
  s.cost = [flops](const Graph& g, const Node& n) { return elementwise_cost(g, n, flops); };
  return r.add(std::move(s));
}

void add_binary(OpRegistry& r, const std::string& op, int min_in, int max_in, bool same_type = true, DType out = DType::kUndefined) {
  OpSchema s;
  s.op_type = op;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.infer = [same_type, out](InferContext& c) {
    if (same_type) OASES_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs() - 1));
    return infer_broadcast(c, out);
  };
  s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 1.0); };
  r.add(std::move(s));
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  // Unary math (flops per element are rough: a transcendental counts as several operations).
  for (const char* op : {"Neg", "Abs", "Sign"}) add_unary(r, op, 1);
  add_unary(r, "Relu", 1).traits = kTraitActivation;
  add_unary(r, "Identity", 1).traits = kTraitRelayout;
  for (const char* op : {"Floor", "Ceil", "Round", "Reciprocal"}) add_unary(r, op, 1, true);
  for (const char* op : {"Sqrt", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Sin", "Cos", "Softplus", "Softsign"}) {
    add_unary(r, op, 4, true);
  }
  for (const char* op : {"Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"}) {
    add_unary(r, op, 4, true);
  }
  r.find_mutable("", "Identity")->view_of_input = 0;

  for (const char* op : {"Add", "Sub", "Mul", "Div", "Mod"}) add_binary(r, op, 2, 2);
  add_binary(r, "Pow", 2, 2, /*same_type=*/false);
  // opset 7 introduced numpy broadcasting; later versions only add types
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"}) r.find_mutable("", op)->oldest_version = 7;
  for (const char* op : {"Min", "Max", "Sum", "Mean"}) add_binary(r, op, 1, INT_MAX);
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    add_binary(r, op, 2, 2, true, DType::kBool);
  }
  for (const char* op : {"And", "Or", "Xor"}) add_binary(r, op, 2, 2, true, DType::kBool);

  {
    OpSchema s = same_as_input_schema("Not", 1, 1);
    s.infer = [](InferContext& c) {
      if (c.dtype(0) != DType::kBool) return c.fail("input must be bool, got {}", dtype_name(c.dtype(0)));
      c.set_output(0, DType::kBool, c.shape(0));
      return Status::ok();
    };
    r.add(std::move(s));
  }
  for (const char* op : {"IsNaN", "IsInf"}) {
    OpSchema s = same_as_input_schema(op, 1, 1);
    s.infer = [](InferContext& c) {
      c.set_output(0, DType::kBool, c.shape(0));
      return Status::ok();
    };
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
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 1.0); };
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
    r.add(std::move(s));
  }
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
    r.add(std::move(s));
  }
  {
    // CastLike(x, like) becomes Cast(x) with "to" taken from the second input's type.
    OpSchema s = same_as_input_schema("CastLike", 2, 2);
    s.normalize = [](InferContext& c) -> Status {
      c.node().attrs.set_int("to", dtype_to_onnx(c.dtype(1)));
      c.node().op_type = "Cast";
      c.graph().set_input(c.node().id, 1, kNoId);
      trim_inputs(c);
      return Status::ok();
    };
    r.add(std::move(s));
  }

  // --- gradient rules -------------------------------------------------------------------
  auto set_grad = [&r](const char* op, std::function<Status(GradContext&)> fn) { r.find_mutable("", op)->grad = std::move(fn); };
  set_grad("Identity", [](GradContext& c) {
    c.add_grad(0, c.grad_out(0));
    return Status::ok();
  });
  set_grad("Neg", [](GradContext& c) {
    c.add_grad(0, c.op("Neg", {c.grad_out(0)}));
    return Status::ok();
  });
  // unary ops whose derivative a fused kernel computes from x and/or y
  for (const char* op :
       {"Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Sigmoid", "Relu", "Erf", "Sin", "Cos", "Abs", "Softplus", "Softsign"}) {
    set_grad(op, [op](GradContext& c) {
      c.add_grad(0, c.op("UnaryGrad", {c.grad_out(0), c.input(0), c.output(0)}, AttrMap{{"op", Attribute::of_string(op)}}, kOasesDomain));
      return Status::ok();
    });
  }
  set_grad("Clip", [](GradContext& c) {
    if (c.node().num_inputs() > 1) return c.fail("Clip with run-time min/max is not differentiable here");
    AttrMap a{{"op", Attribute::of_string("Clip")}};
    if (c.attrs().has("min")) a.set_float("min", c.attrs().get_float("min", 0));
    if (c.attrs().has("max")) a.set_float("max", c.attrs().get_float("max", 0));
    c.add_grad(0, c.op("UnaryGrad", {c.grad_out(0), c.input(0), c.output(0)}, a, kOasesDomain));
    return Status::ok();
  });
  set_grad("Add", [](GradContext& c) {
    for (int i = 0; i < 2; ++i) {
      if (c.needs(i)) c.add_grad(i, c.unbroadcast(c.grad_out(0), c.shape(c.input(i))));
    }
    return Status::ok();
  });
  set_grad("Sub", [](GradContext& c) {
    if (c.needs(0)) c.add_grad(0, c.unbroadcast(c.grad_out(0), c.shape(c.input(0))));
    if (c.needs(1)) c.add_grad(1, c.unbroadcast(c.op("Neg", {c.grad_out(0)}), c.shape(c.input(1))));
    return Status::ok();
  });
  set_grad("Mul", [](GradContext& c) {
    for (int i = 0; i < 2; ++i) {
      if (c.needs(i)) c.add_grad(i, c.unbroadcast(c.op("Mul", {c.grad_out(0), c.input(1 - i)}), c.shape(c.input(i))));
    }
    return Status::ok();
  });
  set_grad("Div", [](GradContext& c) {
    ValueId dy = c.grad_out(0);
    if (c.needs(0)) c.add_grad(0, c.unbroadcast(c.op("Div", {dy, c.input(1)}), c.shape(c.input(0))));
    if (c.needs(1)) {
      // d(a/b)/db = -y/b
      ValueId t = c.op("Mul", {dy, c.op("Div", {c.output(0), c.input(1)})});
      c.add_grad(1, c.unbroadcast(c.op("Neg", {t}), c.shape(c.input(1))));
    }
    return Status::ok();
  });
  set_grad("Pow", [](GradContext& c) {
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
  });
  for (const char* op : {"Sum", "Mean"}) {
    bool mean = std::string(op) == "Mean";
    set_grad(op, [mean](GradContext& c) {
      ValueId dy = c.grad_out(0);
      int n = c.node().num_inputs();
      if (mean) dy = c.op("Div", {dy, c.scalar(n, c.dtype(dy))});
      for (int i = 0; i < n; ++i) {
        if (c.needs(i)) c.add_grad(i, c.unbroadcast(dy, c.shape(c.input(i))));
      }
      return Status::ok();
    });
  }
  for (const char* op : {"Min", "Max"}) {
    bool is_max = std::string(op) == "Max";
    set_grad(op, [is_max](GradContext& c) {
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
    });
  }
  set_grad("Where", [](GradContext& c) {
    ValueId zero = c.scalar(0.0, c.dtype(c.grad_out(0)));
    if (c.needs(1)) c.add_grad(1, c.unbroadcast(c.op("Where", {c.input(0), c.grad_out(0), zero}), c.shape(c.input(1))));
    if (c.needs(2)) c.add_grad(2, c.unbroadcast(c.op("Where", {c.input(0), zero, c.grad_out(0)}), c.shape(c.input(2))));
    return Status::ok();
  });
  // trigonometric and hyperbolic ops, from their derivatives in terms of x (or y for Tan):
  //   tan' = 1 + y², asin' = 1/√(1-x²), acos' = -1/√(1-x²), atan' = 1/(1+x²), sinh' = cosh,
  //   cosh' = sinh, asinh' = 1/√(x²+1), acosh' = 1/√(x²-1), atanh' = 1/(1-x²)
  auto unary_from = [&set_grad](const char* op, std::function<ValueId(GradContext&, ValueId x, ValueId y)> derivative) {
    set_grad(op, [derivative](GradContext& c) {
      c.add_grad(0, c.op("Mul", {c.grad_out(0), derivative(c, c.input(0), c.output(0))}));
      return Status::ok();
    });
  };
  auto one = [](GradContext& c, ValueId like) { return c.scalar(1.0, c.dtype(like)); };
  auto sq = [](GradContext& c, ValueId v) { return c.op("Mul", {v, v}); };
  unary_from("Tan", [=](GradContext& c, ValueId, ValueId y) { return c.op("Add", {one(c, y), sq(c, y)}); });
  unary_from("Asin", [=](GradContext& c, ValueId x, ValueId) {
    return c.op("Reciprocal", {c.op("Sqrt", {c.op("Sub", {one(c, x), sq(c, x)})})});
  });
  unary_from("Acos", [=](GradContext& c, ValueId x, ValueId) {
    return c.op("Neg", {c.op("Reciprocal", {c.op("Sqrt", {c.op("Sub", {one(c, x), sq(c, x)})})})});
  });
  unary_from("Atan", [=](GradContext& c, ValueId x, ValueId) { return c.op("Reciprocal", {c.op("Add", {one(c, x), sq(c, x)})}); });
  unary_from("Sinh", [](GradContext& c, ValueId x, ValueId) { return c.op("Cosh", {x}); });
  unary_from("Cosh", [](GradContext& c, ValueId x, ValueId) { return c.op("Sinh", {x}); });
  unary_from("Asinh", [=](GradContext& c, ValueId x, ValueId) {
    return c.op("Reciprocal", {c.op("Sqrt", {c.op("Add", {sq(c, x), one(c, x)})})});
  });
  unary_from("Acosh", [=](GradContext& c, ValueId x, ValueId) {
    return c.op("Reciprocal", {c.op("Sqrt", {c.op("Sub", {sq(c, x), one(c, x)})})});
  });
  unary_from("Atanh", [=](GradContext& c, ValueId x, ValueId) { return c.op("Reciprocal", {c.op("Sub", {one(c, x), sq(c, x)})}); });
  // piecewise constant or integer-valued: no gradient flows
  for (const char* op : {"Sign", "Floor", "Ceil", "Round", "Mod", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
                         "Xor", "Not", "IsNaN", "IsInf"}) {
    r.find_mutable("", op)->differentiable = false;
  }
  // CastLike is rewritten into Cast by its normalize rule: it never runs nor meets a plan
  r.find_mutable("", "CastLike")->traits |= kTraitNoKernel;
  r.find_mutable("", "CastLike")->differentiable = false;
  r.find_mutable("", "CastLike")->shard = shard_replicated_only;
  set_grad("Cast", [](GradContext& c) {
    DType in = c.dtype(c.input(0));
    c.add_grad(0, c.op("Cast", {c.grad_out(0)}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(in))}}));
    return Status::ok();
  });

  // --- sharding rules ---------------------------------------------------------------------
  // Linear ops pass partial sums through; nonlinear ones need them reduced first.
  auto set_shard = [&r](const char* op, std::function<Status(ShardContext&)> fn) {
    if (OpSchema* s = r.find_mutable("", op)) s->shard = std::move(fn);
  };
  for (const char* op : {"Add", "Sub", "Sum", "Mean"}) {
    set_shard(op, [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kAdditive); });
  }
  set_shard("Mul", [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kMultiplicative); });
  set_shard("Div", [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kFirstOnly); });
  for (const char* op : {"Neg", "Identity"}) {
    set_shard(op, [](ShardContext& c) { return shard_same_as_input(c, PartialPolicy::kAdditive); });
  }
  set_shard("Cast", [](ShardContext& c) {
    bool to_float = is_floating(c.graph().value(c.node().outputs[0]).dtype);
    return shard_same_as_input(c, to_float ? PartialPolicy::kAdditive : PartialPolicy::kNone);
  });
  for (const char* op :
       {"Abs",   "Sign",    "Relu", "Floor", "Ceil",     "Round",    "Reciprocal",  "Sqrt",           "Exp",   "Log",  "Erf",
        "Tanh",  "Sigmoid", "Sin",  "Cos",   "Softplus", "Softsign", "Not",         "IsNaN",          "IsInf", "Clip", "Pow",
        "Mod",   "Min",     "Max",  "Equal", "Less",     "Greater",  "LessOrEqual", "GreaterOrEqual", "And",   "Or",   "Xor",
        "Where", "Tan",     "Asin", "Acos",  "Atan",     "Sinh",     "Cosh",        "Asinh",          "Acosh", "Atanh"}) {
    set_shard(op, [](ShardContext& c) { return shard_elementwise(c, PartialPolicy::kNone); });
  }

  // --- examples (registry-driven tests: finite-difference gradients, split states) ------------
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    set_examples(r, "", op,
                 {example("broadcast", {ex_float({2, 3, 4}), ex_float({3, 1}, 0.5, 1.5)}),
                  example("scalar", {ex_float({1}, 0.5, 1.5), ex_float({2, 3}, 0.5, 1.5)})});
  }
  {
    Tensor three(DType::kF64, {});
    *three.mutable_data<double>() = 3.0;
    set_examples(r, "", "Pow",
                 {example("constant exponent", {ex_float({2, 4}, 0.5, 1.5), ex_data(three)}),
                  example("both", {ex_float({2, 4}, 0.5, 1.5), ex_float({4}, 0.5, 2.0)})});
  }
  set_examples(r, "", "Max", {example("same shape", {ex_float({2, 4}), ex_float({2, 4})})});
  set_examples(r, "", "Min", {example("broadcast", {ex_float({2, 4}), ex_float({4})})});
  set_examples(r, "", "Sum", {example("three", {ex_float({2, 4}), ex_float({4}), ex_float({2, 1})})});
  set_examples(r, "", "Mean", {example("two", {ex_float({2, 4}), ex_float({4})})});
  {
    Tensor cond(DType::kBool, {2, 4});
    for (int i = 0; i < 8; ++i) cond.mutable_data<uint8_t>()[i] = i % 2;
    set_examples(r, "", "Where", {example("broadcast", {ex_data(cond), ex_float({2, 4}), ex_float({4})})});
  }
  for (const char* op : {"Neg", "Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Sin", "Cos", "Abs", "Softplus", "Softsign", "Identity"}) {
    set_examples(r, "", op, {example("matrix", {ex_float({4, 6}, -2.0, 2.0)})});
  }
  for (const char* op : {"Log", "Sqrt", "Reciprocal"}) set_examples(r, "", op, {example("positive", {ex_float({4, 6}, 0.5, 2.0)})});
  for (const char* op : {"Tan", "Sinh", "Cosh", "Asinh", "Atan"})
    set_examples(r, "", op, {example("matrix", {ex_float({4, 6}, -1.2, 1.2)})});
  for (const char* op : {"Asin", "Acos", "Atanh"}) set_examples(r, "", op, {example("inside (-1, 1)", {ex_float({4, 6}, -0.8, 0.8)})});
  // ops without a gradient: their examples feed the split-state table only
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    set_examples(r, "", op, {example("broadcast", {ex_float({4, 6}), ex_float({6})})});
  }
  for (const char* op : {"Sign", "Floor", "Ceil", "Round", "IsNaN", "IsInf"}) {
    set_examples(r, "", op, {example("matrix", {ex_float({4, 6}, -3, 3)})});
  }
  {
    Tensor a(DType::kBool, {4, 6}), b(DType::kBool, {6});
    for (int i = 0; i < 24; ++i) a.mutable_data<uint8_t>()[i] = (i * 7) % 3 == 0;
    for (int i = 0; i < 6; ++i) b.mutable_data<uint8_t>()[i] = i % 2;
    for (const char* op : {"And", "Or", "Xor"}) set_examples(r, "", op, {example("broadcast", {ex_data(a), ex_data(b)})});
    set_examples(r, "", "Not", {example("matrix", {ex_data(a)})});
  }
  set_examples(r, "", "Mod",
               {example("float fmod", {ex_float({4, 6}, -3, 3), ex_float({6}, 0.5, 1.5)}, AttrMap{{"fmod", Attribute::of_int(1)}})});
  set_examples(r, "", "Acosh", {example("above 1", {ex_float({4, 6}, 1.2, 3.0)})});
  set_examples(
      r, "", "Clip",
      {example("min max", {ex_float({4, 6}, -2, 2)}, AttrMap{{"min", Attribute::of_float(-0.5f)}, {"max", Attribute::of_float(0.7f)}})});
  set_examples(r, "", "Cast", {example("to float64", {ex_float({2, 4})}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kF64))}})});
}

}  // namespace oases
