// Multi-tensor optimizer kernels (contract and math in optim.h). Every kernel is one launch over
// the block table, moving float4s where every tensor lies on 16 bytes (MultiTensorTables::
// aligned16); element arithmetic uses the round-to-nearest intrinsics so nvcc cannot fuse a
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

// Elements [start, end) of a block: with 16-byte aligned tensors (tt.aligned16) the first
// (end - start) / 4 · 4 go as float4 groups, thread by thread, and the rest one by one; the
// arithmetic per element is the same either way.
struct BlockRange {
  int64_t start, vec_end, end;
};
__device__ __forceinline__ BlockRange block_range(const MultiTensorTables& tt, int32_t t) {
  int64_t start = tt.block_start[blockIdx.x];
  int64_t end = min(start + tt.chunk, tt.numel[t]);
  int64_t vec_end = tt.aligned16 && start % 4 == 0 ? start + (end - start) / 4 * 4 : start;
  return BlockRange{start, vec_end, end};
}
__device__ __forceinline__ float& lane(float4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__global__ void accumulate_kernel(MultiTensorTables tt, bool first) {
  int32_t t = tt.block_tensor[blockIdx.x];
  const BlockRange r = block_range(tt, t);
  const float* g = tt.grad[t];
  float* a = tt.acc[t];
  for (int64_t i = r.start + 4 * static_cast<int64_t>(threadIdx.x); i < r.vec_end; i += 4 * static_cast<int64_t>(blockDim.x)) {
    float4 gv = *reinterpret_cast<const float4*>(g + i);
    float4 av = first ? gv : *reinterpret_cast<const float4*>(a + i);
    if (!first) {
      av.x = __fadd_rn(av.x, gv.x);
      av.y = __fadd_rn(av.y, gv.y);
      av.z = __fadd_rn(av.z, gv.z);
      av.w = __fadd_rn(av.w, gv.w);
    }
    *reinterpret_cast<float4*>(a + i) = av;
  }
  for (int64_t i = r.vec_end + threadIdx.x; i < r.end; i += blockDim.x) a[i] = first ? g[i] : __fadd_rn(a[i], g[i]);
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
  const float* g = from_acc ? tt.acc[t] : tt.grad[t];
  const BlockRange r = block_range(tt, t);
  double s = 0;
  for (int64_t i = r.start + 4 * static_cast<int64_t>(threadIdx.x); i < r.vec_end; i += 4 * static_cast<int64_t>(blockDim.x)) {
    float4 v = *reinterpret_cast<const float4*>(g + i);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      double x = lane(v, j);
      s += x * x;
    }
  }
  for (int64_t i = r.vec_end + threadIdx.x; i < r.end; i += blockDim.x) {
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

// One element of the AdamW and SGD updates (optim.h has the math; the CPU's operations in its order).
__device__ __forceinline__ void adamw_element(const StepScalars& sc, float scale, float wd, float g, float& m, float& v, float& p) {
  float gi = __fmul_rn(g, scale);
  float mi = __fadd_rn(__fmul_rn(sc.beta1, m), __fmul_rn(sc.one_minus_beta1, gi));
  float vi = __fadd_rn(__fmul_rn(sc.beta2, v), __fmul_rn(__fmul_rn(sc.one_minus_beta2, gi), gi));
  m = mi;
  v = vi;
  float mh = __fdiv_rn(mi, sc.bc1), vh = __fdiv_rn(vi, sc.bc2);
  float pi = p;
  float upd = __fadd_rn(__fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), sc.eps)), __fmul_rn(wd, pi));
  p = __fsub_rn(pi, __fmul_rn(sc.lr, upd));
}
__device__ __forceinline__ void sgd_element(const StepScalars& sc, float scale, float wd, float g, float& m, float& p) {
  float pi = p;
  float gi = __fadd_rn(__fmul_rn(g, scale), __fmul_rn(wd, pi));
  float st = gi;
  if (sc.momentum != 0.f) {
    float b = sc.first ? gi : __fadd_rn(__fmul_rn(sc.momentum, m), gi);
    m = b;
    st = sc.nesterov ? __fadd_rn(gi, __fmul_rn(sc.momentum, b)) : b;
  }
  p = __fsub_rn(pi, __fmul_rn(sc.lr, st));
}

// The update reads 16 bytes of the gradient, the moments and the parameter at a time where the
// tensors allow it (the step moves 28 bytes a parameter with AdamW: bandwidth-bound).
__global__ void update_kernel(MultiTensorTables tt, bool from_acc, const StepScalars* scp, const StepOutcome* out) {
  if (out->skipped) return;
  const StepScalars sc = *scp;
  double norm = out->norm;
  float scale = sc.grad_scale;
  if (sc.clip > 0 && norm > sc.clip) scale = static_cast<float>(static_cast<double>(sc.grad_scale) * sc.clip / (norm + 1e-6));
  int32_t t = tt.block_tensor[blockIdx.x];
  const BlockRange r = block_range(tt, t);
  const float* g = from_acc ? tt.acc[t] : tt.grad[t];
  float* p = tt.param[t];
  float* m = tt.m[t];
  const float wd = tt.decay[t] ? sc.weight_decay : 0.f;
  const int64_t step4 = 4 * static_cast<int64_t>(blockDim.x);
  if (sc.adamw) {
    float* v = tt.v[t];
    for (int64_t i = r.start + 4 * static_cast<int64_t>(threadIdx.x); i < r.vec_end; i += step4) {
      float4 gv = *reinterpret_cast<const float4*>(g + i), mv = *reinterpret_cast<float4*>(m + i);
      float4 vv = *reinterpret_cast<float4*>(v + i), pv = *reinterpret_cast<float4*>(p + i);
#pragma unroll
      for (int j = 0; j < 4; ++j) adamw_element(sc, scale, wd, lane(gv, j), lane(mv, j), lane(vv, j), lane(pv, j));
      *reinterpret_cast<float4*>(m + i) = mv;
      *reinterpret_cast<float4*>(v + i) = vv;
      *reinterpret_cast<float4*>(p + i) = pv;
    }
    for (int64_t i = r.vec_end + threadIdx.x; i < r.end; i += blockDim.x) adamw_element(sc, scale, wd, g[i], m[i], v[i], p[i]);
  } else {
    for (int64_t i = r.start + 4 * static_cast<int64_t>(threadIdx.x); i < r.vec_end; i += step4) {
      float4 gv = *reinterpret_cast<const float4*>(g + i), pv = *reinterpret_cast<float4*>(p + i);
      float4 mv = sc.momentum != 0.f ? *reinterpret_cast<float4*>(m + i) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < 4; ++j) sgd_element(sc, scale, wd, lane(gv, j), lane(mv, j), lane(pv, j));
      if (sc.momentum != 0.f) *reinterpret_cast<float4*>(m + i) = mv;
      *reinterpret_cast<float4*>(p + i) = pv;
    }
    float unused = 0.f;  // no momentum: m is not read (and may be null)
    for (int64_t i = r.vec_end + threadIdx.x; i < r.end; i += blockDim.x) {
      sgd_element(sc, scale, wd, g[i], sc.momentum != 0.f ? m[i] : unused, p[i]);
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
