// Attention through batched matrix products (cuBLAS, the tensor cores) and row kernels, the same
// math as the own fused kernels (attention.cu) and the same outputs (out, lse; dq, dk, dv):
//
//   forward   S = scale·q kᵀ (fp32, + mask, causal) ; P = softmax(S) ; out = P v ; lse = log Σ exp S
//   backward  S again ; P = exp(S − lse) ; dv = Pᵀ dO ; dP = dO vᵀ (fp32) ;
//             dS = scale·P (dP − D), D_i = Σ_e dO_ie out_ie ; dq = dS k ; dk = dSᵀ q
//
// The query heads that share a key/value head are consecutive in q [B, H, Tq, D], so each
// (batch, key/value head) is one product of a [group·Tq, D] block with a [Tk, D] one: one strided
// batch over B·Hkv covers grouped-query attention, and dk/dv come out summed over the group.
// Scores and their gradients are fp32. For fp16/bf16 the products with P and dS take them as a
// pair of operand-type matrices, hi = round(x) and lo = round(x − hi), summed into an fp32 result
// (two tensor-core products instead of one): P and dS keep about 16 mantissa bits, so the path is
// as accurate as the own kernels' fp32 arithmetic, where rounding P and dS once (flash
// attention's choice) loses a visible part of dq in bf16. The score matrices live in stream-ordered scratch, made for a slice
// of the (batch, key/value head) pairs at a time, kept under kScratchBudget. cuBLAS runs without
// a workspace (deterministic), the row kernels sum in a fixed order: no atomics.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mask.cuh"
#include "kernels/cuda/common.cuh"

namespace oases::cuda {

namespace {

constexpr size_t kScratchBudget = size_t(1) << 30;

struct Rows {
  AttentionDesc a;
  int64_t row0;  // global row (over B·H·Tq) of the slice's first row
};

__device__ __forceinline__ void row_coords(const Rows& r, int64_t local, int64_t* b, int64_t* h, int64_t* i) {
  int64_t row = r.row0 + local, bh = row / r.a.tq;
  *i = row % r.a.tq;
  *b = bh / r.a.heads;
  *h = bh % r.a.heads;
}

// x as hi (+ lo when lo is not null: the rounding error of hi, in the same type).
template <class T>
__device__ __forceinline__ void store_split(T* hi, T* lo, int64_t j, float x) {
  T h = from_float<T>(x);
  hi[j] = h;
  if (lo) lo[j] = from_float<T>(x - to_float(h));
}

// Forward: one block per row. S (fp32, scaled) -> P in the operand type, lse.
template <class T>
__global__ void softmax_rows_kernel(Rows r, const float* s, T* p, T* plo, float* lse) {
  __shared__ float red[32];
  const AttentionDesc& a = r.a;
  int64_t b, h, i;
  row_coords(r, blockIdx.x, &b, &h, &i);
  const float* sr = s + static_cast<int64_t>(blockIdx.x) * a.tk;
  T* pr = p + static_cast<int64_t>(blockIdx.x) * a.tk;
  T* plr = plo ? plo + static_cast<int64_t>(blockIdx.x) * a.tk : nullptr;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) m = fmaxf(m, attention_masked(a, b, h, i, j, sr[j]));
  m = block_max(m, red);
  float l = 0.f;
  if (m != -INFINITY) {
    for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) l += expf(attention_masked(a, b, h, i, j, sr[j]) - m);
  }
  l = block_sum(l, red);
  float inv = l > 0.f ? 1.f / l : 0.f;
  for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
    float x = attention_masked(a, b, h, i, j, sr[j]);
    store_split(pr, plr, j, l > 0.f && x != -INFINITY ? expf(x - m) * inv : 0.f);
  }
  if (lse && threadIdx.x == 0) lse[r.row0 + blockIdx.x] = l > 0.f ? m + logf(l) : INFINITY;
}

// Backward, first half: S -> P = exp(S − lse) (fp32, in place) and P in the operand type.
template <class T>
__global__ void probs_rows_kernel(Rows r, float* s, T* p, T* plo, const float* lse) {
  const AttentionDesc& a = r.a;
  int64_t b, h, i;
  row_coords(r, blockIdx.x, &b, &h, &i);
  float l = lse[r.row0 + blockIdx.x];
  float* sr = s + static_cast<int64_t>(blockIdx.x) * a.tk;
  T* pr = p + static_cast<int64_t>(blockIdx.x) * a.tk;
  T* plr = plo ? plo + static_cast<int64_t>(blockIdx.x) * a.tk : nullptr;
  for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
    float x = attention_masked(a, b, h, i, j, sr[j]);
    float v = isinf(l) || x == -INFINITY ? 0.f : expf(x - l);
    sr[j] = v;
    store_split(pr, plr, j, v);
  }
}

// Backward, second half: dS = scale·P (dP − D) in the operand type, D_i = Σ_e dO_ie out_ie.
template <class T>
__global__ void dscores_rows_kernel(Rows r, const float* pf, const float* dp, const T* dout, const T* out, T* ds, T* dslo) {
  __shared__ float red[32];
  const AttentionDesc& a = r.a;
  int64_t row = blockIdx.x;
  float d = 0.f;
  for (int64_t e = threadIdx.x; e < a.dv; e += blockDim.x) d += to_float(dout[row * a.dv + e]) * to_float(out[row * a.dv + e]);
  d = block_sum(d, red);
  const float* prow = pf + row * a.tk;
  const float* dprow = dp + row * a.tk;
  T* dsr = ds + row * a.tk;
  T* dslr = dslo ? dslo + row * a.tk : nullptr;
  for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) store_split(dsr, dslr, j, a.scale * prow[j] * (dprow[j] - d));
}

template <class T>
__global__ void to_type_kernel(int64_t n, const float* x, T* y) {
  OASES_GRID_STRIDE(i, n) y[i] = from_float<T>(x[i]);
}

int64_t group_of(const AttentionDesc& a) {
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0) throw std::runtime_error("[cuda attention] heads not a multiple of kv heads");
  return a.heads / a.kv_heads;
}

bool split(Elem t) {
  return t != Elem::kF32;
}

// fp32 result cells per pair for a split product's output (the largest of out/dq, dk, dv).
int64_t result_cells(const AttentionDesc& a) {
  return std::max(group_of(a) * a.tq, a.tk) * std::max(a.d, a.dv);
}

// Bytes of scratch per (batch, key/value head) pair: fp32 scores (and, backward, fp32 dP), the
// operand-type probabilities (hi and lo when split) and an fp32 result block when split.
size_t pair_bytes(const AttentionDesc& a, Elem t, bool backward) {
  size_t cells = static_cast<size_t>(group_of(a) * a.tq * a.tk);
  size_t bytes = cells * (sizeof(float) * (backward ? 2 : 1) + elem_size(t) * (split(t) ? 2 : 1));
  return bytes + (split(t) ? static_cast<size_t>(result_cells(a)) * sizeof(float) : 0);
}

// Pairs per slice under the budget (at least 1).
int64_t pairs_per_slice(const AttentionDesc& a, Elem t, bool backward) {
  int64_t pairs = a.batch * a.kv_heads;
  return std::max<int64_t>(1, std::min<int64_t>(pairs, static_cast<int64_t>(kScratchBudget / pair_bytes(a, t, backward))));
}

unsigned grid_rows(int64_t rows) {
  if (rows > 0x7fffffff) throw std::runtime_error("[cuda attention] too many rows in a slice");
  return static_cast<unsigned>(rows);
}

// Strided batch over `n` pairs of a row-major product [m, k] x [k, n] (op applied per flag).
GemmDesc product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t pairs, int64_t sa,
                 int64_t sb, int64_t sc, float alpha = 1.f) {
  GemmDesc d;
  d.trans_a = ta;
  d.trans_b = tb;
  d.m = m;
  d.n = n;
  d.k = k;
  d.lda = lda;
  d.ldb = ldb;
  d.ldc = ldc;
  d.batch = pairs;
  d.stride_a = sa;
  d.stride_b = sb;
  d.stride_c = sc;
  d.alpha = alpha;
  return d;
}

// C (type t) = op(A) op(B) where A is given as hi (+ lo): with lo, both products accumulate into
// the fp32 block `acc` (n_out cells), which is then rounded into C once.
void split_product(BlasHandles& h, Elem t, const GemmDesc& d, const void* hi, const void* lo, const void* b, void* c, float* acc,
                   int64_t n_out) {
  if (!lo) {
    gemm(h, t, d, hi, b, c);
    return;
  }
  GemmDesc f = d;
  gemm_ex(h, t, Elem::kF32, f, hi, b, acc);
  f.beta = 1.f;
  gemm_ex(h, t, Elem::kF32, f, lo, b, acc);
  dispatch_floating("Attention", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n_out + kThreads - 1) / kThreads, 65535));
    to_type_kernel<T><<<blocks, kThreads, 0, h.stream()>>>(n_out, acc, static_cast<T*>(c));
  });
  OASES_CUDA_CHECK_LAUNCH("to_type_kernel");
}

}  // namespace

bool attention_gemm_applies(const AttentionDesc& a, Elem t) {
  if (t != Elem::kF32 && t != Elem::kF16 && t != Elem::kBF16) return false;
  if (a.strided) return false;  // contiguous tensors only (the glue copies strided ones)
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.tq <= 0 || a.tk <= 0 || a.d <= 0 || a.dv <= 0) return false;
  // one pair's score matrices must fit the budget
  return pair_bytes(a, t, true) <= kScratchBudget;
}

size_t attention_gemm_scratch_bytes(const AttentionDesc& a, Elem t, bool backward) {
  return static_cast<size_t>(pairs_per_slice(a, t, backward)) * pair_bytes(a, t, backward);
}

void attention_gemm_forward(BlasHandles& h, const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out, float* lse,
                            void* scratch) {
  int64_t g = group_of(a), pairs = a.batch * a.kv_heads, per = pairs_per_slice(a, t, false);
  int64_t gq = g * a.tq, es = static_cast<int64_t>(elem_size(t));
  float* s = static_cast<float*>(scratch);
  char* p = reinterpret_cast<char*>(s + per * gq * a.tk);
  char* plo = split(t) ? p + per * gq * a.tk * es : nullptr;
  float* acc = split(t) ? reinterpret_cast<float*>(plo + per * gq * a.tk * es) : nullptr;
  for (int64_t p0 = 0; p0 < pairs; p0 += per) {
    int64_t n = std::min(per, pairs - p0);
    const char* qs = static_cast<const char*>(q) + p0 * gq * a.d * es;
    const char* ks = static_cast<const char*>(k) + p0 * a.tk * a.d * es;
    const char* vs = static_cast<const char*>(v) + p0 * a.tk * a.dv * es;
    char* os = static_cast<char*>(out) + p0 * gq * a.dv * es;
    gemm_ex(h, t, Elem::kF32, product(false, true, gq, a.tk, a.d, a.d, a.d, a.tk, n, gq * a.d, a.tk * a.d, gq * a.tk, a.scale), qs, ks, s);
    Rows r{a, p0 * gq};
    dispatch_floating("Attention", t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      softmax_rows_kernel<T><<<grid_rows(n * gq), kThreads, 0, h.stream()>>>(r, s, reinterpret_cast<T*>(p), reinterpret_cast<T*>(plo), lse);
    });
    OASES_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
    split_product(h, t, product(false, false, gq, a.dv, a.tk, a.tk, a.dv, a.dv, n, gq * a.tk, a.tk * a.dv, gq * a.dv), p, plo, vs, os, acc,
                  n * gq * a.dv);
  }
}

void attention_gemm_backward(BlasHandles& h, const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const float* lse, void* dq, void* dk, void* dv, void* scratch) {
  int64_t g = group_of(a), pairs = a.batch * a.kv_heads, per = pairs_per_slice(a, t, true);
  int64_t gq = g * a.tq, es = static_cast<int64_t>(elem_size(t));
  float* s = static_cast<float*>(scratch);
  float* dp = s + per * gq * a.tk;
  char* p = reinterpret_cast<char*>(dp + per * gq * a.tk);  // P, then dS, in the operand type
  char* plo = split(t) ? p + per * gq * a.tk * es : nullptr;
  float* acc = split(t) ? reinterpret_cast<float*>(plo + per * gq * a.tk * es) : nullptr;
  for (int64_t p0 = 0; p0 < pairs; p0 += per) {
    int64_t n = std::min(per, pairs - p0);
    auto at = [&](const void* base, int64_t elems) { return static_cast<const char*>(base) + p0 * elems * es; };
    auto at_mut = [&](void* base, int64_t elems) { return static_cast<char*>(base) + p0 * elems * es; };
    const char *qs = at(q, gq * a.d), *ks = at(k, a.tk * a.d), *vs = at(v, a.tk * a.dv);
    const char *dos = at(dout, gq * a.dv), *os = at(out, gq * a.dv);
    char *dqs = at_mut(dq, gq * a.d), *dks = at_mut(dk, a.tk * a.d), *dvs = at_mut(dv, a.tk * a.dv);
    Rows r{a, p0 * gq};
    gemm_ex(h, t, Elem::kF32, product(false, true, gq, a.tk, a.d, a.d, a.d, a.tk, n, gq * a.d, a.tk * a.d, gq * a.tk, a.scale), qs, ks, s);
    dispatch_floating("AttentionGrad", t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      probs_rows_kernel<T><<<grid_rows(n * gq), kThreads, 0, h.stream()>>>(r, s, reinterpret_cast<T*>(p), reinterpret_cast<T*>(plo), lse);
    });
    OASES_CUDA_CHECK_LAUNCH("probs_rows_kernel");
    // dv = Pᵀ dO: [Tk, group·Tq] x [group·Tq, Dv], summed over the group's heads
    split_product(h, t, product(true, false, a.tk, a.dv, gq, a.tk, a.dv, a.dv, n, gq * a.tk, gq * a.dv, a.tk * a.dv), p, plo, dos, dvs, acc,
                  n * a.tk * a.dv);
    // dP = dO vᵀ (fp32)
    gemm_ex(h, t, Elem::kF32, product(false, true, gq, a.tk, a.dv, a.dv, a.dv, a.tk, n, gq * a.dv, a.tk * a.dv, gq * a.tk), dos, vs, dp);
    dispatch_floating("AttentionGrad", t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      dscores_rows_kernel<T><<<grid_rows(n * gq), kThreads, 0, h.stream()>>>(
          r, s, dp, reinterpret_cast<const T*>(dos), reinterpret_cast<const T*>(os), reinterpret_cast<T*>(p), reinterpret_cast<T*>(plo));
    });
    OASES_CUDA_CHECK_LAUNCH("dscores_rows_kernel");
    // dq = dS k ; dk = dSᵀ q (summed over the group's heads)
    split_product(h, t, product(false, false, gq, a.d, a.tk, a.tk, a.d, a.d, n, gq * a.tk, a.tk * a.d, gq * a.d), p, plo, ks, dqs, acc,
                  n * gq * a.d);
    split_product(h, t, product(true, false, a.tk, a.d, gq, a.tk, a.d, a.d, n, gq * a.tk, gq * a.d, a.tk * a.d), p, plo, qs, dks, acc,
                  n * a.tk * a.d);
  }
}

}  // namespace oases::cuda
