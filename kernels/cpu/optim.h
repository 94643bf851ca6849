// Optimizer updates on fp32 buffers (parameters updated in place).
//   AdamW:  m = β1 m + (1-β1) g ; v = β2 v + (1-β2) g² ; m̂ = m/(1-β1^t) ; v̂ = v/(1-β2^t)
//           p -= lr (m̂ / (√v̂ + ε) + wd · p)        (decoupled weight decay)
//   SGD:    b = μ b + g (b = g at t = 1) ; p -= lr (b + wd · p)   (nesterov: g + μ b)
#pragma once

#include <cstdint>

namespace oases::kernels {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t t, float grad_scale);
void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay, bool nesterov, bool first,
                float grad_scale);
// 1 − β^t in float, the bias correction adamw_update divides by (shared with device updates).
float adamw_bias_correction(float beta, int64_t t);
// Σ g² in double; the same bits for any thread count.
double sum_squares(const float* g, int64_t n);

}  // namespace oases::kernels
