// Vectorised float math for the hot elementwise kernels: exp, tanh, erf and the two GELU forms,
// 8 lanes at a time with AVX2 + FMA, and a scalar twin of every function that evaluates the same
// polynomials in the same order, so a tail element gets what a full vector lane would give
// (results do not depend on where an array starts or ends, nor on how work is split over threads).
//
//   exp:  Cephes expf. x = n·ln2 + r with |r| ≤ ln2/2, degree-6 polynomial in r, times 2^n;
//         ≤ 2 ulp for normal results, gradual underflow to 0 below -103.97, +inf above 88.72.
//   tanh: Cephes tanhf. |x| < 0.625: odd degree-9 polynomial; else sign(x)·(1 − 2/(e^{2|x|} + 1)).
//         ≤ 2 ulp.
//   Φ:    the normal CDF as 0.5·erfc(−x/√2), erfc from the Chebyshev fit of Numerical Recipes
//         (erfcc: t = 1/(1 + |z|/2), erfc = t·exp(−z² + P(t))), relative error ≈ 1e-6 also in the
//         far tail, where 0.5·(1 + erf) would cancel.
//   gelu_tanh(x) = 0.5·x·(1 + tanh(u)) = x·σ(2u), u = √(2/π)·(x + 0.044715·x³)   (GPT-2's gelu_new;
//                  the σ form has no cancellation for negative x)
//   gelu_erf(x)  = 0.5·x·(1 + erf(x/√2)) = x·Φ(x)
// Derivatives (for the backward kernels), with s = σ(2u), so 0.5·(1 + t) = s and 1 − t² = 4s(1 − s):
//   gelu_tanh'(x) = s + 2·x·s·(1 − s)·√(2/π)·(1 + 3·0.044715·x²)
//   gelu_erf'(x)  = Φ(x) + x·φ(x)
// Tails: beyond |x| = 10 gelu_tanh' is 0 or 1 in float (σ(2u) < 2e-38 below -10, 1 − σ(2u)
// rounds away above 10), and is returned as such: the formula itself would give e^{−2u} = inf
// from x ≈ −12 on and inf·0 = NaN, where PyTorch (and the limit) give 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OASES_VEC_AVX2 1
#endif

namespace oases::kernels::vec {

namespace c {
constexpr float kExpHi = 88.7228394f, kExpLo = -103.972077f;  // log(FLT_MAX), log(smallest denormal / 2)
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f, kExpP2 = 8.3334519073e-3f, kExpP3 = 4.1665795894e-2f,
                kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;
constexpr float kTanhP0 = -5.70498872745e-3f, kTanhP1 = 2.06390887954e-2f, kTanhP2 = -5.37397155531e-2f, kTanhP3 = 1.33314422036e-1f,
                kTanhP4 = -3.33332819422e-1f;
constexpr float kErfcC0 = -1.26551223f, kErfcC1 = 1.00002368f, kErfcC2 = 0.37409196f, kErfcC3 = 0.09678418f, kErfcC4 = -0.18628806f,
                kErfcC5 = 0.27886807f, kErfcC6 = -1.13520398f, kErfcC7 = 1.48851587f, kErfcC8 = -0.82215223f, kErfcC9 = 0.17087277f;
constexpr float kSqrt2OverPi = 0.7978845608028654f, kGeluK = 0.044715f, kInvSqrt2 = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluTail = 10.f;  // |x| beyond which gelu_tanh' is exactly 0 or 1 in float
}  // namespace c

// --- scalar twins -----------------------------------------------------------------------------

inline float exp1(float x) {
  if (std::isnan(x)) return x;
  if (x > c::kExpHi) return INFINITY;
  if (x < c::kExpLo) return 0.f;
  float n = std::floor(std::fma(x, c::kLog2e, 0.5f));
  float r = std::fma(n, -c::kLn2Hi, x);
  r = std::fma(n, -c::kLn2Lo, r);
  float y = c::kExpP0;
  y = std::fma(y, r, c::kExpP1);
  y = std::fma(y, r, c::kExpP2);
  y = std::fma(y, r, c::kExpP3);
  y = std::fma(y, r, c::kExpP4);
  y = std::fma(y, r, c::kExpP5);
  y = std::fma(y, r * r, r + 1.f);
  // 2^n as 2^(n/2)·2^(n − n/2): both factors stay normal for n in [-150, 128]
  int32_t ni = static_cast<int32_t>(n), n1 = ni >> 1;
  int32_t e1 = (n1 + 127) << 23, e2 = (ni - n1 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &e1, 4);
  std::memcpy(&s2, &e2, 4);
  return y * s1 * s2;
}

inline float tanh1(float x) {
  float ax = std::fabs(x);
  if (ax < 0.625f) {
    float z = x * x;
    float p = c::kTanhP0;
    p = std::fma(p, z, c::kTanhP1);
    p = std::fma(p, z, c::kTanhP2);
    p = std::fma(p, z, c::kTanhP3);
    p = std::fma(p, z, c::kTanhP4);
    return std::fma(p * z, x, x);
  }
  float t = 1.f - 2.f / (exp1(2.f * (ax > 44.f ? 44.f : ax)) + 1.f);  // NaN stays NaN
  return std::copysign(t, x);
}

// Φ(x) = 0.5·erfc(−x/√2)
inline float phi1(float x) {
  float z = x * c::kInvSqrt2, az = std::fabs(z);
  float t = 1.f / std::fma(0.5f, az, 1.f);
  float p = c::kErfcC9;
  p = std::fma(p, t, c::kErfcC8);
  p = std::fma(p, t, c::kErfcC7);
  p = std::fma(p, t, c::kErfcC6);
  p = std::fma(p, t, c::kErfcC5);
  p = std::fma(p, t, c::kErfcC4);
  p = std::fma(p, t, c::kErfcC3);
  p = std::fma(p, t, c::kErfcC2);
  p = std::fma(p, t, c::kErfcC1);
  p = std::fma(p, t, c::kErfcC0);
  float half_erfc_az = 0.5f * t * exp1(p - az * az);  // 0.5·erfc(|z|)
  return z < 0.f ? half_erfc_az : 1.f - half_erfc_az;
}

// e^{-2u} of gelu_tanh; σ(2u) = 1/(1 + e), 1 − σ(2u) = e·σ(2u) (no cancellation)
inline float exp_m2u1(float x) {
  float u = c::kSqrt2OverPi * std::fma(c::kGeluK * x * x, x, x);
  return exp1(-2.f * u);
}
inline float gelu_tanh1(float x) {
  return x / (1.f + exp_m2u1(x));
}
inline float gelu_erf1(float x) {
  return x * phi1(x);
}
inline float gelu_tanh_grad1(float x) {
  if (x < -c::kGeluTail) return 0.f;
  if (x > c::kGeluTail) return 1.f;
  float e = exp_m2u1(x);
  float s = 1.f / (1.f + e);
  float d = (2.f * c::kSqrt2OverPi) * std::fma((3.f * c::kGeluK) * x, x, 1.f);
  return std::fma(x * s * (e * s), d, s);
}
inline float gelu_erf_grad1(float x) {
  return std::fma(x, c::kInvSqrt2Pi * exp1(-0.5f * (x * x)), phi1(x));
}

// --- 8-lane versions ---------------------------------------------------------------------------

#ifdef OASES_VEC_AVX2
inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(c::kExpHi), lo = _mm256_set1_ps(c::kExpLo);
  __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ), under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(c::kLog2e), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-c::kLn2Hi), xc);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-c::kLn2Lo), r);
  __m256 y = _mm256_set1_ps(c::kExpP0);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c::kExpP1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c::kExpP2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c::kExpP3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c::kExpP4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c::kExpP5));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  __m256i e1 = _mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23);
  __m256i e2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, n1), bias), 23);
  y = _mm256_mul_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e1)), _mm256_castsi256_ps(e2));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
  return _mm256_blendv_ps(y, x, nan);
}

inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 ax = _mm256_andnot_ps(sign, x);
  __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(c::kTanhP0);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c::kTanhP1));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c::kTanhP2));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c::kTanhP3));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c::kTanhP4));
  __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(2.f), _mm256_min_ps(_mm256_set1_ps(44.f), ax)));
  __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.f), _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, _mm256_set1_ps(1.f))));
  big = _mm256_or_ps(big, _mm256_and_ps(x, sign));  // copysign (big >= 0)
  return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

inline __m256 phi8(__m256 x) {
  __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(c::kInvSqrt2));
  __m256 az = _mm256_andnot_ps(_mm256_set1_ps(-0.f), z);
  __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_fmadd_ps(_mm256_set1_ps(0.5f), az, _mm256_set1_ps(1.f)));
  __m256 p = _mm256_set1_ps(c::kErfcC9);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC8));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC7));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC6));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC5));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC4));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC3));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC2));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC1));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c::kErfcC0));
  __m256 h = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), t), exp8(_mm256_sub_ps(p, _mm256_mul_ps(az, az))));
  __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.f), h), h, neg);
}

inline __m256 exp_m2u8(__m256 x) {
  __m256 u =
      _mm256_mul_ps(_mm256_set1_ps(c::kSqrt2OverPi), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(c::kGeluK), x), x), x, x));
  return exp8(_mm256_mul_ps(_mm256_set1_ps(-2.f), u));
}
inline __m256 gelu_tanh8(__m256 x) {
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), exp_m2u8(x)));
}
inline __m256 gelu_erf8(__m256 x) {
  return _mm256_mul_ps(x, phi8(x));
}
inline __m256 gelu_tanh_grad8(__m256 x) {
  __m256 e = exp_m2u8(x);
  __m256 s = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(_mm256_set1_ps(1.f), e));
  __m256 d = _mm256_mul_ps(_mm256_set1_ps(2.f * c::kSqrt2OverPi),
                           _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(3.f * c::kGeluK), x), x, _mm256_set1_ps(1.f)));
  __m256 xs = _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_mul_ps(e, s));
  __m256 g = _mm256_fmadd_ps(xs, d, s);
  g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-c::kGeluTail), _CMP_LT_OQ));
  return _mm256_blendv_ps(g, _mm256_set1_ps(1.f), _mm256_cmp_ps(x, _mm256_set1_ps(c::kGeluTail), _CMP_GT_OQ));
}
inline __m256 gelu_erf_grad8(__m256 x) {
  __m256 pdf = _mm256_mul_ps(_mm256_set1_ps(c::kInvSqrt2Pi), exp8(_mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_mul_ps(x, x))));
  return _mm256_fmadd_ps(x, pdf, phi8(x));
}
#endif

// --- array helpers ---------------------------------------------------------------------------

// m = max of a row of n floats.
inline float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
#ifdef OASES_VEC_AVX2
  __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  for (float l : lanes) m = std::max(m, l);
#endif
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// Σ exp(x_j − m) in double; writes the exponentials to e when it is not null.
inline double row_exp_sum(const float* x, int64_t n, float m, float* e) {
  int64_t j = 0;
  double sum = 0;
#ifdef OASES_VEC_AVX2
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    __m256 v = vec::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
    if (e) _mm256_storeu_ps(e + j, v);
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; j < n; ++j) {
    float v = vec::exp1(x[j] - m);
    if (e) e[j] = v;
    sum += static_cast<double>(v);
  }
  return sum;
}

#ifdef OASES_VEC_AVX2
inline double hsum(__m256d a) {
  alignas(32) double l[4];
  _mm256_store_pd(l, a);
  return (l[0] + l[1]) + (l[2] + l[3]);
}
inline __m256d lo_pd(__m256 v) {
  return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}
inline __m256d hi_pd(__m256 v) {
  return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}
#endif

// Σ x in double.
inline double sum_d(const float* x, int64_t n) {
  int64_t i = 0;
  double s = 0;
#ifdef OASES_VEC_AVX2
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    a0 = _mm256_add_pd(a0, lo_pd(v));
    a1 = _mm256_add_pd(a1, hi_pd(v));
  }
  s = hsum(_mm256_add_pd(a0, a1));
#endif
  for (; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}

// Σ (x − mu)² in double.
inline double sum_sq_dev_d(const float* x, int64_t n, double mu) {
  int64_t i = 0;
  double s = 0;
#ifdef OASES_VEC_AVX2
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), m = _mm256_set1_pd(mu);
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256d d0 = _mm256_sub_pd(lo_pd(v), m), d1 = _mm256_sub_pd(hi_pd(v), m);
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(d0, d0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(d1, d1));
  }
  s = hsum(_mm256_add_pd(a0, a1));
#endif
  for (; i < n; ++i) {
    double d = static_cast<double>(x[i]) - mu;
    s += d * d;
  }
  return s;
}

// y[i] = f(x[i]); f8 and f1 must be twins. x and y may alias.
template <class F8, class F1>
inline void map(const float* x, float* y, int64_t n, F8 f8, F1 f1) {
  int64_t i = 0;
#ifdef OASES_VEC_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f8(_mm256_loadu_ps(x + i)));
#else
  (void)f8;
#endif
  for (; i < n; ++i) y[i] = f1(x[i]);
}

}  // namespace oases::kernels::vec
