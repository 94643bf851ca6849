// Activations, forward and backward side by side; fp32 math on every storage type.
//
//   GELU (erf)   y = x·Φ(x),  Φ(x) = ½(1 + erf(x/√2))        dx = dy·(Φ(x) + x·φ(x)),  φ(x) = e^{−x²/2}/√(2π)
//   GELU (tanh)  y = ½x(1 + tanh u),  u = c(x + k x³)        dx = dy·(½(1 + t) + ½x(1 − t²)·c(1 + 3k x²)),  t = tanh u
//                c = √(2/π), k = 0.044715
//   SwiGLU       y = silu(g)·u,  silu(g) = g·σ(g)           dg = dy·u·σ(g)(1 + g(1 − σ(g))),  du = dy·silu(g)
//   UnaryGrad    dx = dy·f'(x) per op (kernels/cpu/activation.cpp lists the same formulas)
//   Dropout      y = keep ? x/(1 − p) : 0                    dx = keep ? dy/(1 − p) : 0 (same counter-based mask)
//
// Activation gradients are written (=), never accumulated.
#include <initializer_list>

#include "kernels/cuda/activations.h"
#include "kernels/cuda/common.cuh"

namespace oases::cuda {

namespace {

__device__ __forceinline__ float sigm(float x) {
  return x >= 0.f ? 1.f / (1.f + expf(-x)) : expf(x) / (1.f + expf(x));
}

__device__ __forceinline__ float gelu_value(bool tanh_form, float v) {
  return tanh_form ? 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                   : 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

// dGELU/dx at v
__device__ __forceinline__ float gelu_slope(bool tanh_form, float v) {
  if (tanh_form && (v < -10.f || v > 10.f)) return v < 0.f ? 0.f : 1.f;  // the float limits; v·(1 − t²)·(1 + 3k v²) is 0·inf = NaN for |v| > 1.8e19
  if (tanh_form) {
    const float c = 0.7978845608028654f, k = 0.044715f;
    float t = tanhf(c * (v + k * v * v * v));
    return 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * c * (1.f + 3.f * k * v * v);
  }
  float cdf = 0.5f * (1.f + erff(v * 0.7071067811865476f));
  float pdf = 0.3989422804014327f * expf(-0.5f * v * v);
  return cdf + v * pdf;
}

// The first nv·V elements with 16-byte loads and stores (V elements a thread; nv = 0 where a
// pointer is not 16-byte aligned), the rest one element a thread. The activations are
// memory-bound: the wide accesses are most of their speed.
template <class T>
__global__ void gelu_fwd_kernel(bool tanh_form, const T* x, T* y, int64_t n, int64_t nv) {
  constexpr int V = 16 / sizeof(T);
  OASES_GRID_STRIDE(i, nv) {
    uint4 a = reinterpret_cast<const uint4*>(x)[i], r;
    const T* as = reinterpret_cast<const T*>(&a);
    T* rs = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int j = 0; j < V; ++j) rs[j] = from_float<T>(gelu_value(tanh_form, to_float(as[j])));
    reinterpret_cast<uint4*>(y)[i] = r;
  }
  for (int64_t i = nv * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(gelu_value(tanh_form, to_float(x[i])));
}

template <class T>
__global__ void bias_act_kernel(T* y, int64_t rows, int64_t cols, const T* bias, int act, const T* res) {
  const int64_t n = rows * cols;
  OASES_GRID_STRIDE(i, n) {
    float v = to_float(y[i]);
    if (bias) v += to_float(bias[i % cols]);
    if (res) v += to_float(res[i]);
    if (act == static_cast<int>(EpilogueAct::kRelu)) {
      v = v > 0.f ? v : 0.f;
    } else if (act == static_cast<int>(EpilogueAct::kGeluErf) || act == static_cast<int>(EpilogueAct::kGeluTanh)) {
      v = gelu_value(act == static_cast<int>(EpilogueAct::kGeluTanh), v);
    }
    y[i] = from_float<T>(v);
  }
}

template <class T>
__global__ void gelu_bwd_kernel(bool tanh_form, const T* dy, const T* x, T* dx, int64_t n, int64_t nv) {
  constexpr int V = 16 / sizeof(T);
  OASES_GRID_STRIDE(i, nv) {
    uint4 a = reinterpret_cast<const uint4*>(x)[i], g = reinterpret_cast<const uint4*>(dy)[i], r;
    const T* as = reinterpret_cast<const T*>(&a);
    const T* gs = reinterpret_cast<const T*>(&g);
    T* rs = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int j = 0; j < V; ++j) rs[j] = from_float<T>(to_float(gs[j]) * gelu_slope(tanh_form, to_float(as[j])));
    reinterpret_cast<uint4*>(dx)[i] = r;
  }
  for (int64_t i = nv * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[i] = from_float<T>(to_float(dy[i]) * gelu_slope(tanh_form, to_float(x[i])));
}

template <class T>
__global__ void swiglu_fwd_kernel(const T* g, const T* u, T* y, int64_t n) {
  OASES_GRID_STRIDE(i, n) {
    float gv = to_float(g[i]);
    y[i] = from_float<T>(gv * sigm(gv) * to_float(u[i]));
  }
}

template <class T>
__global__ void swiglu_bwd_kernel(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  OASES_GRID_STRIDE(i, n) {
    float gv = to_float(g[i]), s = sigm(gv), d = to_float(dy[i]);
    if (dg) dg[i] = from_float<T>(d * to_float(u[i]) * s * (1.f + gv * (1.f - s)));
    if (du) du[i] = from_float<T>(d * gv * s);
  }
}

template <class T>
__global__ void unary_grad_kernel(UnaryGradOp op, UnaryGradArgs p, const T* dy, const T* x, const T* y, T* dx, int64_t n) {
  const float a = p.alpha, b = p.beta, g = p.gamma;
  OASES_GRID_STRIDE(i, n) {
    float xi = to_float(x[i]), d = to_float(dy[i]), yi = y ? to_float(y[i]) : 0.f, r = 0.f;
    switch (op) {
      case UnaryGradOp::kExp: r = d * yi; break;
      case UnaryGradOp::kLog: r = d / xi; break;
      case UnaryGradOp::kSqrt: r = d * 0.5f / yi; break;
      case UnaryGradOp::kReciprocal: r = -d * yi * yi; break;
      case UnaryGradOp::kTanh: r = d * (1.f - yi * yi); break;
      case UnaryGradOp::kSigmoid: r = d * yi * (1.f - yi); break;
      case UnaryGradOp::kRelu: r = xi > 0.f ? d : 0.f; break;
      case UnaryGradOp::kErf: r = d * 1.1283791670955126f * expf(-xi * xi); break;
      case UnaryGradOp::kSin: r = d * cosf(xi); break;
      case UnaryGradOp::kCos: r = -d * sinf(xi); break;
      case UnaryGradOp::kAbs: r = xi > 0.f ? d : (xi < 0.f ? -d : 0.f); break;
      case UnaryGradOp::kSoftplus: r = d * sigm(xi); break;
      case UnaryGradOp::kSoftsign: {
        float den = 1.f + fabsf(xi);
        r = d / (den * den);
        break;
      }
      case UnaryGradOp::kSilu: {
        float s = sigm(xi);
        r = d * s * (1.f + xi * (1.f - s));
        break;
      }
      case UnaryGradOp::kClip: r = (xi >= p.lo && xi <= p.hi) ? d : 0.f; break;
      case UnaryGradOp::kLeakyRelu: r = xi >= 0.f ? d : a * d; break;
      case UnaryGradOp::kElu: r = xi >= 0.f ? d : d * a * expf(xi); break;
      case UnaryGradOp::kSelu: r = xi > 0.f ? d * g : d * g * a * expf(xi); break;
      case UnaryGradOp::kCelu: r = xi > 0.f ? d : d * expf(xi / a); break;
      case UnaryGradOp::kHardSigmoid: {
        float v = a * xi + b;
        r = (v > 0.f && v < 1.f) ? d * a : 0.f;
        break;
      }
      case UnaryGradOp::kHardSwish: r = xi < -3.f ? 0.f : (xi > 3.f ? d : d * (xi / 3.f + 0.5f)); break;
      case UnaryGradOp::kMish: {
        float sp = xi > 20.f ? xi : log1pf(expf(xi));
        float t = tanhf(sp);
        r = d * (t + xi * (1.f - t * t) * sigm(xi));
        break;
      }
      case UnaryGradOp::kThresholdedRelu: r = xi > a ? d : 0.f; break;
    }
    dx[i] = from_float<T>(r);
  }
}

template <class T>
__global__ void dropout_kernel(DropoutArgs a, const T* x, T* y, uint8_t* mask) {
  OASES_GRID_STRIDE(i, a.local.numel) {
    bool keep = dropout_keep(a, i);
    y[i] = from_float<T>(keep ? to_float(x[i]) * a.scale : 0.f);
    if (mask) mask[i] = keep;
  }
}

// Elements of type T taken 16 bytes at a time by the activation kernels (0: every pointer must be
// aligned for any) and the grid for them and the rest.
template <class T>
int64_t wide_packs(int64_t n, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (!aligned16(p)) return 0;
  }
  return n / static_cast<int64_t>(16 / sizeof(T));
}
unsigned wide_grid(int64_t n, int64_t nv) {
  return grid_for(nv > 0 ? nv : n, kThreads);  // the tail (fewer than V elements) goes to the first threads
}

}  // namespace

void gelu_forward(bool tanh_form, Elem t, const void* x, void* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_floating("Gelu", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t nv = wide_packs<T>(n, {x, y});
    gelu_fwd_kernel<T><<<wide_grid(n, nv), kThreads, 0, s>>>(tanh_form, static_cast<const T*>(x), static_cast<T*>(y), n, nv);
  });
  OASES_CUDA_CHECK_LAUNCH("gelu_fwd_kernel");
}

void bias_activation(Elem t, void* y, int64_t rows, int64_t cols, const void* bias, EpilogueAct act, const void* residual, cudaStream_t s) {
  int64_t n = rows * cols;
  if (n <= 0) return;
  dispatch_floating("bias_activation", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_act_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(y), rows, cols, static_cast<const T*>(bias),
                                                                  static_cast<int>(act), static_cast<const T*>(residual));
  });
  OASES_CUDA_CHECK_LAUNCH("bias_act_kernel");
}

void gelu_backward(bool tanh_form, Elem t, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_floating("GeluGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t nv = wide_packs<T>(n, {dy, x, dx});
    gelu_bwd_kernel<T><<<wide_grid(n, nv), kThreads, 0, s>>>(tanh_form, static_cast<const T*>(dy), static_cast<const T*>(x),
                                                             static_cast<T*>(dx), n, nv);
  });
  OASES_CUDA_CHECK_LAUNCH("gelu_bwd_kernel");
}

void swiglu_forward(Elem t, const void* g, const void* u, void* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_floating("SwiGLU", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_fwd_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(y), n);
  });
  OASES_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

void swiglu_backward(Elem t, const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_floating("SwiGLUGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_bwd_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<const T*>(g),
                                                                    static_cast<const T*>(u), static_cast<T*>(dg), static_cast<T*>(du), n);
  });
  OASES_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

void unary_grad(UnaryGradOp op, const UnaryGradArgs& a, Elem t, const void* dy, const void* x, const void* y, void* dx, int64_t n,
                cudaStream_t s) {
  if (n <= 0) return;
  dispatch_floating("UnaryGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_grad_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(op, a, static_cast<const T*>(dy), static_cast<const T*>(x),
                                                                    static_cast<const T*>(y), static_cast<T*>(dx), n);
  });
  OASES_CUDA_CHECK_LAUNCH("unary_grad_kernel");
}

void dropout(const DropoutArgs& a, Elem t, const void* x, void* y, uint8_t* mask, cudaStream_t s) {
  if (a.local.numel <= 0) return;
  dispatch_floating("Dropout", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dropout_kernel<T><<<grid_for(a.local.numel, kThreads), kThreads, 0, s>>>(a, static_cast<const T*>(x), static_cast<T*>(y), mask);
  });
  OASES_CUDA_CHECK_LAUNCH("dropout_kernel");
}

}  // namespace oases::cuda
