#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

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
void softmax_grad(const T* dy, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner, bool log) {
  parallel_range(outer * inner, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, n)), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      int64_t o = t / inner, j = t % inner;
      const T* dyr = dy + o * n * inner + j;
      const T* yr = y + o * n * inner + j;
      T* dxr = dx + o * n * inner + j;
      T s = 0;
      if (log) {
        for (int64_t i = 0; i < n; ++i) s += dyr[i * inner];
        for (int64_t i = 0; i < n; ++i) dxr[i * inner] = dyr[i * inner] - std::exp(yr[i * inner]) * s;
      } else {
        for (int64_t i = 0; i < n; ++i) s += dyr[i * inner] * yr[i * inner];
        for (int64_t i = 0; i < n; ++i) dxr[i * inner] = yr[i * inner] * (dyr[i * inner] - s);
      }
    }
  });
}

template void softmax<float>(const float*, float*, int64_t, int64_t, int64_t, bool);
template void softmax<double>(const double*, double*, int64_t, int64_t, int64_t, bool);
template void softmax_grad<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, bool);
template void softmax_grad<double>(const double*, const double*, double*, int64_t, int64_t, int64_t, bool);

}  // namespace oases::kernels
