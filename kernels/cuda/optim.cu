// AdamW and SGD on fp32 master weights (mixed precision keeps parameters and optimizer state in
// fp32; only the compute copies are fp16/bf16), identical in formula to kernels/cpu/optim.cpp:
//
//   scale = grad_scale · min(1, clip / (‖g‖·grad_scale + 1e-6))   (clip only when ‖g‖·grad_scale > clip)
//   AdamW  g ← g·scale ; m = β1 m + (1−β1) g ; v = β2 v + (1−β2) g²
//          p −= lr (m̂/(√v̂ + ε) + wd p),  m̂ = m/(1−β1^t), v̂ = v/(1−β2^t)
//   SGD    g ← g·scale + wd p ; b = μ b + g ; p −= lr (nesterov ? g + μ b : b)
//
// Each thread reads the norm and the skip flag from device memory: no host round trip between
// the backward pass and the update.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.h"

namespace oases::cuda {

namespace {

__device__ __forceinline__ float effective_scale(const StepArgs& a) {
  float scale = a.grad_scale;
  if (a.clip > 0.f && a.norm_sq) {
    float norm = sqrtf(*a.norm_sq) * a.grad_scale;
    if (norm > a.clip) scale = a.grad_scale * a.clip / (norm + 1e-6f);
  }
  return scale;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, StepArgs a, float b1, float b2, float eps, float bc1,
                             float bc2) {
  if (a.skip && *a.skip) return;
  float scale = effective_scale(a);
  OASES_GRID_STRIDE(i, n) {
    float gi = g[i] * scale;
    float mi = b1 * m[i] + (1.f - b1) * gi;
    float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= a.lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + a.weight_decay * p[i]);
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, StepArgs a, float mu, bool nesterov, bool first) {
  if (a.skip && *a.skip) return;
  float scale = effective_scale(a);
  OASES_GRID_STRIDE(i, n) {
    float gi = g[i] * scale + a.weight_decay * p[i];
    float step = gi;
    if (mu != 0.f) {
      float b = first ? gi : mu * buf[i] + gi;
      buf[i] = b;
      step = nesterov ? gi + mu * b : b;
    }
    p[i] -= a.lr * step;
  }
}

__global__ void accumulate_kernel(float* y, const float* x, int64_t n, bool first) {
  OASES_GRID_STRIDE(i, n) {
    y[i] = first ? x[i] : y[i] + x[i];
  }
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const StepArgs& a, float beta1, float beta2, float eps,
                  int64_t t, cudaStream_t s) {
  if (n <= 0) return;
  float bc1 = 1.f - powf(beta1, static_cast<float>(t)), bc2 = 1.f - powf(beta2, static_cast<float>(t));
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(p, g, m, v, n, a, beta1, beta2, eps, bc1, bc2);
  OASES_CUDA_CHECK_LAUNCH("adamw_kernel");
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, const StepArgs& a, float momentum, bool nesterov, bool first,
                cudaStream_t s) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(p, g, buf, n, a, momentum, nesterov, first);
  OASES_CUDA_CHECK_LAUNCH("sgd_kernel");
}

void accumulate(float* y, const float* x, int64_t n, bool first, cudaStream_t s) {
  if (n <= 0) return;
  accumulate_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, n, first);
  OASES_CUDA_CHECK_LAUNCH("accumulate_kernel");
}

}  // namespace oases::cuda
