#include "kernels/cpu/nn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {

template <class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (inner == 1) {
    parallel_range(outer, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, n)), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const T* xr = x + o * n;
        T* yr = y + o * n;
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i]);
        if (m == -std::numeric_limits<T>::infinity()) m = 0;  // all masked: keep finite
        T sum = 0;
        if (log) {
          for (int64_t i = 0; i < n; ++i) sum += std::exp(xr[i] - m);
          T lse = m + std::log(sum);
          for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] - lse;
        } else {
          for (int64_t i = 0; i < n; ++i) {
            T e = std::exp(xr[i] - m);
            yr[i] = e;
            sum += e;
          }
          T inv = T(1) / sum;
          for (int64_t i = 0; i < n; ++i) yr[i] *= inv;
        }
      }
    });
    return;
  }
  parallel_range(outer * inner, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, n)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t o = t / inner, j = t % inner;
      const T* xr = x + o * n * inner + j;
      T* yr = y + o * n * inner + j;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i * inner]);
      if (m == -std::numeric_limits<T>::infinity()) m = 0;
      T sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += std::exp(xr[i * inner] - m);
      if (log) {
        T lse = m + std::log(sum);
        for (int64_t i = 0; i < n; ++i) yr[i * inner] = xr[i * inner] - lse;
      } else {
        for (int64_t i = 0; i < n; ++i) yr[i * inner] = std::exp(xr[i * inner] - m) / sum;
      }
    }
  });
}

template <class T>
void layernorm(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t rows, int64_t n, float eps) {
  parallel_range(rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, n)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      double mu, v = 0;
      if constexpr (std::is_same_v<T, float>) {
        mu = vec::sum_d(xr, n) / static_cast<double>(n);
        v = vec::sum_sq_dev_d(xr, n, mu);
      } else {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += static_cast<double>(xr[i]);
        mu = s / static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) {
          double d = static_cast<double>(xr[i]) - mu;
          v += d * d;
        }
      }
      double rs = 1.0 / std::sqrt(v / static_cast<double>(n) + static_cast<double>(eps));
      T m = static_cast<T>(mu), rr = static_cast<T>(rs);
      if (bias) {
        for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - m) * rr * scale[i] + bias[i];
      } else {
        for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - m) * rr * scale[i];
      }
      if (mean) mean[r] = static_cast<float>(mu);
      if (rstd) rstd[r] = static_cast<float>(rs);
    }
  });
}

template <class T>
void rmsnorm(const T* x, const T* scale, T* y, float* rstd, int64_t rows, int64_t n, float eps) {
  parallel_range(rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, n)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
      double rs = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps));
      T rr = static_cast<T>(rs);
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * rr * scale[i];
      if (rstd) rstd[r] = static_cast<float>(rs);
    }
  });
}

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

template <class T>
void attention_backward(const AttentionShape& s, const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse,
                        const void* mask, bool mask_is_bool, const int64_t* ms, T* dq, T* dk, T* dv) {
  const int64_t group = s.heads / s.kv_heads;
  // one item per (batch, kv head): dK and dV sum over the query heads of the group and over the
  // query blocks, in that fixed order
  parallel_for(s.batch * s.kv_heads, [&](int64_t gi) {
    thread_local std::vector<T> buf;
    T* P = scratch(buf, static_cast<size_t>(2 * kQueryBlock * s.tk + kQueryBlock));
    T* dP = P + kQueryBlock * s.tk;
    T* D = dP + kQueryBlock * s.tk;
    int64_t b = gi / s.kv_heads, hk = gi % s.kv_heads;
    const T* kp = k + gi * s.tk * s.d;
    const T* vp = v + gi * s.tk * s.dv;
    T* dkp = dk + gi * s.tk * s.d;
    T* dvp = dv + gi * s.tk * s.dv;
    std::fill(dkp, dkp + s.tk * s.d, T(0));
    std::fill(dvp, dvp + s.tk * s.dv, T(0));
    for (int64_t hh = 0; hh < group; ++hh) {
      int64_t h = hk * group + hh;
      int64_t t = b * s.heads + h;
      const T* qp = q + t * s.tq * s.d;
      const T* dop = dout + t * s.tq * s.dv;
      const T* op = out + t * s.tq * s.dv;
      T* dqp = dq + t * s.tq * s.d;
      for (int64_t i0 = 0; i0 < s.tq; i0 += kQueryBlock) {
        int64_t i1 = std::min(s.tq, i0 + kQueryBlock), rows = i1 - i0;
        int64_t kend = key_end(s, i1);
        if (kend == 0) {
          std::fill(dqp + i0 * s.d, dqp + i1 * s.d, T(0));
          continue;
        }
        scores_block(s, b, h, qp, s.d, kp, s.d, mask, mask_is_bool, ms, i0, i1, kend, P);
        for (int64_t i = i0; i < i1; ++i) {
          float l = lse[t * s.tq + i];
          T* row = P + (i - i0) * kend;
          if (std::isinf(l)) {
            std::fill(row, row + kend, T(0));
          } else {
            exp_shift(row, kend, static_cast<T>(l));
          }
          T acc = 0;
          for (int64_t e = 0; e < s.dv; ++e) acc += dop[i * s.dv + e] * op[i * s.dv + e];
          D[i - i0] = acc;
        }
        // dV += Pᵀ dO
        gemm<T>(true, false, kend, s.dv, rows, T(1), P, kend, dop + i0 * s.dv, s.dv, T(1), dvp, s.dv);
        // dP = dO Vᵀ ; dS = P ∘ (dP − D)
        gemm<T>(false, true, rows, kend, s.dv, T(1), dop + i0 * s.dv, s.dv, vp, s.dv, T(0), dP, kend);
        for (int64_t r = 0; r < rows; ++r) {
          T* dpr = dP + r * kend;
          const T* pr = P + r * kend;
          for (int64_t j = 0; j < kend; ++j) dpr[j] = pr[j] * (dpr[j] - D[r]);
        }
        // dQ = scale dS K ; dK += scale dSᵀ Q
        gemm<T>(false, false, rows, s.d, kend, static_cast<T>(s.scale), dP, kend, kp, s.d, T(0), dqp + i0 * s.d, s.d);
        gemm<T>(true, false, kend, s.d, rows, static_cast<T>(s.scale), dP, kend, qp + i0 * s.d, s.d, T(1), dkp, s.d);
      }
    }
  });
}

template void attention<float>(const AttentionShape&, const float*, const float*, const float*, const void*, bool, const int64_t*, float*,
                               float*, const AttentionLayout*);
template void attention<double>(const AttentionShape&, const double*, const double*, const double*, const void*, bool, const int64_t*,
                                double*, float*, const AttentionLayout*);
template void attention_backward<float>(const AttentionShape&, const float*, const float*, const float*, const float*, const float*,
                                        const float*, const void*, bool, const int64_t*, float*, float*, float*);
template void attention_backward<double>(const AttentionShape&, const double*, const double*, const double*, const double*, const double*,
                                         const float*, const void*, bool, const int64_t*, double*, double*, double*);

template <class T>
int64_t softmax_cross_entropy(const T* scores, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d,
                              int64_t ignore_index, T* losses, T* logp, double* weight_sum) {
  for (int64_t i = 0; i < n * d; ++i) {
    int64_t l = labels[i];
    if (l != ignore_index && (l < 0 || l >= c)) return -(1 + i);
  }
  // rows in parallel (each writes only its own loss and log-probabilities), counts after
  parallel_range(n * d, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, c)), [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      int64_t i = s / d, j = s % d;
      const T* x = scores + i * c * d + j;
      T lse;
      if constexpr (std::is_same_v<T, float>) {
        if (d == 1) {
          float m = vec::row_max(x, c);
          lse = m + static_cast<float>(std::log(vec::row_exp_sum(x, c, m, nullptr)));
        }
      }
      if (!std::is_same_v<T, float> || d != 1) {
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t a = 0; a < c; ++a) m = std::max(m, x[a * d]);
        double sum = 0;
        for (int64_t a = 0; a < c; ++a) sum += std::exp(static_cast<double>(x[a * d] - m));
        lse = m + static_cast<T>(std::log(sum));
      }
      if (logp) {
        for (int64_t a = 0; a < c; ++a) logp[i * c * d + a * d + j] = x[a * d] - lse;
      }
      int64_t l = labels[s];
      losses[s] = l == ignore_index ? T(0) : -(x[l * d] - lse) * (weights ? weights[l] : T(1));
    }
  });
  int64_t counted = 0;
  double wsum = 0;
  for (int64_t s = 0; s < n * d; ++s) {
    int64_t l = labels[s];
    if (l == ignore_index) continue;
    wsum += weights ? static_cast<double>(weights[l]) : 1.0;
    ++counted;
  }
  if (weight_sum) *weight_sum = wsum;
  return counted;
}

template void softmax<float>(const float*, float*, int64_t, int64_t, int64_t, bool);
template void softmax<double>(const double*, double*, int64_t, int64_t, int64_t, bool);
template void layernorm<float>(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, float);
template void layernorm<double>(const double*, const double*, const double*, double*, float*, float*, int64_t, int64_t, float);
template void rmsnorm<float>(const float*, const float*, float*, float*, int64_t, int64_t, float);
template void rmsnorm<double>(const double*, const double*, double*, float*, int64_t, int64_t, float);
template int64_t softmax_cross_entropy<float>(const float*, const int64_t*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                              float*, double*);
template int64_t softmax_cross_entropy<double>(const double*, const int64_t*, const double*, int64_t, int64_t, int64_t, int64_t, double*,
                                               double*, double*);

}  // namespace oases::kernels
