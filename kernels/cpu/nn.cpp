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

void attention_f32(const AttentionShape& s, const float* q, const float* k, const float* v, const void* mask,
                   bool mask_is_bool, const int64_t* ms, float* out, float* probs) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t bh = s.batch * s.heads;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  int saved_threads = blas_threads();
  // heads run in parallel, each with single-threaded BLAS calls
  set_blas_threads(1);
#pragma omp parallel
  {
    std::vector<float> scratch(probs ? 0 : static_cast<size_t>(s.tq * s.tk));
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < bh; ++t) {
      int64_t b = t / s.heads, h = t % s.heads, hk = h / group;
      const float* qp = q + t * s.tq * s.d;
      const float* kp = k + (b * s.kv_heads + hk) * s.tk * s.d;
      const float* vp = v + (b * s.kv_heads + hk) * s.tk * s.dv;
      float* P = probs ? probs + t * s.tq * s.tk : scratch.data();
      gemm<float>(false, true, s.tq, s.tk, s.d, s.scale, qp, s.d, kp, s.d, 0.f, P, s.tk);
      int64_t shift = s.tk - s.tq;
      for (int64_t i = 0; i < s.tq; ++i) {
        float* row = P + i * s.tk;
        if (mask) {
          int64_t base = b * ms[0] + h * ms[1] + i * ms[2];
          if (mask_is_bool) {
            const uint8_t* mp = static_cast<const uint8_t*>(mask) + base;
            for (int64_t j = 0; j < s.tk; ++j) {
              if (!mp[j * ms[3]]) row[j] = neg_inf;
            }
          } else {
            const float* mp = static_cast<const float*>(mask) + base;
            for (int64_t j = 0; j < s.tk; ++j) row[j] += mp[j * ms[3]];
          }
        }
        int64_t limit = s.causal ? std::min(s.tk, i + shift + 1) : s.tk;
        for (int64_t j = std::max<int64_t>(limit, 0); j < s.tk; ++j) row[j] = neg_inf;
        float m = neg_inf;
        for (int64_t j = 0; j < s.tk; ++j) m = std::max(m, row[j]);
        if (m == neg_inf) {
          for (int64_t j = 0; j < s.tk; ++j) row[j] = 0.f;  // fully masked row attends to nothing
          continue;
        }
        float sum = 0.f;
        for (int64_t j = 0; j < s.tk; ++j) {
          float e = std::exp(row[j] - m);
          row[j] = e;
          sum += e;
        }
        float inv = 1.f / sum;
        for (int64_t j = 0; j < s.tk; ++j) row[j] *= inv;
      }
      gemm<float>(false, false, s.tq, s.dv, s.tk, 1.f, P, s.tk, vp, s.dv, 0.f, out + t * s.tq * s.dv, s.dv);
    }
  }
  set_blas_threads(saved_threads);
}

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
