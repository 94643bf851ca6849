// Activations applied on their own or as the epilogue of a matrix product, vectorised for float
// (kernels/cpu/vec_math.h) and parallel over OpenMP threads; double runs the plain formulas.
//   act(x):  none | gelu_tanh 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) | gelu_erf 0.5·x·(1 + erf(x/√2)) | relu
//   bias_activation: rows of C [rows, cols] (row stride ldc) become act(C + bias) (bias [cols] or null)
//   activation_grad: dx = dy · act'(x)
//   unary_grad:      dx = dy · f'(x) for the named pointwise op (elementwise math and activations),
//                    from x and/or y = f(x)
//   swiglu_grad:     y = silu(g)·u → dg = dy·u·silu'(g), du = dy·silu(g)
// Gradients are written (=), never accumulated; the graph sums fan-out contributions.
#pragma once

#include <cstdint>
#include <string>

namespace oases::kernels {

enum class Activation { kNone, kGeluTanh, kGeluErf, kRelu };

// "Gelu" + approximate attribute, "Relu"; false for anything else.
bool activation_from_op(const std::string& op_type, const std::string& approximate, Activation* a);
const char* activation_name(Activation a);

template <class T>
void activation(Activation a, const T* x, T* y, int64_t n);

// Runs on the calling thread (it is the per-block epilogue of gemm); `bias` points at column 0
// of the block. With a residual (row stride ldr, same block): C = (C + bias) + residual, no
// activation.
template <class T>
void bias_activation(T* c, int64_t rows, int64_t cols, int64_t ldc, const T* bias, Activation a, const T* residual = nullptr,
                     int64_t ldr = 0);

template <class T>
void activation_grad(Activation a, const T* dy, const T* x, T* dx, int64_t n);

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

}  // namespace oases::kernels
