// Softmax family, forward and backward, over the middle dim of a tensor viewed as [outer, n, inner]
// around the op's axis (most callers have inner == 1, the last axis).
//   softmax:      y_i = exp(x_i − max x) / Σ_j exp(x_j − max x)
//   log_softmax:  y_i = x_i − max x − log Σ_j exp(x_j − max x)
//   softmax_grad: dx = y ∘ (dy − Σ dy∘y)          (log form, y = log_softmax(x): dx = dy − exp(y)·Σ dy)
// Gradients are written (=), never accumulated: the graph sums fan-out contributions.
#pragma once

#include <cstdint>

namespace oases::kernels {

// y = softmax(x) (or log_softmax) over the middle dim of [outer, n, inner].
template <class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log);
template <class T>
void softmax_grad(const T* dy, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner, bool log);

}  // namespace oases::kernels
