#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {

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

template <class T>
void softmax_cross_entropy_grad(const T* dloss, bool per_sample, const T* scores, const int64_t* labels, const T* weights, int64_t n,
                                int64_t c, int64_t d, int64_t ignore_index, double denom, T* dscores) {
  parallel_range(n * d, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, c)), [&](int64_t s_begin, int64_t s_end) {
    for (int64_t s = s_begin; s < s_end; ++s) {
      int64_t i = s / d, j = s % d;
      const T* x = scores + i * c * d + j;
      T* dx = dscores + i * c * d + j;
      int64_t l = labels[s];
      if (l == ignore_index) {
        for (int64_t a = 0; a < c; ++a) dx[a * d] = T(0);
        continue;
      }
      T w = weights ? weights[l] : T(1);
      T coef = (per_sample ? dloss[s] : dloss[0] / static_cast<T>(denom)) * w;
      if constexpr (std::is_same_v<T, float>) {
        if (d == 1) {  // dx = coef · (e / Σe − onehot), e = exp(x − max) written once
          float m = vec::row_max(x, c);
          double sum = vec::row_exp_sum(x, c, m, dx);
          float scale = static_cast<float>(static_cast<double>(coef) / sum);
          for (int64_t a = 0; a < c; ++a) dx[a] *= scale;
          dx[l] -= coef;
          continue;
        }
      }
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t a = 0; a < c; ++a) m = std::max(m, x[a * d]);
      double sum = 0;
      for (int64_t a = 0; a < c; ++a) sum += std::exp(static_cast<double>(x[a * d] - m));
      for (int64_t a = 0; a < c; ++a) {
        T p = static_cast<T>(std::exp(static_cast<double>(x[a * d] - m)) / sum);
        dx[a * d] = coef * (p - (a == l ? T(1) : T(0)));
      }
    }
  });
}

template int64_t softmax_cross_entropy<float>(const float*, const int64_t*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                              float*, double*);
template int64_t softmax_cross_entropy<double>(const double*, const int64_t*, const double*, int64_t, int64_t, int64_t, int64_t, double*,
                                               double*, double*);
template void softmax_cross_entropy_grad<float>(const float*, bool, const float*, const int64_t*, const float*, int64_t, int64_t, int64_t,
                                                int64_t, double, float*);
template void softmax_cross_entropy_grad<double>(const double*, bool, const double*, const int64_t*, const double*, int64_t, int64_t,
                                                 int64_t, int64_t, double, double*);

template <class T>
int64_t nll_loss(const T* logp, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d, int64_t ignore_index, T* losses,
                 double* weight_sum) {
  int64_t counted = 0;
  for (int64_t i = 0; i < n * d; ++i) {
    int64_t l = labels[i];
    if (l == ignore_index) {
      losses[i] = 0;
      continue;
    }
    if (l < 0 || l >= c) return -(1 + i);
    int64_t b = i / d, j = i % d;
    T wt = weights ? weights[l] : T(1);
    losses[i] = -logp[(b * c + l) * d + j] * wt;
    *weight_sum += static_cast<double>(wt);
    ++counted;
  }
  return counted;
}

template <class T>
void nll_loss_grad(const T* dloss, bool per_sample, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d,
                   int64_t ignore_index, double denom, T* dlogp) {
  std::fill(dlogp, dlogp + n * c * d, T(0));
  for (int64_t s = 0; s < n * d; ++s) {
    int64_t l = labels[s];
    if (l == ignore_index) continue;
    int64_t i = s / d, j = s % d;
    T coef = (per_sample ? dloss[s] : dloss[0] / static_cast<T>(denom)) * (weights ? weights[l] : T(1));
    dlogp[(i * c + l) * d + j] = -coef;
  }
}

template <class T>
T reduce_losses(const T* losses, int64_t count, double weight_sum, bool mean) {
  double total = 0;
  for (int64_t i = 0; i < count; ++i) total += static_cast<double>(losses[i]);
  if (mean) total = weight_sum > 0 ? total / weight_sum : 0.0;
  return static_cast<T>(total);
}

#define OASES_NLL_INSTANTIATE(T)                                                                                            \
  template int64_t nll_loss<T>(const T*, const int64_t*, const T*, int64_t, int64_t, int64_t, int64_t, T*, double*);        \
  template void nll_loss_grad<T>(const T*, bool, const int64_t*, const T*, int64_t, int64_t, int64_t, int64_t, double, T*); \
  template T reduce_losses<T>(const T*, int64_t, double, bool);
OASES_NLL_INSTANTIATE(float)
OASES_NLL_INSTANTIATE(double)

}  // namespace oases::kernels
