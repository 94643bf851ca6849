#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {

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

// Partial sums of parameter gradients per block of rows (the blocks depend on the row count
// only), combined in block order: results are bit-identical from run to run and for any thread
// count (a requirement of resumable training).
struct Partials {
  int64_t rows_per_block, blocks, n;
  std::vector<double> buf;
  Partials(int64_t rows, int64_t n_, int k)
      : rows_per_block(std::max<int64_t>(16, (rows + 255) / 256)),
        blocks((rows + rows_per_block - 1) / rows_per_block),
        n(n_),
        buf(static_cast<size_t>(blocks * k * n_), 0.0) {}
  double* of(int64_t block, int which) { return buf.data() + (static_cast<size_t>(block) * 2 + which) * n; }
  template <class T>
  void sum_into(int which, T* out) {
    if (!out) return;
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t b = 0; b < blocks; ++b) s += of(b, which)[i];
      out[i] = static_cast<T>(s);
    }
  }
};

}  // namespace

template <class T>
void layernorm_grad(const T* dy, const T* x, const T* scale, const float* mean, const float* rstd, T* dx, T* dscale, T* dbias, int64_t rows,
                    int64_t n) {
  Partials part(rows, n, 2);
  parallel_for(part.blocks, [&](int64_t blk) {
    double* ds_l = part.of(blk, 0);
    double* db_l = part.of(blk, 1);
    for (int64_t r = blk * part.rows_per_block; r < std::min(rows, (blk + 1) * part.rows_per_block); ++r) {
      const T* dyr = dy + r * n;
      const T* xr = x + r * n;
      T mu = static_cast<T>(mean[r]), rs = static_cast<T>(rstd[r]);
      double sg = 0, sgx = 0;
      int64_t i0 = 0;
#ifdef OASES_VEC_AVX2
      if constexpr (std::is_same_v<T, float>) {  // the scalar loop's math, 8 columns at a time
        __m256d g0 = _mm256_setzero_pd(), g1 = _mm256_setzero_pd(), x0 = _mm256_setzero_pd(), x1 = _mm256_setzero_pd();
        __m256 muv = _mm256_set1_ps(mu), rsv = _mm256_set1_ps(rs);
        for (; i0 + 8 <= n; i0 += 8) {
          __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i0), muv), rsv);
          __m256 d = _mm256_loadu_ps(dyr + i0);
          __m256 g = _mm256_mul_ps(d, _mm256_loadu_ps(scale + i0));
          __m256 gx = _mm256_mul_ps(g, xh), dx = _mm256_mul_ps(d, xh);
          g0 = _mm256_add_pd(g0, vec::lo_pd(g));
          g1 = _mm256_add_pd(g1, vec::hi_pd(g));
          x0 = _mm256_add_pd(x0, vec::lo_pd(gx));
          x1 = _mm256_add_pd(x1, vec::hi_pd(gx));
          _mm256_storeu_pd(ds_l + i0, _mm256_add_pd(_mm256_loadu_pd(ds_l + i0), vec::lo_pd(dx)));
          _mm256_storeu_pd(ds_l + i0 + 4, _mm256_add_pd(_mm256_loadu_pd(ds_l + i0 + 4), vec::hi_pd(dx)));
          _mm256_storeu_pd(db_l + i0, _mm256_add_pd(_mm256_loadu_pd(db_l + i0), vec::lo_pd(d)));
          _mm256_storeu_pd(db_l + i0 + 4, _mm256_add_pd(_mm256_loadu_pd(db_l + i0 + 4), vec::hi_pd(d)));
        }
        sg = vec::hsum(_mm256_add_pd(g0, g1));
        sgx = vec::hsum(_mm256_add_pd(x0, x1));
      }
#endif
      for (int64_t i = i0; i < n; ++i) {
        T xh = (xr[i] - mu) * rs;
        T g = dyr[i] * scale[i];
        sg += static_cast<double>(g);
        sgx += static_cast<double>(g * xh);
        ds_l[i] += static_cast<double>(dyr[i] * xh);
        db_l[i] += static_cast<double>(dyr[i]);
      }
      T mg = static_cast<T>(sg / static_cast<double>(n)), mgx = static_cast<T>(sgx / static_cast<double>(n));
      T* dxr = dx + r * n;
      for (int64_t i = 0; i < n; ++i) {
        T xh = (xr[i] - mu) * rs;
        dxr[i] = rs * (dyr[i] * scale[i] - mg - xh * mgx);
      }
    }
  });
  part.sum_into(0, dscale);
  part.sum_into(1, dbias);
}

template <class T>
void rmsnorm_grad(const T* dy, const T* x, const T* scale, const float* rstd, T* dx, T* dscale, int64_t rows, int64_t n) {
  Partials part(rows, n, 2);
  parallel_for(part.blocks, [&](int64_t blk) {
    double* ds_l = part.of(blk, 0);
    for (int64_t r = blk * part.rows_per_block; r < std::min(rows, (blk + 1) * part.rows_per_block); ++r) {
      const T* dyr = dy + r * n;
      const T* xr = x + r * n;
      T rs = static_cast<T>(rstd[r]);
      double sgx = 0;
      for (int64_t i = 0; i < n; ++i) {
        T xh = xr[i] * rs;
        sgx += static_cast<double>(dyr[i] * scale[i] * xh);
        ds_l[i] += static_cast<double>(dyr[i] * xh);
      }
      T mgx = static_cast<T>(sgx / static_cast<double>(n));
      T* dxr = dx + r * n;
      for (int64_t i = 0; i < n; ++i) dxr[i] = rs * (dyr[i] * scale[i] - xr[i] * rs * mgx);
    }
  });
  part.sum_into(0, dscale);
}

template void layernorm<float>(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, float);
template void layernorm<double>(const double*, const double*, const double*, double*, float*, float*, int64_t, int64_t, float);
template void rmsnorm<float>(const float*, const float*, float*, float*, int64_t, int64_t, float);
template void rmsnorm<double>(const double*, const double*, double*, float*, int64_t, int64_t, float);
template void layernorm_grad<float>(const float*, const float*, const float*, const float*, const float*, float*, float*, float*, int64_t,
                                    int64_t);
template void layernorm_grad<double>(const double*, const double*, const double*, const float*, const float*, double*, double*, double*,
                                     int64_t, int64_t);
template void rmsnorm_grad<float>(const float*, const float*, const float*, const float*, float*, float*, int64_t, int64_t);
template void rmsnorm_grad<double>(const double*, const double*, const double*, const float*, double*, double*, int64_t, int64_t);

}  // namespace oases::kernels
