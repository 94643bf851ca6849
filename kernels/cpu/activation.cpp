#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which threads cost more than they give

template <class T>
T act_scalar(Activation a, T x) {
  switch (a) {
    case Activation::kGeluTanh: {
      const T c = T(0.7978845608028654);
      return T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
    }
    case Activation::kGeluErf: return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476)));
    case Activation::kRelu: return x > T(0) ? x : T(0);
    default: return x;
  }
}

template <class T>
T act_grad_scalar(Activation a, T v) {
  switch (a) {
    case Activation::kGeluTanh: {
      const T c = T(0.7978845608028654), k = T(0.044715);
      T t = std::tanh(c * (v + k * v * v * v));
      return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * c * (T(1) + T(3) * k * v * v);
    }
    case Activation::kGeluErf: {
      T cdf = T(0.5) * (T(1) + std::erf(v * T(0.7071067811865476)));
      return cdf + v * T(0.3989422804014327) * std::exp(T(-0.5) * v * v);
    }
    case Activation::kRelu: return v > T(0) ? T(1) : T(0);
    default: return T(1);
  }
}

// y = act(x) on a contiguous run (float: vectorised twins, identical wherever the run starts)
void act_run(Activation a, const float* x, float* y, int64_t n) {
  switch (a) {
    case Activation::kGeluTanh:
      vec::map(
          x, y, n, [](auto v) { return vec::gelu_tanh8(v); }, vec::gelu_tanh1);
      break;
    case Activation::kGeluErf:
      vec::map(
          x, y, n, [](auto v) { return vec::gelu_erf8(v); }, vec::gelu_erf1);
      break;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
      break;
    default:
      if (x != y) std::copy(x, x + n, y);
  }
}
void act_run(Activation a, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = act_scalar(a, x[i]);
}

void act_grad_run(Activation a, const float* dy, const float* x, float* dx, int64_t n) {
  int64_t i = 0;
#ifdef OASES_VEC_AVX2
  if (a == Activation::kGeluTanh || a == Activation::kGeluErf) {
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      __m256 d = a == Activation::kGeluTanh ? vec::gelu_tanh_grad8(v) : vec::gelu_erf_grad8(v);
      _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), d));
    }
  }
#endif
  for (; i < n; ++i) {
    float d = a == Activation::kGeluTanh  ? vec::gelu_tanh_grad1(x[i])
              : a == Activation::kGeluErf ? vec::gelu_erf_grad1(x[i])
                                          : act_grad_scalar(a, x[i]);
    dx[i] = dy[i] * d;
  }
}
void act_grad_run(Activation a, const double* dy, const double* x, double* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * act_grad_scalar(a, x[i]);
}

}  // namespace

bool activation_from_op(const std::string& op_type, const std::string& approximate, Activation* a) {
  if (op_type == "Gelu") {
    *a = approximate == "tanh" ? Activation::kGeluTanh : Activation::kGeluErf;
    return true;
  }
  if (op_type == "Relu") {
    *a = Activation::kRelu;
    return true;
  }
  return false;
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kGeluErf: return "gelu";
    case Activation::kRelu: return "relu";
    default: return "none";
  }
}

template <class T>
void activation(Activation a, const T* x, T* y, int64_t n) {
  constexpr int64_t kBlock = 4096;  // multiple of 8: block boundaries do not change results
  int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_range(blocks, std::max<int64_t>(1, kParallelMin / kBlock), [&](int64_t b_begin, int64_t b_end) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      int64_t s = b * kBlock;
      act_run(a, x + s, y + s, std::min(kBlock, n - s));
    }
  });
}

template <class T>
void bias_activation(T* c, int64_t rows, int64_t cols, int64_t ldc, const T* bias, Activation a, const T* residual, int64_t ldr) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = c + r * ldc;
    if (bias) {
      for (int64_t j = 0; j < cols; ++j) row[j] += bias[j];
    }
    if (residual) {
      const T* res = residual + r * ldr;
      for (int64_t j = 0; j < cols; ++j) row[j] += res[j];
    }
    if (a != Activation::kNone) act_run(a, row, row, cols);
  }
}

template <class T>
void activation_grad(Activation a, const T* dy, const T* x, T* dx, int64_t n) {
  constexpr int64_t kBlock = 4096;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_range(blocks, std::max<int64_t>(1, kParallelMin / kBlock), [&](int64_t b_begin, int64_t b_end) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      int64_t s = b * kBlock;
      act_grad_run(a, dy + s, x + s, dx + s, std::min(kBlock, n - s));
    }
  });
}

bool unary_op_from_name(const std::string& name, UnaryOp* op) {
  static const std::map<std::string, UnaryOp> m = {{"Exp", UnaryOp::kExp},
                                                   {"Log", UnaryOp::kLog},
                                                   {"Sqrt", UnaryOp::kSqrt},
                                                   {"Reciprocal", UnaryOp::kReciprocal},
                                                   {"Tanh", UnaryOp::kTanh},
                                                   {"Sigmoid", UnaryOp::kSigmoid},
                                                   {"Relu", UnaryOp::kRelu},
                                                   {"Erf", UnaryOp::kErf},
                                                   {"Sin", UnaryOp::kSin},
                                                   {"Cos", UnaryOp::kCos},
                                                   {"Abs", UnaryOp::kAbs},
                                                   {"Softplus", UnaryOp::kSoftplus},
                                                   {"Softsign", UnaryOp::kSoftsign},
                                                   {"Silu", UnaryOp::kSilu},
                                                   {"Clip", UnaryOp::kClip},
                                                   {"LeakyRelu", UnaryOp::kLeakyRelu},
                                                   {"Elu", UnaryOp::kElu},
                                                   {"Selu", UnaryOp::kSelu},
                                                   {"Celu", UnaryOp::kCelu},
                                                   {"HardSigmoid", UnaryOp::kHardSigmoid},
                                                   {"HardSwish", UnaryOp::kHardSwish},
                                                   {"Mish", UnaryOp::kMish},
                                                   {"ThresholdedRelu", UnaryOp::kThresholdedRelu}};
  auto it = m.find(name);
  if (it == m.end()) return false;
  *op = it->second;
  return true;
}

template <class T>
void unary_grad(UnaryOp op, const UnaryParams& p, const T* dy, const T* x, const T* y, T* dx, int64_t n) {
  const T a = static_cast<T>(p.alpha), b = static_cast<T>(p.beta), g = static_cast<T>(p.gamma);
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      T xi = x[i], d = dy[i], r;
      switch (op) {
        case UnaryOp::kExp: r = d * y[i]; break;
        case UnaryOp::kLog: r = d / xi; break;
        case UnaryOp::kSqrt: r = d * T(0.5) / y[i]; break;
        case UnaryOp::kReciprocal: r = -d * y[i] * y[i]; break;
        case UnaryOp::kTanh: r = d * (T(1) - y[i] * y[i]); break;
        case UnaryOp::kSigmoid: r = d * y[i] * (T(1) - y[i]); break;
        case UnaryOp::kRelu: r = xi > T(0) ? d : T(0); break;
        case UnaryOp::kErf: r = d * T(1.1283791670955126) * std::exp(-xi * xi); break;
        case UnaryOp::kSin: r = d * std::cos(xi); break;
        case UnaryOp::kCos: r = -d * std::sin(xi); break;
        case UnaryOp::kAbs: r = xi > T(0) ? d : (xi < T(0) ? -d : T(0)); break;
        case UnaryOp::kSoftplus: r = d * sigmoid(xi); break;
        case UnaryOp::kSoftsign: {
          T den = T(1) + std::abs(xi);
          r = d / (den * den);
          break;
        }
        case UnaryOp::kSilu: {
          T s = sigmoid(xi);
          r = d * s * (T(1) + xi * (T(1) - s));
          break;
        }
        case UnaryOp::kClip: r = (xi >= static_cast<T>(p.lo) && xi <= static_cast<T>(p.hi)) ? d : T(0); break;
        case UnaryOp::kLeakyRelu: r = xi >= T(0) ? d : a * d; break;
        case UnaryOp::kElu: r = xi >= T(0) ? d : d * a * std::exp(xi); break;
        case UnaryOp::kSelu: r = xi > T(0) ? d * g : d * g * a * std::exp(xi); break;
        case UnaryOp::kCelu: r = xi > T(0) ? d : d * std::exp(xi / a); break;
        case UnaryOp::kHardSigmoid: {
          T v = a * xi + b;
          r = (v > T(0) && v < T(1)) ? d * a : T(0);
          break;
        }
        case UnaryOp::kHardSwish: r = xi < T(-3) ? T(0) : (xi > T(3) ? d : d * (xi / T(3) + T(0.5))); break;
        case UnaryOp::kMish: {
          T sp = xi > T(20) ? xi : std::log1p(std::exp(xi));
          T t = std::tanh(sp);
          r = d * (t + xi * (T(1) - t * t) * sigmoid(xi));
          break;
        }
        case UnaryOp::kThresholdedRelu: r = xi > a ? d : T(0); break;
        default: r = T(0);
      }
      dx[i] = r;
    }
  });
}

template <class T>
void swiglu_grad(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      T g = gate[i], s = sigmoid(g), silu = g * s;
      if (dgate) dgate[i] = dy[i] * up[i] * s * (T(1) + g * (T(1) - s));
      if (dup) dup[i] = dy[i] * silu;
    }
  });
}

template void activation<float>(Activation, const float*, float*, int64_t);
template void activation<double>(Activation, const double*, double*, int64_t);
template void bias_activation<float>(float*, int64_t, int64_t, int64_t, const float*, Activation, const float*, int64_t);
template void bias_activation<double>(double*, int64_t, int64_t, int64_t, const double*, Activation, const double*, int64_t);
template void activation_grad<float>(Activation, const float*, const float*, float*, int64_t);
template void activation_grad<double>(Activation, const double*, const double*, double*, int64_t);
template void unary_grad<float>(UnaryOp, const UnaryParams&, const float*, const float*, const float*, float*, int64_t);
template void unary_grad<double>(UnaryOp, const UnaryParams&, const double*, const double*, const double*, double*, int64_t);
template void swiglu_grad<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void swiglu_grad<double>(const double*, const double*, const double*, double*, double*, int64_t);

}  // namespace oases::kernels
