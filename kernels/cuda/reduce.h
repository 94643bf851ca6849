// Reductions over a set of axes (ReduceSum, ReduceMean, ...), the squared norms of gradients and
// the finite check of mixed-precision training (math in reduce.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/check.h"

namespace oases::cuda {

enum class ReduceKind : int { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };
// out (the kept dims, in order) = reduction of `in` over `axes` (sorted, non-negative).
void reduce(ReduceKind kind, Elem t, const void* in, const std::vector<int64_t>& shape, const std::vector<int64_t>& axes, void* out,
            cudaStream_t s);

// out[0] += Σ x² over n elements of x (fp32/fp16/bf16), in fp32 with a fixed reduction order.
// out must be zeroed by the caller before the first call; several tensors can add into one word.
void sum_squares(Elem t, const void* x, int64_t n, float* out, cudaStream_t s);
// *flag = 1 when any of the n elements is inf or NaN (flag untouched otherwise).
void check_finite(Elem t, const void* x, int64_t n, int* flag, cudaStream_t s);

}  // namespace oases::cuda
