// Backward kernels. Activation gradients are written (=), never accumulated; the caller sums
// fan-out contributions in the graph.
//   unary_grad:     dx = dy · f'(x) for the named op, from x and/or y = f(x)
//   (GELU's gradient is activation_grad in kernels/cpu/activation.h)
//   swiglu_grad:    y = silu(g)·u → dg = dy·u·silu'(g), du = dy·silu(g)
//   softmax_grad:   dx = y ∘ (dy − Σ dy∘y)   ; log form: dx = dy − exp(y) Σ dy
//   layernorm_grad: x̂ = (x−μ)·r, g = dy∘γ: dx = r·(g − mean(g) − x̂·mean(g∘x̂)), dγ = Σ dy∘x̂, dβ = Σ dy
//   rmsnorm_grad:   x̂ = x·r, g = dy∘γ: dx = r·(g − x̂·mean(g∘x̂)), dγ = Σ dy∘x̂
#pragma once

#include <cstdint>
#include <string>

namespace oases::kernels {

enum class UnaryOp {
  kExp,
  kLog,
  kSqrt,
  kReciprocal,
  kTanh,
  kSigmoid,
  kRelu,
  kErf,
  kSin,
  kCos,
  kAbs,
  kSoftplus,
  kSoftsign,
  kSilu,
  kClip,
  kLeakyRelu,
  kElu,
  kSelu,
  kCelu,
  kHardSigmoid,
  kHardSwish,
  kMish,
  kThresholdedRelu
};
// false when the name is unknown
bool unary_op_from_name(const std::string& name, UnaryOp* op);

struct UnaryParams {
  float alpha = 0.f, beta = 0.f, gamma = 0.f;
  float lo = -3.4e38f, hi = 3.4e38f;  // Clip bounds
};

template <class T>
void unary_grad(UnaryOp op, const UnaryParams& p, const T* dy, const T* x, const T* y, T* dx, int64_t n);
template <class T>
void swiglu_grad(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n);
template <class T>
void softmax_grad(const T* dy, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner, bool log);
template <class T>
void layernorm_grad(const T* dy, const T* x, const T* scale, const float* mean, const float* rstd, T* dx, T* dscale, T* dbias, int64_t rows,
                    int64_t n);
template <class T>
void rmsnorm_grad(const T* dy, const T* x, const T* scale, const float* rstd, T* dx, T* dscale, int64_t rows, int64_t n);

// Softmax cross-entropy backward over scores [N, C, D] with labels [N, D]; `dloss` is the scalar
// (reduction mean/sum) or per-sample ([N, D], reduction none) gradient.
template <class T>
void softmax_cross_entropy_grad(const T* dloss, bool per_sample, const T* scores, const int64_t* labels, const T* weights, int64_t n,
                                int64_t c, int64_t d, int64_t ignore_index, double denom, T* dscores);

}  // namespace oases::kernels
