// Embedding (Gather along one axis of a table viewed as [outer, dim, inner]), forward and backward:
//
//   forward   out[o, i, e] = table[o, idx_i − start, e]           (rows of other vocabulary shards: 0)
//   backward  dtable[o, r, e] = Σ_{i : idx_i − start = r} dy[o, i, e]
//
// The forward pass moves bits (any element size). The backward pass scatters with atomicAdd in
// fp32: the sum is exact up to the order of the additions, which the hardware picks, so its last
// bits can differ between runs (the CPU kernel adds in index order). fp16/bf16 tables accumulate in
// an fp32 buffer and are rounded once at the end.
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss.h"

namespace oases::cuda {

namespace {

__device__ __forceinline__ int64_t read_index(const void* p, bool idx64, int64_t i) {
  return idx64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// Row of the local table for index value v, or -1 (foreign shard), or -2 (out of range).
__device__ __forceinline__ int64_t local_row(int64_t v, int64_t start, int64_t dim, int64_t total) {
  if (v < 0) v += total;
  if (v < 0 || v >= total) return -2;
  v -= start;
  return v >= 0 && v < dim ? v : -1;
}

template <class B>
__global__ void gather_fwd_kernel(const B* data, const void* idx, bool idx64, int64_t nidx, B* out, int64_t outer, int64_t dim,
                                  int64_t inner, int64_t start, int64_t total, bool zero_foreign, Fault f) {
  int64_t n = outer * nidx * inner;
  OASES_GRID_STRIDE(t, n) {
    int64_t e = t % inner, i = (t / inner) % nidx, o = t / (inner * nidx);
    int64_t r = local_row(read_index(idx, idx64, i), start, dim, total);
    if (r == -2 || (r == -1 && !zero_foreign)) {
      atomicMin(f.slot, f.base + static_cast<unsigned long long>(i));
      out[t] = B(0);
    } else {
      out[t] = r < 0 ? B(0) : data[(o * dim + r) * inner + e];
    }
  }
}

template <class A>
__global__ void gather_bwd_kernel(const void* dy_raw, bool dy_is_acc, const void* idx, bool idx64, int64_t nidx, A* acc, int64_t outer,
                                  int64_t dim, int64_t inner, int64_t start, int64_t total, Fault f, int dy_kind) {
  int64_t n = outer * nidx * inner;
  OASES_GRID_STRIDE(t, n) {
    int64_t e = t % inner, i = (t / inner) % nidx, o = t / (inner * nidx);
    int64_t r = local_row(read_index(idx, idx64, i), start, dim, total);
    if (r == -2) {
      atomicMin(f.slot, f.base + static_cast<unsigned long long>(i));
      continue;
    }
    if (r < 0) continue;
    float g = dy_kind == 0   ? static_cast<const float*>(dy_raw)[t]
              : dy_kind == 1 ? __half2float(static_cast<const __half*>(dy_raw)[t])
                             : __bfloat162float(static_cast<const __nv_bfloat16*>(dy_raw)[t]);
    atomicAdd(&acc[(o * dim + r) * inner + e], g);
  }
}

template <class T>
__global__ void round_kernel(const float* acc, T* out, int64_t n) {
  OASES_GRID_STRIDE(i, n) {
    out[i] = from_float<T>(acc[i]);
  }
}

}  // namespace

void gather_forward(size_t es, const void* data, const void* idx, bool idx64, int64_t nidx, void* out, int64_t outer, int64_t dim,
                    int64_t inner, int64_t start, int64_t total, bool zero_foreign, Fault f, cudaStream_t s) {
  int64_t n = outer * nidx * inner;
  if (n <= 0) return;
  dispatch_bits(es, [&](auto tag) {
    using B = typename decltype(tag)::type;
    gather_fwd_kernel<B><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const B*>(data), idx, idx64, nidx, static_cast<B*>(out),
                                                                    outer, dim, inner, start, total, zero_foreign, f);
  });
  OASES_CUDA_CHECK_LAUNCH("gather_fwd_kernel");
}

void gather_backward(Elem t, const void* dy, const void* idx, bool idx64, int64_t nidx, void* ddata, int64_t outer, int64_t dim,
                     int64_t inner, int64_t start, int64_t total, float* scratch, Fault f, cudaStream_t s) {
  int64_t table = outer * dim * inner, n = outer * nidx * inner;
  if (table <= 0) return;
  int kind = t == Elem::kF32 ? 0 : t == Elem::kF16 ? 1 : t == Elem::kBF16 ? 2 : -1;
  if (kind < 0) unsupported("GatherGrad", t);
  float* acc = kind == 0 ? static_cast<float*>(ddata) : scratch;
  if (!acc) throw std::runtime_error("[cuda GatherGrad] a 16-bit table needs fp32 scratch");
  OASES_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(table) * sizeof(float), s));
  if (n > 0) {
    gather_bwd_kernel<float>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(dy, false, idx, idx64, nidx, acc, outer, dim, inner, start, total, f, kind);
    OASES_CUDA_CHECK_LAUNCH("gather_bwd_kernel");
  }
  if (kind == 1) round_kernel<__half><<<grid_for(table, kThreads), kThreads, 0, s>>>(acc, static_cast<__half*>(ddata), table);
  if (kind == 2) round_kernel<__nv_bfloat16><<<grid_for(table, kThreads), kThreads, 0, s>>>(acc, static_cast<__nv_bfloat16*>(ddata), table);
  OASES_CUDA_CHECK_LAUNCH("round_kernel");
}

}  // namespace oases::cuda
