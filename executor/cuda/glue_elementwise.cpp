// CUDA glue for elementwise ops and their gradients (the CPU glue is
// executor/cpu/glue_elementwise.cpp; the attribute handling here mirrors it).
#include <cmath>
#include <cstring>
#include <limits>

#include "executor/communicator.h"
#include "executor/cuda/cuda_context.h"
#include "executor/device_args.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/elementwise.h"

namespace oases::cuda {

namespace {

void same_copy(CudaContext& c) {
  if (c.out(0).data != c.in(0).data) copy_bytes(c.in(0).data, c.out(0).data, c.in(0).nbytes(), c.stream);
}

NdPlan plan_of(CudaContext& c, std::initializer_list<int> slots) {
  std::vector<std::vector<int64_t>> ins;
  for (int s : slots) ins.push_back(dims(c.in(s).shape));
  return broadcast_plan(dims(c.out(0).shape), ins);
}

void add_unary(CudaKernelRegistry& r, const std::string& domain, const std::string& name, UnaryOp op) {
  r.add(domain, name,
        [op](CudaContext& c) { unary(op, UnaryArgs{}, elem(c.in(0).dtype), c.in(0).data, c.out(0).data, c.in(0).numel(), c.stream); });
}

void add_binary(CudaKernelRegistry& r, const std::string& name, BinaryOp op) {
  r.add("", name, [op](CudaContext& c) {
    NdPlan p = plan_of(c, {0, 1});
    binary(op, elem(c.in(0).dtype), elem(c.in(1).dtype), c.in(0).data, c.in(1).data, c.out(0).data, p, c.stream);
  });
}

// Variadic Max/Min/Sum/Mean: broadcast the first input into the output, fold the others in.
void add_variadic(CudaKernelRegistry& r, const std::string& name, BinaryOp op, bool mean) {
  r.add("", name, [op, mean](CudaContext& c) {
    const TensorView& o = c.out(0);
    size_t es = dtype_size(o.dtype);
    copy(c.in(0).data, o.data, es, broadcast_plan(dims(o.shape), {dims(c.in(0).shape)}), c.stream);
    for (size_t i = 1; i < c.k.in.size(); ++i) {
      NdPlan p = broadcast_plan(dims(o.shape), {dims(o.shape), dims(c.k.in[i].shape)});
      binary(op, elem(o.dtype), elem(o.dtype), o.data, c.k.in[i].data, o.data, p, c.stream);
    }
    if (mean) {
      UnaryArgs a;
      a.alpha = 1.f / static_cast<float>(c.k.in.size());
      unary(UnaryOp::kScale, a, elem(o.dtype), o.data, o.data, o.numel(), c.stream);
    }
  });
}

DropoutArgs dropout_args(CudaContext& c, float ratio) {
  return make_dropout_args(c.k, ratio);
}

}  // namespace

void register_cuda_elementwise(CudaKernelRegistry& r) {
  const std::pair<const char*, UnaryOp> unaries[] = {{"Neg", UnaryOp::kNeg},
                                                     {"Abs", UnaryOp::kAbs},
                                                     {"Sign", UnaryOp::kSign},
                                                     {"Relu", UnaryOp::kRelu},
                                                     {"Floor", UnaryOp::kFloor},
                                                     {"Ceil", UnaryOp::kCeil},
                                                     {"Round", UnaryOp::kRound},
                                                     {"Reciprocal", UnaryOp::kReciprocal},
                                                     {"Sqrt", UnaryOp::kSqrt},
                                                     {"Exp", UnaryOp::kExp},
                                                     {"Log", UnaryOp::kLog},
                                                     {"Erf", UnaryOp::kErf},
                                                     {"Tanh", UnaryOp::kTanh},
                                                     {"Sigmoid", UnaryOp::kSigmoid},
                                                     {"Sin", UnaryOp::kSin},
                                                     {"Cos", UnaryOp::kCos},
                                                     {"Tan", UnaryOp::kTan},
                                                     {"Asin", UnaryOp::kAsin},
                                                     {"Acos", UnaryOp::kAcos},
                                                     {"Atan", UnaryOp::kAtan},
                                                     {"Sinh", UnaryOp::kSinh},
                                                     {"Cosh", UnaryOp::kCosh},
                                                     {"Asinh", UnaryOp::kAsinh},
                                                     {"Acosh", UnaryOp::kAcosh},
                                                     {"Atanh", UnaryOp::kAtanh},
                                                     {"Softplus", UnaryOp::kSoftplus},
                                                     {"Softsign", UnaryOp::kSoftsign},
                                                     {"Mish", UnaryOp::kMish},
                                                     {"HardSwish", UnaryOp::kHardSwish}};
  for (const auto& [name, op] : unaries) add_unary(r, "", name, op);
  add_unary(r, "oases", "Silu", UnaryOp::kSilu);

  struct Param {
    const char* name;
    UnaryOp op;
    float alpha, beta;
  };
  const Param params[] = {{"LeakyRelu", UnaryOp::kLeakyRelu, 0.01f, 0.f},
                          {"Elu", UnaryOp::kElu, 1.f, 0.f},
                          {"Selu", UnaryOp::kSelu, 1.67326319217681884765625f, 1.05070102214813232421875f},
                          {"Celu", UnaryOp::kCelu, 1.f, 0.f},
                          {"HardSigmoid", UnaryOp::kHardSigmoid, 0.2f, 0.5f},
                          {"ThresholdedRelu", UnaryOp::kThresholdedRelu, 1.f, 0.f}};
  for (const Param& p : params) {
    r.add("", p.name, [p](CudaContext& c) {
      UnaryArgs a;
      a.alpha = c.attrs().get_float("alpha", p.alpha);
      if (p.op == UnaryOp::kSelu) {
        a.gamma = c.attrs().get_float("gamma", p.beta);
      } else {
        a.beta = c.attrs().get_float("beta", p.beta);
      }
      unary(p.op, a, elem(c.in(0).dtype), c.in(0).data, c.out(0).data, c.in(0).numel(), c.stream);
    });
  }
  r.add("", "Gelu", [](CudaContext& c) {
    bool tanh_form = c.attrs().get_string("approximate", "none") == "tanh";
    gelu_forward(tanh_form, elem(c.in(0).dtype), c.in(0).data, c.out(0).data, c.in(0).numel(), c.stream);
  });
  r.add("oases", "SwiGLU", [](CudaContext& c) {
    if (c.in(0).shape == c.in(1).shape && c.in(0).shape == c.out(0).shape) {
      swiglu_forward(elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.out(0).data, c.out(0).numel(), c.stream);
    } else {
      binary(BinaryOp::kSwiGLU, elem(c.in(0).dtype), elem(c.in(1).dtype), c.in(0).data, c.in(1).data, c.out(0).data, plan_of(c, {0, 1}),
             c.stream);
    }
  });
  add_binary(r, "PRelu", BinaryOp::kPRelu);
  add_binary(r, "Add", BinaryOp::kAdd);
  add_binary(r, "Sub", BinaryOp::kSub);
  add_binary(r, "Mul", BinaryOp::kMul);
  add_binary(r, "Div", BinaryOp::kDiv);
  add_binary(r, "Pow", BinaryOp::kPow);
  r.add("", "Mod", [](CudaContext& c) {
    BinaryOp op = c.attrs().get_int("fmod", 0) != 0 ? BinaryOp::kFmod : BinaryOp::kMod;
    binary(op, elem(c.in(0).dtype), elem(c.in(1).dtype), c.in(0).data, c.in(1).data, c.out(0).data, plan_of(c, {0, 1}), c.stream);
  });
  add_variadic(r, "Max", BinaryOp::kMax, false);
  add_variadic(r, "Min", BinaryOp::kMin, false);
  add_variadic(r, "Sum", BinaryOp::kAdd, false);
  add_variadic(r, "Mean", BinaryOp::kAdd, true);
  add_binary(r, "Equal", BinaryOp::kEqual);
  add_binary(r, "Less", BinaryOp::kLess);
  add_binary(r, "Greater", BinaryOp::kGreater);
  add_binary(r, "LessOrEqual", BinaryOp::kLessEq);
  add_binary(r, "GreaterOrEqual", BinaryOp::kGreaterEq);
  add_binary(r, "And", BinaryOp::kAnd);
  add_binary(r, "Or", BinaryOp::kOr);
  add_binary(r, "Xor", BinaryOp::kXor);
  r.add("", "Not", [](CudaContext& c) {
    predicate(PredicateOp::kNot, false, false, Elem::kU8, c.in(0).data, c.out(0).as<uint8_t>(), c.in(0).numel(), c.stream);
  });
  r.add("", "IsNaN", [](CudaContext& c) {
    predicate(PredicateOp::kIsNaN, false, false, elem(c.in(0).dtype), c.in(0).data, c.out(0).as<uint8_t>(), c.in(0).numel(), c.stream);
  });
  r.add("", "IsInf", [](CudaContext& c) {
    bool pos = c.attrs().get_int("detect_positive", 1) != 0, neg = c.attrs().get_int("detect_negative", 1) != 0;
    predicate(PredicateOp::kIsInf, pos, neg, elem(c.in(0).dtype), c.in(0).data, c.out(0).as<uint8_t>(), c.in(0).numel(), c.stream);
  });
  r.add("", "Where", [](CudaContext& c) {
    NdPlan p = plan_of(c, {0, 1, 2});
    where(c.in(0).as<uint8_t>(), c.in(1).data, c.in(2).data, c.out(0).data, dtype_size(c.in(1).dtype), p, c.stream);
  });
  r.add("", "Clip", [](CudaContext& c) {
    // attribute bounds (opset < 11) in one pass; tensor bounds (device scalars) as Max then Min
    UnaryArgs a;
    if (c.attrs().has("min")) a.lo = c.attrs().get_float("min", 0);
    if (c.attrs().has("max")) a.hi = c.attrs().get_float("max", 0);
    Elem t = elem(c.in(0).dtype);
    unary(UnaryOp::kClip, a, t, c.in(0).data, c.out(0).data, c.in(0).numel(), c.stream);
    const std::vector<int64_t> shape = dims(c.out(0).shape);
    if (c.has_input(1)) {
      binary(BinaryOp::kMax, t, t, c.out(0).data, c.in(1).data, c.out(0).data, broadcast_plan(shape, {shape, dims(c.in(1).shape)}),
             c.stream);
    }
    if (c.has_input(2)) {
      binary(BinaryOp::kMin, t, t, c.out(0).data, c.in(2).data, c.out(0).data, broadcast_plan(shape, {shape, dims(c.in(2).shape)}),
             c.stream);
    }
  });
  r.add("", "Cast",
        [](CudaContext& c) { cast(elem(c.in(0).dtype), elem(c.out(0).dtype), c.in(0).data, c.out(0).data, c.in(0).numel(), c.stream); });
  r.add("", "Identity", same_copy);
  r.add("", "Dropout", [](CudaContext& c) {
    // the ratio comes from the attribute or a constant input: both known on the host
    float ratio = c.attrs().get_float("ratio", 0.5f);
    if (c.has_input(1)) {
      const Value& rv = c.k.graph->value(c.k.node->inputs[1]);
      if (!rv.is_constant()) c.k.fail("a computed dropout ratio is not supported on CUDA (give it as a constant)");
      ratio = static_cast<float>(load_as_double(rv.constant.raw(), rv.dtype, 0));
    }
    if (ratio < 0.f || ratio >= 1.f) c.k.fail("ratio {} is outside [0, 1)", ratio);
    bool train_mode = c.attrs().get_int("training_mode", 0) != 0;
    if (c.has_input(2)) {
      const Value& tv = c.k.graph->value(c.k.node->inputs[2]);
      if (!tv.is_constant()) c.k.fail("a computed training_mode is not supported on CUDA (give it as a constant)");
      train_mode = load_as_double(tv.constant.raw(), tv.dtype, 0) != 0.0;
    }
    bool train = train_mode && (!c.k.state || c.k.state->training);
    uint8_t* mask = c.has_output(1) ? c.out(1).as<uint8_t>() : nullptr;
    if (!train || ratio == 0.f) {
      same_copy(c);
      if (mask) fill(mask, c.in(0).numel(), 1, 1, c.stream);
      return;
    }
    dropout(dropout_args(c, ratio), elem(c.in(0).dtype), c.in(0).data, c.out(0).data, mask, c.stream);
  });

  // --- gradients ---------------------------------------------------------------------------
  r.add("oases", "UnaryGrad", [](CudaContext& c) {
    static const std::map<std::string, UnaryGradOp> ops = {{"Exp", UnaryGradOp::kExp},
                                                           {"Log", UnaryGradOp::kLog},
                                                           {"Sqrt", UnaryGradOp::kSqrt},
                                                           {"Reciprocal", UnaryGradOp::kReciprocal},
                                                           {"Tanh", UnaryGradOp::kTanh},
                                                           {"Sigmoid", UnaryGradOp::kSigmoid},
                                                           {"Relu", UnaryGradOp::kRelu},
                                                           {"Erf", UnaryGradOp::kErf},
                                                           {"Sin", UnaryGradOp::kSin},
                                                           {"Cos", UnaryGradOp::kCos},
                                                           {"Abs", UnaryGradOp::kAbs},
                                                           {"Softplus", UnaryGradOp::kSoftplus},
                                                           {"Softsign", UnaryGradOp::kSoftsign},
                                                           {"Silu", UnaryGradOp::kSilu},
                                                           {"Clip", UnaryGradOp::kClip},
                                                           {"LeakyRelu", UnaryGradOp::kLeakyRelu},
                                                           {"Elu", UnaryGradOp::kElu},
                                                           {"Selu", UnaryGradOp::kSelu},
                                                           {"Celu", UnaryGradOp::kCelu},
                                                           {"HardSigmoid", UnaryGradOp::kHardSigmoid},
                                                           {"HardSwish", UnaryGradOp::kHardSwish},
                                                           {"Mish", UnaryGradOp::kMish},
                                                           {"ThresholdedRelu", UnaryGradOp::kThresholdedRelu}};
    std::string name = c.attrs().get_string("op", "");
    auto it = ops.find(name);
    if (it == ops.end()) c.k.fail("unknown op '{}'", name);
    UnaryGradArgs p;
    p.alpha = c.attrs().get_float(
        "alpha", name == "LeakyRelu" ? 0.01f : (name == "Selu" ? 1.67326319217681884765625f : (name == "HardSigmoid" ? 0.2f : 1.f)));
    p.beta = c.attrs().get_float("beta", 0.5f);
    p.gamma = c.attrs().get_float("gamma", 1.05070102214813232421875f);
    if (c.attrs().has("min")) p.lo = c.attrs().get_float("min", 0);
    if (c.attrs().has("max")) p.hi = c.attrs().get_float("max", 0);
    const void* y = c.has_input(2) ? c.in(2).data : nullptr;
    unary_grad(it->second, p, elem(c.in(0).dtype), c.in(0).data, c.in(1).data, y, c.out(0).data, c.out(0).numel(), c.stream);
  });
  r.add("oases", "GeluGrad", [](CudaContext& c) {
    bool t = c.attrs().get_string("approximate", "none") == "tanh";
    gelu_backward(t, elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.out(0).data, c.out(0).numel(), c.stream);
  });
  r.add("oases", "SwiGLUGrad", [](CudaContext& c) {
    void* dg = c.has_output(0) ? c.out(0).data : nullptr;
    void* du = c.has_output(1) ? c.out(1).data : nullptr;
    swiglu_backward(elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.in(2).data, dg, du, c.in(0).numel(), c.stream);
  });
  r.add("oases", "DropoutGrad", [](CudaContext& c) {
    float ratio = c.attrs().get_float("ratio", 0.5f);
    bool train = c.attrs().get_int("training_mode", 0) != 0 && (!c.k.state || c.k.state->training);
    if (!train || ratio == 0.f) {
      same_copy(c);
      return;
    }
    dropout(dropout_args(c, ratio), elem(c.in(0).dtype), c.in(0).data, c.out(0).data, nullptr, c.stream);
  });
}

}  // namespace oases::cuda
