// Optimizer updates on fp32 master weights and fp32 state, in place (math in optim.cu), and the
// gradient accumulation of multi-micro-batch steps. Clipping and the skip of a step with a
// non-finite gradient read device words, so the host never waits for the gradient norm.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace oases::cuda {

struct StepArgs {
  float lr = 1e-3f, weight_decay = 0.f;
  float grad_scale = 1.f;          // e.g. 1/micro-batches, times 1/loss-scale
  float clip = 0.f;                // global-norm clip (0: off)
  const float* norm_sq = nullptr;  // device Σ g² over all (unscaled) gradients, for clipping; may be null
  const int* skip = nullptr;       // device flag: 1 leaves parameters and state untouched; may be null
};

// m = β1 m + (1−β1) g ; v = β2 v + (1−β2) g² ; p −= lr (m/(1−β1^t) / (√(v/(1−β2^t)) + ε) + wd p)
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const StepArgs& a, float beta1, float beta2, float eps,
                  int64_t t, cudaStream_t s);
// g' = g + wd p ; b = μ b + g' (b = g' at t = 1) ; p −= lr (nesterov ? g' + μ b : b)
void sgd_update(float* p, const float* g, float* buf, int64_t n, const StepArgs& a, float momentum, bool nesterov, bool first,
                cudaStream_t s);
// y += x (first: y = x), fp32.
void accumulate(float* y, const float* x, int64_t n, bool first, cudaStream_t s);

}  // namespace oases::cuda
