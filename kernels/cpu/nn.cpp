#include "kernels/cpu/nn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace oases::kernels {

template <class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (outer * n > (1 << 14) && outer > 1)
    for (int64_t o = 0; o < outer; ++o) {
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
    return;
  }
#pragma omp parallel for schedule(static) if (outer * n * inner > (1 << 14))
  for (int64_t t = 0; t < outer * inner; ++t) {
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
}

template <class T>
void layernorm(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t rows, int64_t n,
               float eps) {
#pragma omp parallel for schedule(static) if (rows * n > (1 << 14) && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(xr[i]);
    double mu = s / static_cast<double>(n);
    double v = 0;
    for (int64_t i = 0; i < n; ++i) {
      double d = static_cast<double>(xr[i]) - mu;
      v += d * d;
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
}

template <class T>
void rmsnorm(const T* x, const T* scale, T* y, float* rstd, int64_t rows, int64_t n, float eps) {
#pragma omp parallel for schedule(static) if (rows * n > (1 << 14) && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * static_cast<double>(xr[i]);
    double rs = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(eps));
    T rr = static_cast<T>(rs);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * rr * scale[i];
    if (rstd) rstd[r] = static_cast<float>(rs);
  }
}

namespace {

// Scores of one head with scale, mask and causal limit applied: S[i, j] (−inf where masked).
template <class T>
void attention_scores(const AttentionShape& s, int64_t b, int64_t h, const T* qp, const T* kp, const void* mask,
                      bool mask_is_bool, const int64_t* ms, T* S) {
  gemm<T>(false, true, s.tq, s.tk, s.d, static_cast<T>(s.scale), qp, s.d, kp, s.d, T(0), S, s.tk);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  int64_t shift = s.tk - s.tq;
  for (int64_t i = 0; i < s.tq; ++i) {
    T* row = S + i * s.tk;
    if (mask) {
      int64_t base = b * ms[0] + h * ms[1] + i * ms[2];
      if (mask_is_bool) {
        const uint8_t* mp = static_cast<const uint8_t*>(mask) + base;
        for (int64_t j = 0; j < s.tk; ++j) {
          if (!mp[j * ms[3]]) row[j] = neg_inf;
        }
      } else {
        const float* mp = static_cast<const float*>(mask) + base;
        for (int64_t j = 0; j < s.tk; ++j) row[j] += static_cast<T>(mp[j * ms[3]]);
      }
    }
    if (s.causal) {
      int64_t limit = std::max<int64_t>(0, std::min(s.tk, i + shift + 1));
      for (int64_t j = limit; j < s.tk; ++j) row[j] = neg_inf;
    }
  }
}

// BLAS calls inside a parallel region run single-threaded; restores the setting after.
struct BlasThreadsGuard {
  int saved;
  BlasThreadsGuard() : saved(blas_threads()) { set_blas_threads(1); }
  ~BlasThreadsGuard() { set_blas_threads(saved); }
};

}  // namespace

template <class T>
void attention(const AttentionShape& s, const T* q, const T* k, const T* v, const void* mask, bool mask_is_bool,
               const int64_t* ms, T* out, float* lse) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t bh = s.batch * s.heads;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  BlasThreadsGuard guard;
#pragma omp parallel
  {
    std::vector<T> P(static_cast<size_t>(s.tq * s.tk));
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < bh; ++t) {
      int64_t b = t / s.heads, h = t % s.heads, hk = h / group;
      const T* qp = q + t * s.tq * s.d;
      const T* kp = k + (b * s.kv_heads + hk) * s.tk * s.d;
      const T* vp = v + (b * s.kv_heads + hk) * s.tk * s.dv;
      attention_scores(s, b, h, qp, kp, mask, mask_is_bool, ms, P.data());
      for (int64_t i = 0; i < s.tq; ++i) {
        T* row = P.data() + i * s.tk;
        T m = neg_inf;
        for (int64_t j = 0; j < s.tk; ++j) m = std::max(m, row[j]);
        if (m == neg_inf) {  // a fully masked row attends to nothing
          for (int64_t j = 0; j < s.tk; ++j) row[j] = T(0);
          if (lse) lse[t * s.tq + i] = std::numeric_limits<float>::infinity();
          continue;
        }
        T sum = 0;
        for (int64_t j = 0; j < s.tk; ++j) {
          T e = std::exp(row[j] - m);
          row[j] = e;
          sum += e;
        }
        T inv = T(1) / sum;
        for (int64_t j = 0; j < s.tk; ++j) row[j] *= inv;
        if (lse) lse[t * s.tq + i] = static_cast<float>(m + std::log(sum));
      }
      gemm<T>(false, false, s.tq, s.dv, s.tk, T(1), P.data(), s.tk, vp, s.dv, T(0), out + t * s.tq * s.dv, s.dv);
    }
  }
}

template <class T>
void attention_backward(const AttentionShape& s, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const void* mask, bool mask_is_bool, const int64_t* ms, T* dq, T* dk, T* dv) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t groups = s.batch * s.kv_heads;
  BlasThreadsGuard guard;
#pragma omp parallel
  {
    std::vector<T> P(static_cast<size_t>(s.tq * s.tk)), dP(static_cast<size_t>(s.tq * s.tk));
    std::vector<T> D(static_cast<size_t>(s.tq));
#pragma omp for schedule(dynamic)
    for (int64_t gi = 0; gi < groups; ++gi) {
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
        attention_scores(s, b, h, qp, kp, mask, mask_is_bool, ms, P.data());
        for (int64_t i = 0; i < s.tq; ++i) {
          float l = lse[t * s.tq + i];
          T* row = P.data() + i * s.tk;
          if (std::isinf(l)) {
            std::fill(row, row + s.tk, T(0));
          } else {
            for (int64_t j = 0; j < s.tk; ++j) row[j] = std::exp(row[j] - static_cast<T>(l));
          }
          T acc = 0;
          for (int64_t e = 0; e < s.dv; ++e) acc += dop[i * s.dv + e] * op[i * s.dv + e];
          D[i] = acc;
        }
        // dV += Pᵀ dO
        gemm<T>(true, false, s.tk, s.dv, s.tq, T(1), P.data(), s.tk, dop, s.dv, T(1), dvp, s.dv);
        // dP = dO Vᵀ
        gemm<T>(false, true, s.tq, s.tk, s.dv, T(1), dop, s.dv, vp, s.dv, T(0), dP.data(), s.tk);
        for (int64_t i = 0; i < s.tq; ++i) {
          for (int64_t j = 0; j < s.tk; ++j) {
            int64_t idx = i * s.tk + j;
            dP[idx] = P[idx] * (dP[idx] - D[i]);
          }
        }
        // dQ = scale dS K ; dK += scale dSᵀ Q
        gemm<T>(false, false, s.tq, s.d, s.tk, static_cast<T>(s.scale), dP.data(), s.tk, kp, s.d, T(0), dq + t * s.tq * s.d, s.d);
        gemm<T>(true, false, s.tk, s.d, s.tq, static_cast<T>(s.scale), dP.data(), s.tk, qp, s.d, T(1), dkp, s.d);
      }
    }
  }
}

template void attention<float>(const AttentionShape&, const float*, const float*, const float*, const void*, bool,
                               const int64_t*, float*, float*);
template void attention<double>(const AttentionShape&, const double*, const double*, const double*, const void*, bool,
                                const int64_t*, double*, float*);
template void attention_backward<float>(const AttentionShape&, const float*, const float*, const float*, const float*,
                                        const float*, const float*, const void*, bool, const int64_t*, float*, float*, float*);
template void attention_backward<double>(const AttentionShape&, const double*, const double*, const double*, const double*,
                                         const double*, const float*, const void*, bool, const int64_t*, double*, double*,
                                         double*);

template <class T>
int64_t softmax_cross_entropy(const T* scores, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d,
                              int64_t ignore_index, T* losses, T* logp, double* weight_sum) {
  for (int64_t i = 0; i < n * d; ++i) {
    int64_t l = labels[i];
    if (l != ignore_index && (l < 0 || l >= c)) return -(1 + i);
  }
  int64_t counted = 0;
  double wsum = 0;
  std::vector<T> row(static_cast<size_t>(c));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      const T* x = scores + i * c * d + j;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t a = 0; a < c; ++a) m = std::max(m, x[a * d]);
      double sum = 0;
      for (int64_t a = 0; a < c; ++a) sum += std::exp(static_cast<double>(x[a * d] - m));
      T lse = m + static_cast<T>(std::log(sum));
      if (logp) {
        for (int64_t a = 0; a < c; ++a) logp[i * c * d + a * d + j] = x[a * d] - lse;
      }
      int64_t l = labels[i * d + j];
      if (l == ignore_index) {
        losses[i * d + j] = T(0);
        continue;
      }
      T w = weights ? weights[l] : T(1);
      losses[i * d + j] = -(x[l * d] - lse) * w;
      wsum += static_cast<double>(w);
      ++counted;
    }
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
template int64_t softmax_cross_entropy<float>(const float*, const int64_t*, const float*, int64_t, int64_t, int64_t, int64_t,
                                              float*, float*, double*);
template int64_t softmax_cross_entropy<double>(const double*, const int64_t*, const double*, int64_t, int64_t, int64_t,
                                               int64_t, double*, double*, double*);

}  // namespace oases::kernels
