#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {

namespace {

// Query rows per work item of the attention kernels: causal items compute scores only up to the
// last key their rows may see, so about half of S is never formed. Small blocks also keep the
// products within OpenBLAS's small-matrix path (no packing): with GPT-2's 128 x 64 heads, 16 rows
// ran attention ~10% faster than 32 and 2-4x faster than 64-128.
constexpr int64_t kQueryBlock = 16;

// Per-thread scratch that keeps its memory between calls.
template <class T>
T* scratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Keys [0, kend) that rows [i0, i1) may attend to.
inline int64_t key_end(const AttentionShape& s, int64_t i1) {
  return s.causal ? std::max<int64_t>(0, std::min(s.tk, i1 + (s.tk - s.tq))) : s.tk;
}

// row[j] = exp(row[j] - m) for j < n; returns the sum.
inline float exp_shift_sum(float* row, int64_t n, float m) {
  int64_t j = 0;
  float sum = 0.f;
#ifdef OASES_VEC_AVX2
  __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    __m256 e = vec::exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv));
    _mm256_storeu_ps(row + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; j < n; ++j) {
    row[j] = vec::exp1(row[j] - m);
    sum += row[j];
  }
  return sum;
}
inline double exp_shift_sum(double* row, int64_t n, double m) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - m);
    sum += row[j];
  }
  return sum;
}
inline void exp_shift(float* row, int64_t n, float m) {
  int64_t j = 0;
#ifdef OASES_VEC_AVX2
  __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, vec::exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv)));
#endif
  for (; j < n; ++j) row[j] = vec::exp1(row[j] - m);
}
inline void exp_shift(double* row, int64_t n, double m) {
  for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - m);
}

// S[i - i0, j] for rows [i0, i1) and keys [0, kend): scale·q kᵀ, mask, causal limit (−inf).
// q points at row 0 of the head (row stride ldq), k at key 0 (row stride ldk).
template <class T>
void scores_block(const AttentionShape& s, int64_t b, int64_t h, const T* qp, int64_t ldq, const T* kp, int64_t ldk, const void* mask,
                  bool mask_is_bool, const int64_t* ms, int64_t i0, int64_t i1, int64_t kend, T* S) {
  gemm<T>(false, true, i1 - i0, kend, s.d, static_cast<T>(s.scale), qp + i0 * ldq, ldq, kp, ldk, T(0), S, kend);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t shift = s.tk - s.tq;
  for (int64_t i = i0; i < i1; ++i) {
    T* row = S + (i - i0) * kend;
    if (mask) {
      int64_t base = b * ms[0] + h * ms[1] + i * ms[2];
      if (mask_is_bool) {
        const uint8_t* mp = static_cast<const uint8_t*>(mask) + base;
        for (int64_t j = 0; j < kend; ++j) {
          if (!mp[j * ms[3]]) row[j] = neg_inf;
        }
      } else {
        const float* mp = static_cast<const float*>(mask) + base;
        for (int64_t j = 0; j < kend; ++j) row[j] += static_cast<T>(mp[j * ms[3]]);
      }
    }
    if (s.causal) {
      int64_t limit = std::max<int64_t>(0, std::min(kend, i + shift + 1));
      for (int64_t j = limit; j < kend; ++j) row[j] = neg_inf;
    }
  }
}

}  // namespace

AttentionLayout AttentionLayout::contiguous(const AttentionShape& s) {
  return AttentionLayout{{s.heads * s.tq * s.d, s.tq * s.d, s.d},
                         {s.kv_heads * s.tk * s.d, s.tk * s.d, s.d},
                         {s.kv_heads * s.tk * s.dv, s.tk * s.dv, s.dv},
                         {s.heads * s.tq * s.dv, s.tq * s.dv, s.dv}};
}

template <class T>
void attention(const AttentionShape& s, const T* q, const T* k, const T* v, const void* mask, bool mask_is_bool, const int64_t* ms, T* out,
               float* lse, const AttentionLayout* layout) {
  const AttentionLayout L = layout ? *layout : AttentionLayout::contiguous(s);
  const int64_t group = s.heads / s.kv_heads;
  const int64_t blocks = (s.tq + kQueryBlock - 1) / kQueryBlock;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  // one item per (batch, head, block of query rows)
  parallel_for(s.batch * s.heads * blocks, [&](int64_t item) {
    thread_local std::vector<T> buf;
    int64_t t = item / blocks, blk = item % blocks;
    int64_t b = t / s.heads, h = t % s.heads, hk = h / group;
    int64_t i0 = blk * kQueryBlock, i1 = std::min(s.tq, i0 + kQueryBlock);
    int64_t kend = key_end(s, i1);
    T* o = out + b * L.o[0] + h * L.o[1] + i0 * L.o[2];
    if (kend == 0) {  // no key visible to any row
      for (int64_t i = i0; i < i1; ++i) std::fill(o + (i - i0) * L.o[2], o + (i - i0) * L.o[2] + s.dv, T(0));
      if (lse) std::fill(lse + t * s.tq + i0, lse + t * s.tq + i1, std::numeric_limits<float>::infinity());
      return;
    }
    const T* qp = q + b * L.q[0] + h * L.q[1];
    const T* kp = k + b * L.k[0] + hk * L.k[1];
    const T* vp = v + b * L.v[0] + hk * L.v[1];
    T* P = scratch(buf, static_cast<size_t>((i1 - i0) * kend));
    scores_block(s, b, h, qp, L.q[2], kp, L.k[2], mask, mask_is_bool, ms, i0, i1, kend, P);
    for (int64_t i = i0; i < i1; ++i) {
      T* row = P + (i - i0) * kend;
      T m = neg_inf;
      for (int64_t j = 0; j < kend; ++j) m = std::max(m, row[j]);
      if (m == neg_inf) {  // a fully masked row attends to nothing
        std::fill(row, row + kend, T(0));
        if (lse) lse[t * s.tq + i] = std::numeric_limits<float>::infinity();
        continue;
      }
      T sum = exp_shift_sum(row, kend, m);
      T inv = T(1) / sum;
      for (int64_t j = 0; j < kend; ++j) row[j] *= inv;
      if (lse) lse[t * s.tq + i] = static_cast<float>(m + std::log(sum));
    }
    gemm<T>(false, false, i1 - i0, s.dv, kend, T(1), P, kend, vp, L.v[2], T(0), o, L.o[2]);
  });
}

AttentionGradLayout AttentionGradLayout::contiguous(const AttentionShape& s) {
  const AttentionLayout c = AttentionLayout::contiguous(s);
  AttentionGradLayout g;
  for (int i = 0; i < 3; ++i) {
    g.q[i] = g.dq[i] = c.q[i];
    g.k[i] = g.dk[i] = c.k[i];
    g.v[i] = g.dv[i] = c.v[i];
    g.o[i] = g.dout[i] = c.o[i];
  }
  return g;
}

template <class T>
void attention_backward(const AttentionShape& s, const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse,
                        const void* mask, bool mask_is_bool, const int64_t* ms, T* dq, T* dk, T* dv, const AttentionGradLayout* layout) {
  const AttentionGradLayout L = layout ? *layout : AttentionGradLayout::contiguous(s);
  const int64_t group = s.heads / s.kv_heads;
  // one item per (batch, kv head): dK and dV sum over the query heads of the group and over the
  // query blocks, in that fixed order
  parallel_for(s.batch * s.kv_heads, [&](int64_t gi) {
    thread_local std::vector<T> buf;
    T* P = scratch(buf, static_cast<size_t>(2 * kQueryBlock * s.tk + kQueryBlock));
    T* dP = P + kQueryBlock * s.tk;
    T* D = dP + kQueryBlock * s.tk;
    int64_t b = gi / s.kv_heads, hk = gi % s.kv_heads;
    const T* kp = k + b * L.k[0] + hk * L.k[1];
    const T* vp = v + b * L.v[0] + hk * L.v[1];
    T* dkp = dk + b * L.dk[0] + hk * L.dk[1];
    T* dvp = dv + b * L.dv[0] + hk * L.dv[1];
    for (int64_t j = 0; j < s.tk; ++j) {
      std::fill(dkp + j * L.dk[2], dkp + j * L.dk[2] + s.d, T(0));
      std::fill(dvp + j * L.dv[2], dvp + j * L.dv[2] + s.dv, T(0));
    }
    for (int64_t hh = 0; hh < group; ++hh) {
      int64_t h = hk * group + hh;
      int64_t t = b * s.heads + h;
      const T* qp = q + b * L.q[0] + h * L.q[1];
      const T* dop = dout + b * L.dout[0] + h * L.dout[1];
      const T* op = out + b * L.o[0] + h * L.o[1];
      T* dqp = dq + b * L.dq[0] + h * L.dq[1];
      for (int64_t i0 = 0; i0 < s.tq; i0 += kQueryBlock) {
        int64_t i1 = std::min(s.tq, i0 + kQueryBlock), rows = i1 - i0;
        int64_t kend = key_end(s, i1);
        if (kend == 0) {
          for (int64_t i = i0; i < i1; ++i) std::fill(dqp + i * L.dq[2], dqp + i * L.dq[2] + s.d, T(0));
          continue;
        }
        scores_block(s, b, h, qp, L.q[2], kp, L.k[2], mask, mask_is_bool, ms, i0, i1, kend, P);
        for (int64_t i = i0; i < i1; ++i) {
          float l = lse[t * s.tq + i];
          T* row = P + (i - i0) * kend;
          if (std::isinf(l)) {
            std::fill(row, row + kend, T(0));
          } else {
            exp_shift(row, kend, static_cast<T>(l));
          }
          T acc = 0;
          const T* dor = dop + i * L.dout[2];
          const T* orow = op + i * L.o[2];
          for (int64_t e = 0; e < s.dv; ++e) acc += dor[e] * orow[e];
          D[i - i0] = acc;
        }
        // dV += Pᵀ dO
        gemm<T>(true, false, kend, s.dv, rows, T(1), P, kend, dop + i0 * L.dout[2], L.dout[2], T(1), dvp, L.dv[2]);
        // dP = dO Vᵀ ; dS = P ∘ (dP − D)
        gemm<T>(false, true, rows, kend, s.dv, T(1), dop + i0 * L.dout[2], L.dout[2], vp, L.v[2], T(0), dP, kend);
        for (int64_t r = 0; r < rows; ++r) {
          T* dpr = dP + r * kend;
          const T* pr = P + r * kend;
          for (int64_t j = 0; j < kend; ++j) dpr[j] = pr[j] * (dpr[j] - D[r]);
        }
        // dQ = scale dS K ; dK += scale dSᵀ Q
        gemm<T>(false, false, rows, s.d, kend, static_cast<T>(s.scale), dP, kend, kp, L.k[2], T(0), dqp + i0 * L.dq[2], L.dq[2]);
        gemm<T>(true, false, kend, s.d, rows, static_cast<T>(s.scale), dP, kend, qp + i0 * L.q[2], L.q[2], T(1), dkp, L.dk[2]);
      }
    }
  });
}

template void attention<float>(const AttentionShape&, const float*, const float*, const float*, const void*, bool, const int64_t*, float*,
                               float*, const AttentionLayout*);
template void attention<double>(const AttentionShape&, const double*, const double*, const double*, const void*, bool, const int64_t*,
                                double*, float*, const AttentionLayout*);
template void attention_backward<float>(const AttentionShape&, const float*, const float*, const float*, const float*, const float*,
                                        const float*, const void*, bool, const int64_t*, float*, float*, float*,
                                        const AttentionGradLayout*);
template void attention_backward<double>(const AttentionShape&, const double*, const double*, const double*, const double*, const double*,
                                         const float*, const void*, bool, const int64_t*, double*, double*, double*,
                                         const AttentionGradLayout*);

}  // namespace oases::kernels
