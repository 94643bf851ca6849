// Activation launchers, forward and backward side by side (math in activations.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/random.h"

namespace oases::cuda {

// GELU (erf or tanh form): y = x·Φ(x); dx = dy·(Φ(x) + x·φ(x)).
void gelu_forward(bool tanh_form, Elem t, const void* x, void* y, int64_t n, cudaStream_t s);
void gelu_backward(bool tanh_form, Elem t, const void* dy, const void* x, void* dx, int64_t n, cudaStream_t s);

// The epilogue of a fused product (FusedMatMul) where cuBLASLt does not apply it: y [rows, cols]
// becomes act(y + bias + residual) (bias [cols] and residual [rows, cols] may be null), in fp32.
enum class EpilogueAct : int { kNone, kRelu, kGeluErf, kGeluTanh };
void bias_activation(Elem t, void* y, int64_t rows, int64_t cols, const void* bias, EpilogueAct act, const void* residual, cudaStream_t s);

// SwiGLU on same-shaped gate g and up u: y = silu(g)·u; dg = dy·u·σ(g)(1 + g(1 − σ(g))), du = dy·silu(g).
// dg or du may be null.
void swiglu_forward(Elem t, const void* g, const void* u, void* y, int64_t n, cudaStream_t s);
void swiglu_backward(Elem t, const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, cudaStream_t s);

// dx = dy·f'(x) for the UnaryGrad op (from x and/or y = f(x)); the op order is kernels/cpu/activation.h's.
enum class UnaryGradOp : int {
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
struct UnaryGradArgs {
  float alpha = 0.f, beta = 0.f, gamma = 0.f, lo = -3.4e38f, hi = 3.4e38f;
};
void unary_grad(UnaryGradOp op, const UnaryGradArgs& a, Elem t, const void* dy, const void* x, const void* y, void* dx, int64_t n,
                cudaStream_t s);

// Training-mode dropout on fp32/fp16/bf16: y = keep ? x·scale : 0 (mask may be null). The backward
// pass is the same call on dy with the same key: the mask is recomputed, never stored.
void dropout(const DropoutArgs& a, Elem t, const void* x, void* y, uint8_t* mask, cudaStream_t s);

}  // namespace oases::cuda
