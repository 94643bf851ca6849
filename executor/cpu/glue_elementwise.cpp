// CPU glue for elementwise ops: unary math, binary arithmetic with broadcasting, comparisons,
// logic, Where, Clip, Cast, activations, Dropout, and their backward ops (UnaryGrad, GeluGrad,
// SwiGLUGrad, DropoutGrad).
#include <cmath>
#include <limits>
#include <random>

#include "executor/cpu/common.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"

namespace oases {

using namespace oases::cpu;
namespace k = oases::kernels;
using k::parallel_range;

namespace {

template <class Op>
void add_unary_float(CpuKernelRegistry& r, const std::string& domain, const std::string& name, Op op) {
  r.add(domain, name, [op](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        k::unary(f.in[0].as<T>(), f.out[0].as<T>(), f.in[0].numel(), [&](T x) { return static_cast<T>(op(x)); });
      });
    });
  });
}

template <class Op>
void add_unary_numeric(CpuKernelRegistry& r, const std::string& name, Op op) {
  r.add("", name, [op](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        k::unary(f.in[0].as<T>(), f.out[0].as<T>(), f.in[0].numel(), [&](T x) { return static_cast<T>(op(x)); });
      });
    });
  });
}

template <class Op>
void add_binary(CpuKernelRegistry& r, const std::string& name, Op op) {
  r.add("", name, [op](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        k::binary(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, f.out[0].as<T>(), f.out[0].shape,
                  [&](T a, T b) { return static_cast<T>(op(a, b)); });
      });
    });
  });
}

template <class Op>
void add_compare(CpuKernelRegistry& r, const std::string& name, Op op) {
  r.add("", name, [op](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      if (f.in[0].dtype == DType::kBool) {
        k::binary(f.in[0].as<uint8_t>(), f.in[0].shape, f.in[1].as<uint8_t>(), f.in[1].shape, f.out[0].as<uint8_t>(), f.out[0].shape,
                  [&](uint8_t a, uint8_t b) { return static_cast<uint8_t>(op(a, b)); });
        return;
      }
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        k::binary(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, f.out[0].as<uint8_t>(), f.out[0].shape,
                  [&](T a, T b) { return static_cast<uint8_t>(op(a, b)); });
      });
    });
  });
}

// Variadic Min/Max/Sum/Mean: fold pairwise into the output.
template <class Op>
void add_variadic(CpuKernelRegistry& r, const std::string& name, Op op, bool mean) {
  r.add("", name, [op, mean](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        T* out = f.out[0].as<T>();
        const Shape& so = f.out[0].shape;
        k::broadcast_to(f.in[0].as<T>(), f.in[0].shape, out, so);
        for (size_t i = 1; i < f.in.size(); ++i) {
          k::binary(out, so, f.in[i].as<T>(), f.in[i].shape, out, so, [&](T a, T b) { return static_cast<T>(op(a, b)); });
        }
        if (mean) {
          T n = static_cast<T>(f.in.size());
          k::unary(out, out, f.out[0].numel(), [&](T x) { return static_cast<T>(x / n); });
        }
      });
    });
  });
}

template <class T>
T nan_aware_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a > b ? a : b;
}
template <class T>
T nan_aware_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a < b ? a : b;
}

}  // namespace

uint64_t dropout_key(const RunState& s, const std::string& node_name) {
  return k::dropout_key(s.seed, s.step, s.chunk, node_name);
}

void register_cpu_elementwise(CpuKernelRegistry& r) {
  add_unary_numeric(r, "Neg", [](auto x) { return -x; });
  add_unary_numeric(r, "Abs", [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_unsigned_v<T>) {
      return x;
    } else {
      return x < T(0) ? static_cast<T>(-x) : x;
    }
  });
  add_unary_numeric(r, "Sign", [](auto x) {
    using T = decltype(x);
    return static_cast<T>((T(0) < x) - (x < T(0)));
  });
  add_unary_numeric(r, "Relu", [](auto x) {
    using T = decltype(x);
    return x > T(0) ? x : T(0);
  });
  add_unary_float(r, "", "Floor", [](auto x) { return std::floor(x); });
  add_unary_float(r, "", "Ceil", [](auto x) { return std::ceil(x); });
  add_unary_float(r, "", "Round", [](auto x) { return std::nearbyint(x); });
  add_unary_float(r, "", "Reciprocal", [](auto x) { return 1 / x; });
  add_unary_float(r, "", "Sqrt", [](auto x) { return std::sqrt(x); });
  add_unary_float(r, "", "Exp", [](auto x) { return std::exp(x); });
  add_unary_float(r, "", "Log", [](auto x) { return std::log(x); });
  add_unary_float(r, "", "Erf", [](auto x) { return std::erf(x); });
  add_unary_float(r, "", "Tanh", [](auto x) { return std::tanh(x); });
  add_unary_float(r, "", "Sigmoid", [](auto x) { return k::sigmoid(x); });
  add_unary_float(r, "", "Sin", [](auto x) { return std::sin(x); });
  add_unary_float(r, "", "Cos", [](auto x) { return std::cos(x); });
  add_unary_float(r, "", "Tan", [](auto x) { return std::tan(x); });
  add_unary_float(r, "", "Asin", [](auto x) { return std::asin(x); });
  add_unary_float(r, "", "Acos", [](auto x) { return std::acos(x); });
  add_unary_float(r, "", "Atan", [](auto x) { return std::atan(x); });
  add_unary_float(r, "", "Sinh", [](auto x) { return std::sinh(x); });
  add_unary_float(r, "", "Cosh", [](auto x) { return std::cosh(x); });
  add_unary_float(r, "", "Asinh", [](auto x) { return std::asinh(x); });
  add_unary_float(r, "", "Acosh", [](auto x) { return std::acosh(x); });
  add_unary_float(r, "", "Atanh", [](auto x) { return std::atanh(x); });
  add_unary_float(r, "", "Softplus", [](auto x) {
    using T = decltype(x);
    return x > T(20) ? x : std::log1p(std::exp(x));
  });
  add_unary_float(r, "", "Softsign", [](auto x) { return x / (1 + std::abs(x)); });
  add_unary_float(r, "oases", "Silu", [](auto x) { return x * k::sigmoid(x); });
  add_unary_float(r, "", "Mish", [](auto x) {
    using T = decltype(x);
    T sp = x > T(20) ? x : std::log1p(std::exp(x));
    return x * std::tanh(sp);
  });
  add_unary_float(r, "", "HardSwish", [](auto x) {
    using T = decltype(x);
    return x * std::max(T(0), std::min(T(1), x / T(6) + T(0.5)));
  });

  // activations with attributes
  r.add("", "Gelu", [](KernelContext& c) {
    k::Activation act = c.attrs().get_string("approximate", "none") == "tanh" ? k::Activation::kGeluTanh : k::Activation::kGeluErf;
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() { k::activation<T>(act, f.in[0].as<T>(), f.out[0].as<T>(), f.in[0].numel()); });
    });
  });
  auto param_act = [&r](const std::string& name, float da, float db, auto fn) {
    r.add("", name, [da, db, fn](KernelContext& c) {
      float a = c.attrs().get_float("alpha", da);
      float b = c.attrs().get_float(c.node->op_type == "Selu" ? "gamma" : "beta", db);
      with_half_as_float(c, [&](KernelContext& f) {
        dispatch_float(f, f.in[0].dtype, [&]<class T>() {
          k::unary(f.in[0].as<T>(), f.out[0].as<T>(), f.in[0].numel(), [&](T x) { return static_cast<T>(fn(x, T(a), T(b))); });
        });
      });
    });
  };
  param_act("LeakyRelu", 0.01f, 0.f, [](auto x, auto a, auto) { return x >= 0 ? x : a * x; });
  param_act("Elu", 1.f, 0.f, [](auto x, auto a, auto) { return x >= 0 ? x : a * (std::exp(x) - 1); });
  param_act("Selu", 1.67326319217681884765625f, 1.05070102214813232421875f,
            [](auto x, auto a, auto g) { return x > 0 ? g * x : g * (a * std::exp(x) - a); });
  param_act("Celu", 1.f, 0.f, [](auto x, auto a, auto) {
    using T = decltype(x);
    return std::max(T(0), x) + std::min(T(0), a * (std::exp(x / a) - 1));
  });
  param_act("HardSigmoid", 0.2f, 0.5f, [](auto x, auto a, auto b) {
    using T = decltype(x);
    return std::max(T(0), std::min(T(1), a * x + b));
  });
  param_act("ThresholdedRelu", 1.f, 0.f, [](auto x, auto a, auto) {
    using T = decltype(x);
    return x > a ? x : T(0);
  });
  r.add("", "PRelu", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        k::binary(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, f.out[0].as<T>(), f.out[0].shape,
                  [](T x, T s) { return x < T(0) ? static_cast<T>(s * x) : x; });
      });
    });
  });
  r.add("oases", "SwiGLU", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        k::binary(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, f.out[0].as<T>(), f.out[0].shape,
                  [](T g, T u) { return g * k::sigmoid(g) * u; });
      });
    });
  });

  add_binary(r, "Add", [](auto a, auto b) { return a + b; });
  add_binary(r, "Sub", [](auto a, auto b) { return a - b; });
  add_binary(r, "Mul", [](auto a, auto b) { return a * b; });
  add_binary(r, "Div", [](auto a, auto b) { return k::int_div(a, b); });
  r.add("", "Mod", [](KernelContext& c) {
    bool fmod = c.attrs().get_int("fmod", 0) != 0;
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        k::binary(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, f.out[0].as<T>(), f.out[0].shape,
                  [&](T a, T b) { return k::onnx_mod(a, b, fmod); });
      });
    });
  });
  r.add("", "Pow", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        dispatch_numeric(f, f.in[1].dtype, [&]<class U>() {
          k::binary_mixed(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<U>(), f.in[1].shape, f.out[0].as<T>(), f.out[0].shape, [](T a, U b) {
            if constexpr (std::is_floating_point_v<T>) {
              if (static_cast<double>(b) == 2.0) return static_cast<T>(a * a);
            }
            return static_cast<T>(std::pow(static_cast<double>(a), static_cast<double>(b)));
          });
        });
      });
    });
  });
  add_variadic(
      r, "Max", [](auto a, auto b) { return nan_aware_max(a, b); }, false);
  add_variadic(
      r, "Min", [](auto a, auto b) { return nan_aware_min(a, b); }, false);
  add_variadic(
      r, "Sum", [](auto a, auto b) { return a + b; }, false);
  add_variadic(
      r, "Mean", [](auto a, auto b) { return a + b; }, true);

  add_compare(r, "Equal", [](auto a, auto b) { return a == b; });
  add_compare(r, "Less", [](auto a, auto b) { return a < b; });
  add_compare(r, "Greater", [](auto a, auto b) { return a > b; });
  add_compare(r, "LessOrEqual", [](auto a, auto b) { return a <= b; });
  add_compare(r, "GreaterOrEqual", [](auto a, auto b) { return a >= b; });
  add_compare(r, "And", [](auto a, auto b) { return a && b; });
  add_compare(r, "Or", [](auto a, auto b) { return a || b; });
  add_compare(r, "Xor", [](auto a, auto b) { return (a != 0) != (b != 0); });
  r.add("", "Not", [](KernelContext& c) {
    k::unary(c.in[0].as<uint8_t>(), c.out[0].as<uint8_t>(), c.in[0].numel(), [](uint8_t x) { return static_cast<uint8_t>(!x); });
  });
  r.add("", "IsNaN", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        k::unary(f.in[0].as<T>(), f.out[0].as<uint8_t>(), f.in[0].numel(), [](T x) { return static_cast<uint8_t>(std::isnan(x)); });
      });
    });
  });
  r.add("", "IsInf", [](KernelContext& c) {
    bool pos = c.attrs().get_int("detect_positive", 1) != 0, neg = c.attrs().get_int("detect_negative", 1) != 0;
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        k::unary(f.in[0].as<T>(), f.out[0].as<uint8_t>(), f.in[0].numel(),
                 [&](T x) { return static_cast<uint8_t>(std::isinf(x) && ((x > 0 && pos) || (x < 0 && neg))); });
      });
    });
  });
  r.add("", "Where", [](KernelContext& c) {
    size_t es = dtype_size(c.in[1].dtype);
    auto run = [&]<class T>() {
      k::ternary(c.in[0].as<uint8_t>(), c.in[0].shape, c.in[1].as<T>(), c.in[1].shape, c.in[2].as<T>(), c.in[2].shape, c.out[0].as<T>(),
                 c.out[0].shape, [](uint8_t m, T a, T b) { return m ? a : b; });
    };
    switch (es) {
      case 1: run.template operator()<uint8_t>(); break;
      case 2: run.template operator()<uint16_t>(); break;
      case 4: run.template operator()<uint32_t>(); break;
      default: run.template operator()<uint64_t>(); break;
    }
  });
  r.add("", "Clip", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
        if (f.attrs().has("min")) lo = static_cast<T>(f.attrs().get_float("min", 0));
        if (f.attrs().has("max")) hi = static_cast<T>(f.attrs().get_float("max", 0));
        if (f.has_input(1)) lo = *f.in[1].as<T>();
        if (f.has_input(2)) hi = *f.in[2].as<T>();
        k::unary(f.in[0].as<T>(), f.out[0].as<T>(), f.in[0].numel(), [&](T x) { return x < lo ? lo : (x > hi ? hi : x); });
      });
    });
  });
  r.add("", "Cast", [](KernelContext& c) {
    const TensorView &x = c.in[0], &y = c.out[0];
    int64_t n = x.numel();
    if (x.dtype == y.dtype) {
      std::memcpy(y.data, x.data, x.nbytes());
      return;
    }
    if (x.dtype == DType::kF32 && (y.dtype == DType::kF16 || y.dtype == DType::kBF16)) {
      bool bf = y.dtype == DType::kBF16;
      k::unary(x.as<float>(), y.as<uint16_t>(), n, [bf](float v) { return bf ? float_to_bfloat16(v) : float_to_half(v); });
      return;
    }
    if (y.dtype == DType::kF32 && (x.dtype == DType::kF16 || x.dtype == DType::kBF16)) {
      bool bf = x.dtype == DType::kBF16;
      k::unary(x.as<uint16_t>(), y.as<float>(), n, [bf](uint16_t v) { return bf ? bfloat16_to_float(v) : half_to_float(v); });
      return;
    }
    if (x.dtype == DType::kI64 && y.dtype == DType::kI32) {
      k::unary(x.as<int64_t>(), y.as<int32_t>(), n, [](int64_t v) { return static_cast<int32_t>(v); });
      return;
    }
    if (x.dtype == DType::kI32 && y.dtype == DType::kI64) {
      k::unary(x.as<int32_t>(), y.as<int64_t>(), n, [](int32_t v) { return static_cast<int64_t>(v); });
      return;
    }
    if ((x.dtype == DType::kI64 || x.dtype == DType::kU64) && (y.dtype == DType::kI64 || y.dtype == DType::kU64)) {
      std::memcpy(y.data, x.data, x.nbytes());
      return;
    }
    if (is_floating(x.dtype) && y.dtype == DType::kBool) {
      for (int64_t i = 0; i < n; ++i) y.as<uint8_t>()[i] = load_as_double(x.data, x.dtype, i) != 0.0;
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      double v = load_as_double(x.data, x.dtype, i);
      if (is_integer(y.dtype) && is_floating(x.dtype)) {
        if (std::isnan(v)) v = 0;
        v = std::trunc(v);
      }
      store_from_double(y.data, y.dtype, i, v);
    }
  });
  r.add("", "Identity", [](KernelContext& c) {
    if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
  });
  r.add("", "Dropout", [](KernelContext& c) {
    float ratio = c.has_input(1) ? static_cast<float>(load_as_double(c.in[1].data, c.in[1].dtype, 0)) : c.attrs().get_float("ratio", 0.5f);
    if (ratio < 0.f || ratio >= 1.f) c.fail("ratio {} is outside [0, 1)", ratio);
    bool train_mode = c.has_input(2) ? *c.in[2].as<uint8_t>() != 0 : c.attrs().get_int("training_mode", 0) != 0;
    // active only when the model asks for training mode and the run is a training run
    bool train = train_mode && (!c.state || c.state->training);
    int64_t n = c.in[0].numel();
    uint8_t* mask = c.out.size() > 1 && c.out[1].data ? c.out[1].as<uint8_t>() : nullptr;
    if (!train || ratio == 0.f) {
      if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
      if (mask) std::memset(mask, 1, static_cast<size_t>(n));
      return;
    }
    if (c.in[0].dtype != DType::kF32) c.fail("training-mode dropout supports float32 only");
    apply_dropout(c, c.in[0].as<float>(), c.out[0].as<float>(), mask, ratio);
  });

  // backward
  r.add("oases", "UnaryGrad", [](KernelContext& c) {
    k::UnaryOp op;
    std::string name = c.attrs().get_string("op", "");
    if (!k::unary_op_from_name(name, &op)) c.fail("unknown op '{}'", name);
    k::UnaryParams p;
    p.alpha = c.attrs().get_float(
        "alpha", name == "LeakyRelu" ? 0.01f : (name == "Selu" ? 1.67326319217681884765625f : (name == "HardSigmoid" ? 0.2f : 1.f)));
    p.beta = c.attrs().get_float("beta", 0.5f);
    p.gamma = c.attrs().get_float("gamma", 1.05070102214813232421875f);
    if (c.attrs().has("min")) p.lo = c.attrs().get_float("min", 0);
    if (c.attrs().has("max")) p.hi = c.attrs().get_float("max", 0);
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      const T* y = c.has_input(2) ? c.in[2].as<T>() : nullptr;
      k::unary_grad<T>(op, p, c.in[0].as<T>(), c.in[1].as<T>(), y, c.out[0].as<T>(), c.out[0].numel());
    });
  });
  r.add("oases", "GeluGrad", [](KernelContext& c) {
    k::Activation act = c.attrs().get_string("approximate", "none") == "tanh" ? k::Activation::kGeluTanh : k::Activation::kGeluErf;
    dispatch_float(c, c.in[0].dtype,
                   [&]<class T>() { k::activation_grad<T>(act, c.in[0].as<T>(), c.in[1].as<T>(), c.out[0].as<T>(), c.out[0].numel()); });
  });
  r.add("oases", "SwiGLUGrad", [](KernelContext& c) {
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      T* dg = c.out[0].data ? c.out[0].as<T>() : nullptr;
      T* du = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      k::swiglu_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), c.in[2].as<T>(), dg, du, c.in[0].numel());
    });
  });
  r.add("oases", "DropoutGrad", [](KernelContext& c) {
    float ratio = c.attrs().get_float("ratio", 0.5f);
    bool train = c.attrs().get_int("training_mode", 0) != 0 && (!c.state || c.state->training);
    if (!train || ratio == 0.f) {
      if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
      return;
    }
    if (c.in[0].dtype != DType::kF32) c.fail("training-mode dropout supports float32 only");
    apply_dropout(c, c.in[0].as<float>(), c.out[0].as<float>(), nullptr, ratio);
  });
}

}  // namespace oases
