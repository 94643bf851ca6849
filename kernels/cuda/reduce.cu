// Reductions. One output element per block when the reduced extent is large (block-wide fp32 sum,
// fixed order), one per thread otherwise. Compute type: fp32 for fp32/fp16/bf16, double for
// fp64 and integers (exact below 2^53). ReduceLogSumExp subtracts the maximum first.
//
//   Sum Σx · Mean Σx/n · Max · Min · Prod Πx · L1 Σ|x| · L2 √Σx² · SumSquare Σx² · LogSum log Σx
//   LogSumExp m + log Σ exp(x − m)
//
// Reductions have no backward kernels of their own: their gradients are Expand/Mul graphs.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.h"

namespace oases::cuda {

namespace {

template <class C>
__device__ __forceinline__ C identity_of(ReduceKind k) {
  switch (k) {
    case ReduceKind::kMax: return -INFINITY;
    case ReduceKind::kMin: return INFINITY;
    case ReduceKind::kProd: return C(1);
    default: return C(0);
  }
}

template <class C>
__device__ __forceinline__ C combine(ReduceKind k, C acc, C x, C m) {
  switch (k) {
    case ReduceKind::kMax: return acc > x || isnan(acc) ? acc : x;
    case ReduceKind::kMin: return acc < x || isnan(acc) ? acc : x;
    case ReduceKind::kProd: return acc * x;
    case ReduceKind::kL1: return acc + (x < C(0) ? -x : x);
    case ReduceKind::kL2:
    case ReduceKind::kSumSquare: return acc + x * x;
    case ReduceKind::kLogSumExp: return acc + exp(x - m);
    default: return acc + x;
  }
}

template <class C>
__device__ __forceinline__ C finish(ReduceKind k, C acc, C m, int64_t n) {
  switch (k) {
    case ReduceKind::kMean: return acc / static_cast<C>(n);
    case ReduceKind::kL2: return sqrt(acc);
    case ReduceKind::kLogSum: return log(acc);
    case ReduceKind::kLogSumExp: return m + log(acc);
    default: return acc;
  }
}

template <class T, class C>
__global__ void reduce_thread_kernel(ReduceKind k, const T* in, T* out, Iter kept, Affine km, Iter red, Affine rm) {
  OASES_GRID_STRIDE(o, kept.numel) {
    int64_t base = affine_offset(kept, km, o);
    C m = C(0);
    if (k == ReduceKind::kLogSumExp) {
      m = -INFINITY;
      for (int64_t r = 0; r < red.numel; ++r) m = fmax(m, static_cast<C>(load(in, base + affine_offset(red, rm, r))));
      if (isinf(m)) m = C(0);
    }
    C acc = identity_of<C>(k);
    for (int64_t r = 0; r < red.numel; ++r) acc = combine<C>(k, acc, static_cast<C>(load(in, base + affine_offset(red, rm, r))), m);
    store(out, o, finish<C>(k, acc, m, red.numel));
  }
}

// Block per output (fp32 storage types only; the large reductions of training graphs).
template <class T>
__global__ void reduce_block_kernel(ReduceKind k, const T* in, T* out, Iter kept, Affine km, Iter red, Affine rm) {
  __shared__ float scratch[32];
  int64_t o = blockIdx.x;
  int64_t base = affine_offset(kept, km, o);
  float m = 0.f;
  if (k == ReduceKind::kLogSumExp) {
    float mm = -INFINITY;
    for (int64_t r = threadIdx.x; r < red.numel; r += blockDim.x) mm = fmaxf(mm, to_float(in[base + affine_offset(red, rm, r)]));
    m = block_max(mm, scratch);
    if (isinf(m)) m = 0.f;
  }
  float acc = identity_of<float>(k);
  for (int64_t r = threadIdx.x; r < red.numel; r += blockDim.x)
    acc = combine<float>(k, acc, to_float(in[base + affine_offset(red, rm, r)]), m);
  if (k == ReduceKind::kMax) {
    acc = block_max(acc, scratch);
  } else if (k == ReduceKind::kMin) {
    acc = -block_max(-acc, scratch);
  } else {
    acc = block_sum(acc, scratch);  // Prod is routed to the thread kernel
  }
  if (threadIdx.x == 0) out[o] = from_float<T>(finish<float>(k, acc, m, red.numel));
}

// Column sums of a row-major [rows, cols] (the reduced dims lead, the kept ones are contiguous:
// bias gradients, Σ over batch and time of dY [B, T, N]). A block of 32 x 8 threads takes 32
// columns of one range of rows: a warp reads 32 neighbouring columns of a row (coalesced, where
// one block per column read them a row apart). Each range's sums go to `partial` [splits, cols];
// column_finish_kernel adds the ranges in order (fixed, so the result does not depend on timing).
template <class T>
__global__ void column_partial_kernel(const T* in, int64_t rows, int64_t cols, int64_t rows_per_split, float* partial) {
  __shared__ float sh[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r1 = min(rows, r0 + rows_per_split);
  float acc = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += to_float(in[r * cols + c]);
  }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
    for (int y = 0; y < 8; ++y) t += sh[y][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + c] = t;
  }
}

// The same sums with 16-byte loads: each thread takes V = 16 / sizeof(T) neighbouring columns
// (cols a multiple of V, `in` on 16 bytes), a block 32 x 8 threads 32·V columns. Every column is
// summed over the same rows in the same order as above (thread row y: rows r0 + y, r0 + y + 8, ...,
// then the 8 rows of threads in order), so the bits are those of column_partial_kernel.
template <class T>
__global__ void column_partial_vec_kernel(const T* in, int64_t rows, int64_t cols, int64_t rows_per_split, float* partial) {
  constexpr int V = static_cast<int>(16 / sizeof(T));
  __shared__ float sh[8][32 * V + 1];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r1 = min(rows, r0 + rows_per_split);
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.f;
  if (c0 < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      uint4 raw = *reinterpret_cast<const uint4*>(in + r * cols + c0);
      const T* xs = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_float(xs[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) sh[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < cols) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float t = 0.f;
      for (int y = 0; y < 8; ++y) t += sh[y][threadIdx.x * V + j];
      partial[static_cast<int64_t>(blockIdx.y) * cols + c0 + j] = t;
    }
  }
}

template <class T>
__global__ void column_finish_kernel(const float* partial, int64_t splits, int64_t cols, int64_t rows, bool mean, T* out) {
  OASES_GRID_STRIDE(c, cols) {
    float t = 0.f;
    for (int64_t s = 0; s < splits; ++s) t += partial[s * cols + c];
    if (mean) t /= static_cast<float>(rows);
    out[c] = from_float<T>(t);
  }
}

template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, float* partial) {
  __shared__ float scratch[32];
  float s = 0.f;
  OASES_GRID_STRIDE(i, n) {
    float v = to_float(x[i]);
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(const float* partial, int64_t blocks, float* out) {
  __shared__ float scratch[32];
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] += s;
}

template <class T>
__global__ void finite_kernel(const T* x, int64_t n, int* flag) {
  OASES_GRID_STRIDE(i, n) {
    float v = to_float(x[i]);
    if (!isfinite(v)) *flag = 1;
  }
}

}  // namespace

void reduce(ReduceKind kind, Elem t, const void* in, const std::vector<int64_t>& shape, const std::vector<int64_t>& axes, void* out,
            cudaStream_t s) {
  std::vector<int64_t> kept_shape, kept_stride, red_shape, red_stride, st = row_major_strides(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    bool r = false;
    for (int64_t a : axes) r |= static_cast<size_t>(a) == d;
    (r ? red_shape : kept_shape).push_back(shape[d]);
    (r ? red_stride : kept_stride).push_back(st[d]);
  }
  NdPlan kp = make_plan(kept_shape, {kept_stride}, {});
  NdPlan rp = make_plan(red_shape, {red_stride}, {});
  if (kp.it.numel <= 0) return;
  const bool floating = t == Elem::kF32 || t == Elem::kF16 || t == Elem::kBF16;
  if ((kind == ReduceKind::kSum || kind == ReduceKind::kMean) && floating && kp.it.rank == 1 && kp.maps[0].stride[0] == 1 &&
      rp.it.rank == 1 && rp.maps[0].stride[0] == kp.it.numel && rp.it.numel >= 64) {
    const int64_t rows = rp.it.numel, cols = kp.it.numel, tiles = (cols + 31) / 32;
    // about 512 blocks in all, each at least 64 rows: the split depends on the shape only
    const int64_t splits = std::max<int64_t>(1, std::min<int64_t>((512 + tiles - 1) / tiles, rows / 64));
    const int64_t per = (rows + splits - 1) / splits;
    if (tiles <= 0x7fffffff && splits <= 65535) {
      float* partial = nullptr;
      OASES_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), static_cast<size_t>(splits * cols) * sizeof(float), s));
      dispatch_floating("Reduce", t, [&](auto tag) {
        using T = typename decltype(tag)::type;
        constexpr int64_t V = static_cast<int64_t>(16 / sizeof(T));
        if (cols % V == 0 && aligned16(in)) {  // 16-byte loads, the same splits and sums
          const int64_t vtiles = (cols / V + 31) / 32;
          column_partial_vec_kernel<T><<<dim3(static_cast<unsigned>(vtiles), static_cast<unsigned>(splits)), dim3(32, 8), 0, s>>>(
              static_cast<const T*>(in), rows, cols, per, partial);
          OASES_CUDA_CHECK_LAUNCH("column_partial_vec_kernel");
        } else {
          column_partial_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), dim3(32, 8), 0, s>>>(
              static_cast<const T*>(in), rows, cols, per, partial);
          OASES_CUDA_CHECK_LAUNCH("column_partial_kernel");
        }
        column_finish_kernel<T><<<grid_for(cols, kThreads), kThreads, 0, s>>>(partial, splits, cols, rows, kind == ReduceKind::kMean,
                                                                              static_cast<T*>(out));
        OASES_CUDA_CHECK_LAUNCH("column_finish_kernel");
      });
      OASES_CUDA_CHECK(cudaFreeAsync(partial, s));
      return;
    }
  }
  bool block = rp.it.numel >= 1024 && kind != ReduceKind::kProd && (t == Elem::kF32 || t == Elem::kF16 || t == Elem::kBF16) &&
               kp.it.numel <= 0x7fffffff;
  dispatch_numeric("Reduce", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (block) {
      if constexpr (std::is_same_v<typename Acc<T>::type, float>) {
        reduce_block_kernel<T><<<static_cast<unsigned>(kp.it.numel), 256, 0, s>>>(kind, static_cast<const T*>(in), static_cast<T*>(out),
                                                                                  kp.it, kp.maps[0], rp.it, rp.maps[0]);
      }
    } else {
      using C = std::conditional_t<std::is_same_v<typename Acc<T>::type, float>, float, double>;
      reduce_thread_kernel<T, C><<<grid_for(kp.it.numel, kThreads), kThreads, 0, s>>>(kind, static_cast<const T*>(in), static_cast<T*>(out),
                                                                                      kp.it, kp.maps[0], rp.it, rp.maps[0]);
    }
  });
  OASES_CUDA_CHECK_LAUNCH("reduce_kernel");
}

void sum_squares(Elem t, const void* x, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return;
  // two stages: partial sums per block (a fixed grid, so a fixed order), then one block adds them
  constexpr int kBlocks = 256;
  float* partial = nullptr;
  OASES_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), kBlocks * sizeof(float), s));
  dispatch_floating("sum_squares", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_squares_kernel<T><<<kBlocks, kThreads, 0, s>>>(static_cast<const T*>(x), n, partial);
  });
  OASES_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  sum_partials_kernel<<<1, kThreads, 0, s>>>(partial, kBlocks, out);
  OASES_CUDA_CHECK_LAUNCH("sum_partials_kernel");
  OASES_CUDA_CHECK(cudaFreeAsync(partial, s));
}

void check_finite(Elem t, const void* x, int64_t n, int* flag, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_floating("check_finite", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    finite_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(x), n, flag);
  });
  OASES_CUDA_CHECK_LAUNCH("finite_kernel");
}

}  // namespace oases::cuda
