// Elementwise launchers: unary math, binary arithmetic and comparisons with broadcasting (through
// the affine maps of kernels/cuda/nd.h), Where, Cast, fills and strided copies. Storage types
// fp16/bf16 compute in fp32. Every launcher takes the stream it enqueues on and checks the launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/nd.h"

namespace oases::cuda {

enum class UnaryOp : int {
  kNeg,
  kAbs,
  kSign,
  kRelu,
  kFloor,
  kCeil,
  kRound,
  kReciprocal,
  kSqrt,
  kExp,
  kLog,
  kErf,
  kTanh,
  kSigmoid,
  kSin,
  kCos,
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kSoftplus,
  kSoftsign,
  kSilu,
  kMish,
  kHardSwish,
  kGeluErf,
  kGeluTanh,
  kLeakyRelu,
  kElu,
  kSelu,
  kCelu,
  kHardSigmoid,
  kThresholdedRelu,
  kClip,
  kScale
};
struct UnaryArgs {
  float alpha = 0.f, beta = 0.f,
        gamma = 0.f;  // LeakyRelu/Elu/Celu/HardSigmoid/ThresholdedRelu: alpha (beta); Selu: alpha, gamma; kScale: y = alpha x
  float lo = -3.4e38f, hi = 3.4e38f;  // Clip
};
// y = op(x) over n elements of type t (x and y may alias).
void unary(UnaryOp op, const UnaryArgs& a, Elem t, const void* x, void* y, int64_t n, cudaStream_t s);

// Predicates writing bool (uint8): Not (bool in), IsNaN, IsInf (detect_positive/negative).
enum class PredicateOp : int { kNot, kIsNaN, kIsInf };
void predicate(PredicateOp op, bool pos, bool neg, Elem t, const void* x, uint8_t* y, int64_t n, cudaStream_t s);

enum class BinaryOp : int {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMax,
  kMin,
  kMod,
  kFmod,
  kPRelu,
  kSwiGLU,
  // comparisons and logic: bool (uint8) result
  kEqual,
  kLess,
  kGreater,
  kLessEq,
  kGreaterEq,
  kAnd,
  kOr,
  kXor
};
inline bool is_comparison(BinaryOp op) {
  return op >= BinaryOp::kEqual;
}
// out[plan.maps[0]] = op(a[plan.maps[1]], b[plan.maps[2]]) over plan.it; a and b of type t, out of
// type t (arithmetic) or bool (comparisons). Pow takes b of type tb (an integer exponent is common).
void binary(BinaryOp op, Elem t, Elem tb, const void* a, const void* b, void* out, const NdPlan& plan, cudaStream_t s);

// out = cond ? a : b with broadcasting (maps: out, cond, a, b); bits of element size es.
void where(const uint8_t* cond, const void* a, const void* b, void* out, size_t es, const NdPlan& plan, cudaStream_t s);

// y = x converted from type `from` to `to` (float<->half/bf16, ints, bool); NaN -> 0 and truncation
// toward zero for float -> integer, as the CPU kernel does.
void cast(Elem from, Elem to, const void* x, void* y, int64_t n, cudaStream_t s);

// dst[plan.maps[0]] = src[plan.maps[1]] (elements of es bytes).
void copy(const void* src, void* dst, size_t es, const NdPlan& plan, cudaStream_t s);
// n copies of the es-byte value (given by value, es <= 8) into dst.
void fill(void* dst, int64_t n, size_t es, uint64_t value_bits, cudaStream_t s);
// dst[r * dst_ld + j] = src[r * src_ld + j] for r < rows, j < cols: rows between leading
// dimensions (elements of es = 1, 2, 4 or 8 bytes); with zero_to > cols, dst[r * dst_ld + j] = 0
// for cols <= j < zero_to as well (a zero-padded copy).
void copy_rows(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t rows, int64_t cols, size_t es, cudaStream_t s,
               int64_t zero_to = 0);
// Raw bytes, stream ordered.
void copy_bytes(const void* src, void* dst, size_t bytes, cudaStream_t s);

}  // namespace oases::cuda
