#include "kernels/cpu/grad.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <type_traits>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {

bool unary_op_from_name(const std::string& name, UnaryOp* op) {
  static const std::map<std::string, UnaryOp> m = {{"Exp", UnaryOp::kExp},
                                                   {"Log", UnaryOp::kLog},
                                                   {"Sqrt", UnaryOp::kSqrt},
                                                   {"Reciprocal", UnaryOp::kReciprocal},
                                                   {"Tanh", UnaryOp::kTanh},
                                                   {"Sigmoid", UnaryOp::kSigmoid},
                                                   {"Relu", UnaryOp::kRelu},
                                                   {"Erf", UnaryOp::kErf},
                                                   {"Sin", UnaryOp::kSin},
                                                   {"Cos", UnaryOp::kCos},
                                                   {"Abs", UnaryOp::kAbs},
                                                   {"Softplus", UnaryOp::kSoftplus},
                                                   {"Softsign", UnaryOp::kSoftsign},
                                                   {"Silu", UnaryOp::kSilu},
                                                   {"Clip", UnaryOp::kClip},
                                                   {"LeakyRelu", UnaryOp::kLeakyRelu},
                                                   {"Elu", UnaryOp::kElu},
                                                   {"Selu", UnaryOp::kSelu},
                                                   {"Celu", UnaryOp::kCelu},
                                                   {"HardSigmoid", UnaryOp::kHardSigmoid},
                                                   {"HardSwish", UnaryOp::kHardSwish},
                                                   {"Mish", UnaryOp::kMish},
                                                   {"ThresholdedRelu", UnaryOp::kThresholdedRelu}};
  auto it = m.find(name);
  if (it == m.end()) return false;
  *op = it->second;
  return true;
}

template <class T>
void unary_grad(UnaryOp op, const UnaryParams& p, const T* dy, const T* x, const T* y, T* dx, int64_t n) {
  const T a = static_cast<T>(p.alpha), b = static_cast<T>(p.beta), g = static_cast<T>(p.gamma);
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      T xi = x[i], d = dy[i], r;
      switch (op) {
        case UnaryOp::kExp: r = d * y[i]; break;
        case UnaryOp::kLog: r = d / xi; break;
        case UnaryOp::kSqrt: r = d * T(0.5) / y[i]; break;
        case UnaryOp::kReciprocal: r = -d * y[i] * y[i]; break;
        case UnaryOp::kTanh: r = d * (T(1) - y[i] * y[i]); break;
        case UnaryOp::kSigmoid: r = d * y[i] * (T(1) - y[i]); break;
        case UnaryOp::kRelu: r = xi > T(0) ? d : T(0); break;
        case UnaryOp::kErf: r = d * T(1.1283791670955126) * std::exp(-xi * xi); break;
        case UnaryOp::kSin: r = d * std::cos(xi); break;
        case UnaryOp::kCos: r = -d * std::sin(xi); break;
        case UnaryOp::kAbs: r = xi > T(0) ? d : (xi < T(0) ? -d : T(0)); break;
        case UnaryOp::kSoftplus: r = d * sigmoid(xi); break;
        case UnaryOp::kSoftsign: {
          T den = T(1) + std::abs(xi);
          r = d / (den * den);
          break;
        }
        case UnaryOp::kSilu: {
          T s = sigmoid(xi);
          r = d * s * (T(1) + xi * (T(1) - s));
          break;
        }
        case UnaryOp::kClip: r = (xi >= static_cast<T>(p.lo) && xi <= static_cast<T>(p.hi)) ? d : T(0); break;
        case UnaryOp::kLeakyRelu: r = xi >= T(0) ? d : a * d; break;
        case UnaryOp::kElu: r = xi >= T(0) ? d : d * a * std::exp(xi); break;
        case UnaryOp::kSelu: r = xi > T(0) ? d * g : d * g * a * std::exp(xi); break;
        case UnaryOp::kCelu: r = xi > T(0) ? d : d * std::exp(xi / a); break;
        case UnaryOp::kHardSigmoid: {
          T v = a * xi + b;
          r = (v > T(0) && v < T(1)) ? d * a : T(0);
          break;
        }
        case UnaryOp::kHardSwish: r = xi < T(-3) ? T(0) : (xi > T(3) ? d : d * (xi / T(3) + T(0.5))); break;
        case UnaryOp::kMish: {
          T sp = xi > T(20) ? xi : std::log1p(std::exp(xi));
          T t = std::tanh(sp);
          r = d * (t + xi * (T(1) - t * t) * sigmoid(xi));
          break;
        }
        case UnaryOp::kThresholdedRelu: r = xi > a ? d : T(0); break;
        default: r = T(0);
      }
      dx[i] = r;
    }
  });
}

template <class T>
void swiglu_grad(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      T g = gate[i], s = sigmoid(g), silu = g * s;
      if (dgate) dgate[i] = dy[i] * up[i] * s * (T(1) + g * (T(1) - s));
      if (dup) dup[i] = dy[i] * silu;
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

#define OASES_GRAD_INSTANTIATE(T)                                                                                                     \
  template void unary_grad<T>(UnaryOp, const UnaryParams&, const T*, const T*, const T*, T*, int64_t);                                \
  template void swiglu_grad<T>(const T*, const T*, const T*, T*, T*, int64_t);                                                        \
  template void softmax_grad<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool);                                             \
  template void layernorm_grad<T>(const T*, const T*, const T*, const float*, const float*, T*, T*, T*, int64_t, int64_t);            \
  template void rmsnorm_grad<T>(const T*, const T*, const T*, const float*, T*, T*, int64_t, int64_t);                                \
  template void softmax_cross_entropy_grad<T>(const T*, bool, const T*, const int64_t*, const T*, int64_t, int64_t, int64_t, int64_t, \
                                              double, T*);
OASES_GRAD_INSTANTIATE(float)
OASES_GRAD_INSTANTIATE(double)

}  // namespace oases::kernels
