// The project's own fused attention, forward and backward, per (batch, head):
//
//   forward   S = q kᵀ·scale (+ mask, causal) ; P = softmax(S) ; o = P v ; lse_i = log Σ_j exp S_ij
//   backward  P = exp(S − lse) (recomputed, never stored) ; D_i = Σ_e dO_ie O_ie
//             dV_j = Σ_i P_ij dO_i ;  dP_ij = dO_i·V_j ;  dS_ij = P_ij (dP_ij − D_i)
//             dQ_i = scale Σ_j dS_ij K_j ;  dK_j = scale Σ_i dS_ij Q_i
//
// One warp per query row in the forward pass (online softmax over the keys: running max m, running
// sum l, rescaled accumulator), one warp per query row for dQ and one warp per key row for dK and
// dV (looping over the query heads of its group and over the queries), so every sum is made by
// one warp in a fixed order: no atomics, deterministic. Lanes hold the head dimension in slices
// (D ≤ 256). A row that every key is masked from attends to nothing: out = 0, lse = +inf (as on
// the CPU). This is the fallback beside cuDNN, not a tuned flash kernel: K and V rows are read
// through the cache once per query row.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mask.cuh"
#include "kernels/cuda/common.cuh"

namespace oases::cuda {

namespace {

constexpr int kMaxPerLane = 8;  // head dims up to 256
constexpr int kWarpsPerBlock = 4;

struct Params {
  AttentionDesc a;
  int64_t group;  // query heads per key/value head
};

// Score with mask and causal limit applied; -inf where masked.
__device__ __forceinline__ float masked(const Params& p, int64_t b, int64_t h, int64_t i, int64_t j, float s) {
  return attention_masked(p.a, b, h, i, j, s);
}

// Lane-sliced dot product of a register row with a global row of length n.
template <class T>
__device__ __forceinline__ float dot_row(const float* reg, const T* row, int64_t n, int lane) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    int64_t e = lane + 32 * r;
    if (e < n) s += reg[r] * to_float(row[e]);
  }
  return warp_sum(s);
}

template <class T>
__device__ __forceinline__ void load_row(float* reg, const T* row, int64_t n, int lane, float mul = 1.f) {
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    int64_t e = lane + 32 * r;
    reg[r] = e < n ? to_float(row[e]) * mul : 0.f;
  }
}

template <class T>
__global__ void attn_fwd_kernel(Params p, const T* q, const T* k, const T* v, T* out, float* lse) {
  const AttentionDesc& a = p.a;
  int lane = threadIdx.x & 31;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);  // over B·H·Tq
  if (row >= a.batch * a.heads * a.tq) return;
  int64_t i = row % a.tq, bh = row / a.tq, b = bh / a.heads, h = bh % a.heads;
  int64_t kvh = b * a.kv_heads + h / p.group;
  float qr[kMaxPerLane], acc[kMaxPerLane];
  load_row(qr, q + row * a.d, a.d, lane, a.scale);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) acc[r] = 0.f;
  float m = -INFINITY, l = 0.f;
  int64_t jend = a.causal ? min(a.tk, i + (a.tk - a.tq) + 1) : a.tk;
  for (int64_t j = 0; j < jend; ++j) {
    float s = masked(p, b, h, i, j, dot_row(qr, k + (kvh * a.tk + j) * a.d, a.d, lane));
    if (s == -INFINITY) continue;
    float mn = fmaxf(m, s);
    float corr = expf(m - mn), w = expf(s - mn);  // m = -inf on the first key: corr = 0
    l = l * corr + w;
    const T* vr = v + (kvh * a.tk + j) * a.dv;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; ++r) {
      int64_t e = lane + 32 * r;
      acc[r] = acc[r] * corr + (e < a.dv ? w * to_float(vr[e]) : 0.f);
    }
    m = mn;
  }
  float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    int64_t e = lane + 32 * r;
    if (e < a.dv) out[row * a.dv + e] = from_float<T>(acc[r] * inv);
  }
  if (lse && lane == 0) lse[row] = l > 0.f ? m + logf(l) : INFINITY;
}

// D_i = Σ_e dO_ie O_ie, one warp per query row.
template <class T>
__global__ void attn_bwd_d_kernel(int64_t rows, int64_t dv, const T* dout, const T* out, float* dsum) {
  int lane = threadIdx.x & 31;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  float s = 0.f;
  for (int64_t e = lane; e < dv; e += 32) s += to_float(dout[row * dv + e]) * to_float(out[row * dv + e]);
  s = warp_sum(s);
  if (lane == 0) dsum[row] = s;
}

template <class T>
__global__ void attn_bwd_dq_kernel(Params p, const T* dout, const T* q, const T* k, const T* v, const float* lse, const float* dsum,
                                   T* dq) {
  const AttentionDesc& a = p.a;
  int lane = threadIdx.x & 31;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= a.batch * a.heads * a.tq) return;
  int64_t i = row % a.tq, bh = row / a.tq, b = bh / a.heads, h = bh % a.heads;
  int64_t kvh = b * a.kv_heads + h / p.group;
  float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane];
  load_row(qr, q + row * a.d, a.d, lane, a.scale);
  load_row(dor, dout + row * a.dv, a.dv, lane);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) acc[r] = 0.f;
  float l = lse[row], di = dsum[row];
  if (!isinf(l)) {
    int64_t jend = a.causal ? min(a.tk, i + (a.tk - a.tq) + 1) : a.tk;
    for (int64_t j = 0; j < jend; ++j) {
      const T* kr = k + (kvh * a.tk + j) * a.d;
      float s = masked(p, b, h, i, j, dot_row(qr, kr, a.d, lane));
      if (s == -INFINITY) continue;
      float pij = expf(s - l);
      float dp = dot_row(dor, v + (kvh * a.tk + j) * a.dv, a.dv, lane);
      float ds = pij * (dp - di) * a.scale;
#pragma unroll
      for (int r = 0; r < kMaxPerLane; ++r) {
        int64_t e = lane + 32 * r;
        if (e < a.d) acc[r] += ds * to_float(kr[e]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    int64_t e = lane + 32 * r;
    if (e < a.d) dq[row * a.d + e] = from_float<T>(acc[r]);
  }
}

template <class T>
__global__ void attn_bwd_dkv_kernel(Params p, const T* dout, const T* q, const T* k, const T* v, const float* lse, const float* dsum, T* dk,
                                    T* dv) {
  const AttentionDesc& a = p.a;
  int lane = threadIdx.x & 31;
  int64_t krow = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);  // over B·Hkv·Tk
  if (krow >= a.batch * a.kv_heads * a.tk) return;
  int64_t j = krow % a.tk, bkh = krow / a.tk, b = bkh / a.kv_heads, hk = bkh % a.kv_heads;
  float kr[kMaxPerLane], vr[kMaxPerLane], dka[kMaxPerLane], dva[kMaxPerLane];
  load_row(kr, k + krow * a.d, a.d, lane, a.scale);
  load_row(vr, v + krow * a.dv, a.dv, lane);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) dka[r] = dva[r] = 0.f;
  // causal: query i sees key j when j <= i + shift, i.e. i >= j - shift
  int64_t i0 = a.causal && j - (a.tk - a.tq) > 0 ? j - (a.tk - a.tq) : 0;
  for (int64_t hh = 0; hh < p.group; ++hh) {
    int64_t h = hk * p.group + hh;
    int64_t rbase = (b * a.heads + h) * a.tq;
    for (int64_t i = i0; i < a.tq; ++i) {
      int64_t row = rbase + i;
      float l = lse[row];
      if (isinf(l)) continue;
      const T* qrow = q + row * a.d;
      float s = masked(p, b, h, i, j, dot_row(kr, qrow, a.d, lane));
      if (s == -INFINITY) continue;
      float pij = expf(s - l);
      const T* dorow = dout + row * a.dv;
      float dp = dot_row(vr, dorow, a.dv, lane);
      float ds = pij * (dp - dsum[row]) * a.scale;
#pragma unroll
      for (int r = 0; r < kMaxPerLane; ++r) {
        int64_t e = lane + 32 * r;
        if (e < a.dv) dva[r] += pij * to_float(dorow[e]);
        if (e < a.d) dka[r] += ds * to_float(qrow[e]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    int64_t e = lane + 32 * r;
    if (e < a.d) dk[krow * a.d + e] = from_float<T>(dka[r]);
    if (e < a.dv) dv[krow * a.dv + e] = from_float<T>(dva[r]);
  }
}

Params check(const AttentionDesc& a) {
  if (a.d > 32 * kMaxPerLane || a.dv > 32 * kMaxPerLane) {
    throw std::runtime_error("[cuda attention] head dims " + std::to_string(a.d) + "/" + std::to_string(a.dv) +
                             " exceed the own kernel's 256");
  }
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0) throw std::runtime_error("[cuda attention] heads not a multiple of kv heads");
  if (a.strided) throw std::runtime_error("[cuda attention] the own kernels read contiguous tensors (the glue copies strided ones)");
  return Params{a, a.heads / a.kv_heads};
}

// dst[b, h, t, e] = src[b, h, t, e], each through its (batch, head, time) strides, e contiguous.
struct HeadCopy {
  int64_t dims[4];  // B, H, T, E
  int64_t src[3], dst[3];
};

template <class U>
__global__ void copy_heads_kernel(HeadCopy c, const U* src, U* dst) {
  const int64_t n = c.dims[0] * c.dims[1] * c.dims[2] * c.dims[3];
  OASES_GRID_STRIDE(i, n) {
    int64_t e = i % c.dims[3], r = i / c.dims[3];
    int64_t t = r % c.dims[2];
    r /= c.dims[2];
    int64_t h = r % c.dims[1], b = r / c.dims[1];
    dst[b * c.dst[0] + h * c.dst[1] + t * c.dst[2] + e] = src[b * c.src[0] + h * c.src[1] + t * c.src[2] + e];
  }
}

unsigned blocks_for(int64_t rows) {
  int64_t b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (b > 0x7fffffff) throw std::runtime_error("[cuda attention] too many rows");
  return static_cast<unsigned>(b);
}

}  // namespace

void attention_forward(const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out, float* lse, cudaStream_t s) {
  int64_t rows = a.batch * a.heads * a.tq;
  if (rows <= 0) return;
  Params p = check(a);
  dispatch_floating("Attention", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    attn_fwd_kernel<T><<<blocks_for(rows), 32 * kWarpsPerBlock, 0, s>>>(p, static_cast<const T*>(q), static_cast<const T*>(k),
                                                                        static_cast<const T*>(v), static_cast<T*>(out), lse);
  });
  OASES_CUDA_CHECK_LAUNCH("attn_fwd_kernel");
}

size_t attention_scratch_floats(const AttentionDesc& a) {
  return static_cast<size_t>(std::max<int64_t>(1, a.batch * a.heads * a.tq));
}

void attention_backward(const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v, const void* out,
                        const float* lse, void* dq, void* dk, void* dv, float* scratch, cudaStream_t s) {
  int64_t rows = a.batch * a.heads * a.tq, krows = a.batch * a.kv_heads * a.tk;
  if (rows <= 0 || krows <= 0) return;
  Params p = check(a);
  dispatch_floating("AttentionGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    attn_bwd_d_kernel<T>
        <<<blocks_for(rows), 32 * kWarpsPerBlock, 0, s>>>(rows, a.dv, static_cast<const T*>(dout), static_cast<const T*>(out), scratch);
    OASES_CUDA_CHECK_LAUNCH("attn_bwd_d_kernel");
    attn_bwd_dq_kernel<T><<<blocks_for(rows), 32 * kWarpsPerBlock, 0, s>>>(p, static_cast<const T*>(dout), static_cast<const T*>(q),
                                                                           static_cast<const T*>(k), static_cast<const T*>(v), lse, scratch,
                                                                           static_cast<T*>(dq));
    OASES_CUDA_CHECK_LAUNCH("attn_bwd_dq_kernel");
    attn_bwd_dkv_kernel<T><<<blocks_for(krows), 32 * kWarpsPerBlock, 0, s>>>(p, static_cast<const T*>(dout), static_cast<const T*>(q),
                                                                             static_cast<const T*>(k), static_cast<const T*>(v), lse,
                                                                             scratch, static_cast<T*>(dk), static_cast<T*>(dv));
    OASES_CUDA_CHECK_LAUNCH("attn_bwd_dkv_kernel");
  });
}

void attention_copy_heads(Elem t, const void* src, const int64_t src_strides[3], void* dst, const int64_t dst_strides[3], int64_t batch,
                          int64_t heads, int64_t time, int64_t width, cudaStream_t s) {
  HeadCopy c{{batch, heads, time, width}, {src_strides[0], src_strides[1], src_strides[2]}, {dst_strides[0], dst_strides[1], dst_strides[2]}};
  const int64_t n = batch * heads * time * width;
  if (n <= 0) return;
  dispatch_bits(elem_size(t), [&](auto tag) {
    using U = typename decltype(tag)::type;
    copy_heads_kernel<U><<<grid_for(n, kThreads), kThreads, 0, s>>>(c, static_cast<const U*>(src), static_cast<U*>(dst));
  });
  OASES_CUDA_CHECK_LAUNCH("copy_heads_kernel");
}

}  // namespace oases::cuda
