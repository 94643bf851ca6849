// LayerNorm and RMSNorm over rows of length n, one block per row, fp32 statistics:
//
//   LayerNorm  μ = mean x, r = 1/√(var x + ε), x̂ = (x − μ)·r, y = x̂·γ + β
//              g = dy∘γ:  dx = r·(g − mean g − x̂·mean(g∘x̂)),  dγ = Σ_rows dy∘x̂,  dβ = Σ_rows dy
//   RMSNorm    r = 1/√(mean x² + ε), x̂ = x·r, y = x̂·γ
//              g = dy∘γ:  dx = r·(g − x̂·mean(g∘x̂)),  dγ = Σ_rows dy∘x̂
//
// The variance is taken around the mean (two passes over the row), not as E[x²] − μ². Parameter
// gradients dγ, dβ are column sums over rows: each block of the first stage sums a band of rows
// into fp32 scratch, the second stage sums the bands in a fixed order, so results do not depend on
// scheduling. Activation gradients are written (=); parameter gradients too (the graph sums them).
//
// Rows of up to kCachedCols elements (hidden sizes to 2048) take the cached kernels: each thread
// keeps its columns of the row in registers, so the forward reads x once and the backward's dx
// reads dy and x once. Longer rows take the general kernels, which read the row again per pass.
// (A backward that also summed a band's dγ, dβ in the same pass, with bands of 8 rows, was 3x
// slower on an H100: the 1024 bands' final sum ran on 4 blocks; docs/gpu-runs/2026-11-26-1d10cbb-profile.txt.)
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/nn.h"

namespace oases::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int64_t kRowsPerBand = 64;
constexpr int kCachedPerThread = 8;
constexpr int64_t kCachedCols = kNormThreads * kCachedPerThread;

// a row's statistics, from thread 0
__device__ __forceinline__ void store_row_stats(float* mean, float* rstd, int64_t row, float mu, float r) {
  if (threadIdx.x != 0) return;
  if (mean) mean[row] = mu;
  if (rstd) rstd[row] = r;
}

// One row per block, the row in registers (n <= kCachedCols).
template <class T>
__global__ void layernorm_fwd_cached_kernel(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t n, float eps,
                                            bool rms) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  float v[kCachedPerThread];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kCachedPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
    v[k] = i < n ? to_float(xr[i]) : 0.f;
    s += v[k];
  }
  const float mu = rms ? 0.f : block_sum(s, scratch) / static_cast<float>(n);
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < kCachedPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
    const float d = i < n ? v[k] - mu : 0.f;
    q += d * d;
  }
  const float r = rsqrtf(block_sum(q, scratch) / static_cast<float>(n) + eps);
  T* yr = y + row * n;
#pragma unroll
  for (int k = 0; k < kCachedPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
    if (i >= n) break;
    float h = (v[k] - mu) * r * to_float(scale[i]);
    if (bias) h += to_float(bias[i]);
    yr[i] = from_float<T>(h);
  }
  store_row_stats(mean, rstd, row, mu, r);
}

// dx of one row per block, the row of dy and x in registers (n <= kCachedCols): read once.
template <class T>
__global__ void norm_bwd_dx_cached_kernel(const T* dy, const T* x, const T* scale, const float* mean, const float* rstd, T* dx, int64_t n,
                                          bool rms) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * n;
  const T* xr = x + row * n;
  const float mu = rms ? 0.f : mean[row], r = rstd[row];
  float g[kCachedPerThread], xh[kCachedPerThread];
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int k = 0; k < kCachedPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
    const bool in = i < n;
    g[k] = in ? to_float(dyr[i]) * to_float(scale[i]) : 0.f;
    xh[k] = in ? (to_float(xr[i]) - mu) * r : 0.f;
    sg += g[k];
    sgx += g[k] * xh[k];
  }
  const float mg = rms ? 0.f : block_sum(sg, scratch) / static_cast<float>(n);
  const float mgx = block_sum(sgx, scratch) / static_cast<float>(n);
#pragma unroll
  for (int k = 0; k < kCachedPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kNormThreads;
    if (i < n) dx[row * n + i] = from_float<T>(r * (g[k] - mg - xh[k] * mgx));
  }
}

template <class T>
__global__ void layernorm_fwd_kernel(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t n, float eps,
                                     bool rms) {
  __shared__ float scratch[32];
  int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float mu = 0.f;
  if (!rms) {
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += to_float(xr[i]);
    mu = block_sum(s, scratch) / static_cast<float>(n);
  }
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float d = to_float(xr[i]) - mu;
    v += d * d;
  }
  float r = rsqrtf(block_sum(v, scratch) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float h = (to_float(xr[i]) - mu) * r * to_float(scale[i]);
    if (bias) h += to_float(bias[i]);
    yr[i] = from_float<T>(h);
  }
  store_row_stats(mean, rstd, row, mu, r);
}

template <class T>
__global__ void norm_bwd_dx_kernel(const T* dy, const T* x, const T* scale, const float* mean, const float* rstd, T* dx, int64_t n,
                                   bool rms) {
  __shared__ float scratch[32];
  int64_t row = blockIdx.x;
  const T* dyr = dy + row * n;
  const T* xr = x + row * n;
  float mu = rms ? 0.f : mean[row], r = rstd[row];
  float sg = 0.f, sgx = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float g = to_float(dyr[i]) * to_float(scale[i]);
    float xh = (to_float(xr[i]) - mu) * r;
    sg += g;
    sgx += g * xh;
  }
  float mg = rms ? 0.f : block_sum(sg, scratch) / static_cast<float>(n);
  float mgx = block_sum(sgx, scratch) / static_cast<float>(n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float g = to_float(dyr[i]) * to_float(scale[i]);
    float xh = (to_float(xr[i]) - mu) * r;
    dx[row * n + i] = from_float<T>(r * (g - mg - xh * mgx));
  }
}

// Stage 1: band b of rows -> partial[b][col] (dγ) and partial[bands + b][col] (dβ).
template <class T>
__global__ void norm_bwd_param_partial(const T* dy, const T* x, const float* mean, const float* rstd, int64_t rows, int64_t n, bool rms,
                                       bool want_bias, float* partial, int64_t bands) {
  int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t band = blockIdx.y;
  if (col >= n) return;
  float sgam = 0.f, sbeta = 0.f;
  int64_t r0 = band * kRowsPerBand, r1 = min(rows, r0 + kRowsPerBand);
  for (int64_t r = r0; r < r1; ++r) {
    float d = to_float(dy[r * n + col]);
    float xh = (to_float(x[r * n + col]) - (rms ? 0.f : mean[r])) * rstd[r];
    sgam += d * xh;
    sbeta += d;
  }
  partial[band * n + col] = sgam;
  if (want_bias) partial[(bands + band) * n + col] = sbeta;
}

template <class T>
__global__ void norm_bwd_param_final(const float* partial, int64_t bands, int64_t n, T* dscale, T* dbias) {
  OASES_GRID_STRIDE(col, n) {
    if (dscale) {
      float s = 0.f;
      for (int64_t b = 0; b < bands; ++b) s += partial[b * n + col];
      dscale[col] = from_float<T>(s);
    }
    if (dbias) {
      float s = 0.f;
      for (int64_t b = 0; b < bands; ++b) s += partial[(bands + b) * n + col];
      dbias[col] = from_float<T>(s);
    }
  }
}

void check_rows(int64_t rows) {
  if (rows > 0x7fffffff) throw std::runtime_error("[cuda norm] more than 2^31 rows");
}

template <class T>
void param_grads(const T* dy, const T* x, const float* mean, const float* rstd, T* dscale, T* dbias, int64_t rows, int64_t n, bool rms,
                 float* scratch, cudaStream_t s) {
  if (!dscale && !dbias) return;
  int64_t bands = (rows + kRowsPerBand - 1) / kRowsPerBand;
  if (bands > 65535) throw std::runtime_error("[cuda norm] too many rows for the parameter-gradient bands");
  dim3 grid(static_cast<unsigned>((n + kNormThreads - 1) / kNormThreads), static_cast<unsigned>(bands));
  norm_bwd_param_partial<T><<<grid, kNormThreads, 0, s>>>(dy, x, mean, rstd, rows, n, rms, dbias != nullptr, scratch, bands);
  OASES_CUDA_CHECK_LAUNCH("norm_bwd_param_partial");
  norm_bwd_param_final<T><<<grid_for(n, kNormThreads), kNormThreads, 0, s>>>(scratch, bands, n, dscale, dbias);
  OASES_CUDA_CHECK_LAUNCH("norm_bwd_param_final");
}

// The forward of LayerNorm (bias may be null) or RMSNorm (rms: no mean), one row per block: the
// cached kernel for rows of up to kCachedCols elements, else the general one.
template <class T>
void norm_forward(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t rows, int64_t n, float eps, bool rms,
                  cudaStream_t s) {
  auto kernel = n <= kCachedCols ? layernorm_fwd_cached_kernel<T> : layernorm_fwd_kernel<T>;
  kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(x, scale, bias, y, mean, rstd, n, eps, rms);
}

// dx of LayerNorm or RMSNorm (rms: mean null), as norm_forward picks its kernel.
template <class T>
void norm_dx(const T* dy, const T* x, const T* scale, const float* mean, const float* rstd, T* dx, int64_t rows, int64_t n, bool rms,
             cudaStream_t s) {
  auto kernel = n <= kCachedCols ? norm_bwd_dx_cached_kernel<T> : norm_bwd_dx_kernel<T>;
  kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(dy, x, scale, mean, rstd, dx, n, rms);
  OASES_CUDA_CHECK_LAUNCH("norm_bwd_dx_kernel");
}

}  // namespace

size_t norm_backward_scratch_floats(int64_t rows, int64_t n) {
  int64_t bands = (rows + kRowsPerBand - 1) / kRowsPerBand;
  return static_cast<size_t>(2 * std::max<int64_t>(bands, 1) * n);
}

void layernorm_forward(Elem t, const void* x, const void* scale, const void* bias, void* y, float* mean, float* rstd, int64_t rows,
                       int64_t n, float eps, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  check_rows(rows);
  dispatch_floating("LayerNormalization", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_forward<T>(static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(y), mean, rstd,
                    rows, n, eps, false, s);
  });
  OASES_CUDA_CHECK_LAUNCH("layernorm_fwd_kernel");
}

void rmsnorm_forward(Elem t, const void* x, const void* scale, void* y, float* rstd, int64_t rows, int64_t n, float eps, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  check_rows(rows);
  dispatch_floating("RMSNormalization", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_forward<T>(static_cast<const T*>(x), static_cast<const T*>(scale), nullptr, static_cast<T*>(y), nullptr, rstd, rows, n, eps, true, s);
  });
  OASES_CUDA_CHECK_LAUNCH("rmsnorm_fwd_kernel");
}

void layernorm_backward(Elem t, const void* dy, const void* x, const void* scale, const float* mean, const float* rstd, void* dx,
                        void* dscale, void* dbias, int64_t rows, int64_t n, float* scratch, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  check_rows(rows);
  dispatch_floating("LayerNormGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dx) {
      norm_dx<T>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(scale), mean, rstd, static_cast<T*>(dx), rows, n,
                 false, s);
    }
    param_grads<T>(static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, static_cast<T*>(dscale), static_cast<T*>(dbias), rows,
                   n, false, scratch, s);
  });
}

void rmsnorm_backward(Elem t, const void* dy, const void* x, const void* scale, const float* rstd, void* dx, void* dscale, int64_t rows,
                      int64_t n, float* scratch, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  check_rows(rows);
  dispatch_floating("RMSNormGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dx) {
      norm_dx<T>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(scale), nullptr, rstd, static_cast<T*>(dx), rows,
                 n, true, s);
    }
    param_grads<T>(static_cast<const T*>(dy), static_cast<const T*>(x), nullptr, rstd, static_cast<T*>(dscale), nullptr, rows, n, true,
                   scratch, s);
  });
}

}  // namespace oases::cuda
