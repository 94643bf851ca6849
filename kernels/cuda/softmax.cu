// Softmax over the middle dim of [outer, n, inner], one block per (outer, inner) row, fp32 math:
//   forward   m = max x ; y = exp(x − m) / Σ exp(x − m)        log: y = x − m − log Σ exp(x − m)
//   backward  dx = y ∘ (dy − Σ dy∘y)                          log: dx = dy − exp(y)·Σ dy
// Activation gradients are written (=).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/nn.h"

namespace oases::cuda {

namespace {

template <class T>
__global__ void softmax_fwd_kernel(bool log_form, const T* x, T* y, int64_t n, int64_t inner) {
  __shared__ float scratch[32];
  int64_t row = blockIdx.x, o = row / inner, j = row % inner;
  const T* xr = x + o * n * inner + j;
  T* yr = y + o * n * inner + j;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, to_float(xr[i * inner]));
  m = block_max(m, scratch);
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(to_float(xr[i * inner]) - m);
  sum = block_sum(sum, scratch);
  float ls = logf(sum), inv = 1.f / sum;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = to_float(xr[i * inner]) - m;
    yr[i * inner] = from_float<T>(log_form ? v - ls : expf(v) * inv);
  }
}

template <class T>
__global__ void softmax_bwd_kernel(bool log_form, const T* dy, const T* y, T* dx, int64_t n, int64_t inner) {
  __shared__ float scratch[32];
  int64_t row = blockIdx.x, o = row / inner, j = row % inner;
  int64_t base = o * n * inner + j;
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float d = to_float(dy[base + i * inner]);
    dot += log_form ? d : d * to_float(y[base + i * inner]);
  }
  dot = block_sum(dot, scratch);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float d = to_float(dy[base + i * inner]), yv = to_float(y[base + i * inner]);
    dx[base + i * inner] = from_float<T>(log_form ? d - expf(yv) * dot : yv * (d - dot));
  }
}

int threads_for(int64_t n) {
  return n >= 1024 ? 512 : n >= 256 ? 256 : 128;
}

}  // namespace

void softmax_forward(bool log, Elem t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  int64_t rows = outer * inner;
  if (rows <= 0 || n <= 0) return;
  if (rows > 0x7fffffff) throw std::runtime_error("[cuda softmax] more than 2^31 rows");
  dispatch_floating("Softmax", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_fwd_kernel<T>
        <<<static_cast<unsigned>(rows), threads_for(n), 0, s>>>(log, static_cast<const T*>(x), static_cast<T*>(y), n, inner);
  });
  OASES_CUDA_CHECK_LAUNCH("softmax_fwd_kernel");
}

void softmax_backward(bool log, Elem t, const void* dy, const void* y, void* dx, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  int64_t rows = outer * inner;
  if (rows <= 0 || n <= 0) return;
  if (rows > 0x7fffffff) throw std::runtime_error("[cuda softmax] more than 2^31 rows");
  dispatch_floating("SoftmaxGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_bwd_kernel<T><<<static_cast<unsigned>(rows), threads_for(n), 0, s>>>(log, static_cast<const T*>(dy), static_cast<const T*>(y),
                                                                                 static_cast<T*>(dx), n, inner);
  });
  OASES_CUDA_CHECK_LAUNCH("softmax_bwd_kernel");
}

}  // namespace oases::cuda
