// Reductions over a set of axes. The kept dims index the output; the reduced dims are walked
// for each output element (contiguous fast path when the reduced axes are trailing, row-wise
// accumulation when they are leading, as in bias gradients).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace oases::kernels {

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

template <class T>
void reduce(ReduceKind kind, const T* in, const std::vector<int64_t>& shape, const std::vector<int64_t>& axes, T* out);

}  // namespace oases::kernels
