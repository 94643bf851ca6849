// Multi-tensor optimizer kernels (contract and math in optim.h). Every kernel is one launch over
// the block table; element arithmetic uses the round-to-nearest intrinsics so nvcc cannot fuse a
// multiply-add the CPU does not fuse.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.h"

namespace oases::cuda {

namespace {

constexpr int kOptimThreads = 256;

template <class T>
__global__ void add_loss_kernel(const T* loss, bool first, StepOutcome* out) {
  double l = static_cast<double>(load(loss, 0));
  out->loss_sum = first ? l : out->loss_sum + l;
}

__global__ void accumulate_kernel(MultiTensorTables tt, bool first) {
  int32_t t = tt.block_tensor[blockIdx.x];
  int64_t start = tt.block_start[blockIdx.x];
  int64_t end = min(start + tt.chunk, tt.numel[t]);
  const float* g = tt.grad[t];
  float* a = tt.acc[t];
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) a[i] = first ? g[i] : __fadd_rn(a[i], g[i]);
}

// Tree sum over the block of one double per thread (blockDim.x == kOptimThreads), fixed order.
__device__ double block_sum_double(double x, double* sh) {
  sh[threadIdx.x] = x;
  __syncthreads();
  for (int w = kOptimThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  double r = sh[0];
  __syncthreads();
  return r;
}

__global__ void sum_squares_kernel(MultiTensorTables tt, bool from_acc, double* partials) {
  __shared__ double sh[kOptimThreads];
  int32_t t = tt.block_tensor[blockIdx.x];
  int64_t start = tt.block_start[blockIdx.x];
  int64_t end = min(start + tt.chunk, tt.numel[t]);
  const float* g = from_acc ? tt.acc[t] : tt.grad[t];
  double s = 0;
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    double x = g[i];
    s += x * x;
  }
  s = block_sum_double(s, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: per-tensor sums from the block partials, the total, the norm and the skip decision.
__global__ void norm_kernel(MultiTensorTables tt, const StepScalars* sc, const double* partials, double* per_tensor, StepOutcome* out) {
  __shared__ double sh[kOptimThreads];
  double mine = 0;
  for (int32_t t = threadIdx.x; t < tt.tensors; t += blockDim.x) {
    double s = 0;
    for (int32_t b = tt.first_block[t]; b < tt.first_block[t + 1]; ++b) s += partials[b];
    per_tensor[t] = s;
    mine += s;
  }
  double total = block_sum_double(mine, sh);
  if (threadIdx.x == 0) {
    double n = sc->use_host_norm ? sc->host_norm : sqrt(total) * static_cast<double>(sc->grad_scale);
    if (sc->skip_nonfinite && !isfinite(out->loss_sum)) n = NAN;
    out->sum_squares = total;
    out->norm = n;
    out->skipped = sc->skip_nonfinite && !isfinite(n) ? 1 : 0;
  }
}

__global__ void update_kernel(MultiTensorTables tt, bool from_acc, const StepScalars* scp, const StepOutcome* out) {
  if (out->skipped) return;
  const StepScalars sc = *scp;
  double norm = out->norm;
  float scale = sc.grad_scale;
  if (sc.clip > 0 && norm > sc.clip) scale = static_cast<float>(static_cast<double>(sc.grad_scale) * sc.clip / (norm + 1e-6));
  int32_t t = tt.block_tensor[blockIdx.x];
  int64_t start = tt.block_start[blockIdx.x];
  int64_t end = min(start + tt.chunk, tt.numel[t]);
  const float* g = from_acc ? tt.acc[t] : tt.grad[t];
  float* p = tt.param[t];
  float* m = tt.m[t];
  const float wd = tt.decay[t] ? sc.weight_decay : 0.f;
  if (sc.adamw) {
    float* v = tt.v[t];
    for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
      float gi = __fmul_rn(g[i], scale);
      float mi = __fadd_rn(__fmul_rn(sc.beta1, m[i]), __fmul_rn(sc.one_minus_beta1, gi));
      float vi = __fadd_rn(__fmul_rn(sc.beta2, v[i]), __fmul_rn(__fmul_rn(sc.one_minus_beta2, gi), gi));
      m[i] = mi;
      v[i] = vi;
      float mh = __fdiv_rn(mi, sc.bc1), vh = __fdiv_rn(vi, sc.bc2);
      float pi = p[i];
      float upd = __fadd_rn(__fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), sc.eps)), __fmul_rn(wd, pi));
      p[i] = __fsub_rn(pi, __fmul_rn(sc.lr, upd));
    }
  } else {
    for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
      float pi = p[i];
      float gi = __fadd_rn(__fmul_rn(g[i], scale), __fmul_rn(wd, pi));
      float st = gi;
      if (sc.momentum != 0.f) {
        float b = sc.first ? gi : __fadd_rn(__fmul_rn(sc.momentum, m[i]), gi);
        m[i] = b;
        st = sc.nesterov ? __fadd_rn(gi, __fmul_rn(sc.momentum, b)) : b;
      }
      p[i] = __fsub_rn(pi, __fmul_rn(sc.lr, st));
    }
  }
}

}  // namespace

void add_loss(Elem t, const void* loss, bool first, StepOutcome* out, cudaStream_t s) {
  dispatch_floating("loss", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_loss_kernel<T><<<1, 1, 0, s>>>(static_cast<const T*>(loss), first, out);
  });
  OASES_CUDA_CHECK_LAUNCH("add_loss_kernel");
}

void multi_tensor_accumulate(const MultiTensorTables& tt, bool first, cudaStream_t s) {
  if (tt.blocks == 0) return;
  accumulate_kernel<<<tt.blocks, kOptimThreads, 0, s>>>(tt, first);
  OASES_CUDA_CHECK_LAUNCH("accumulate_kernel");
}

void multi_tensor_norm(const MultiTensorTables& tt, bool from_acc, const StepScalars* sc, double* partials, double* per_tensor,
                       StepOutcome* out, cudaStream_t s) {
  if (tt.blocks > 0) {
    sum_squares_kernel<<<tt.blocks, kOptimThreads, 0, s>>>(tt, from_acc, partials);
    OASES_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  }
  norm_kernel<<<1, kOptimThreads, 0, s>>>(tt, sc, partials, per_tensor, out);
  OASES_CUDA_CHECK_LAUNCH("norm_kernel");
}

void multi_tensor_update(const MultiTensorTables& tt, bool from_acc, const StepScalars* sc, StepOutcome* out, cudaStream_t s) {
  if (tt.blocks == 0) return;
  update_kernel<<<tt.blocks, kOptimThreads, 0, s>>>(tt, from_acc, sc, out);
  OASES_CUDA_CHECK_LAUNCH("update_kernel");
}

}  // namespace oases::cuda
