#include "kernels/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <vector>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels/cpu/parallel.h"

namespace oases::kernels {

// The vector loops evaluate exactly the scalar expressions (same operations, same order, no fused
// multiply-add), so every element gets the same bits whichever loop handles it.
float adamw_bias_correction(float beta, int64_t t) {
  return 1.f - std::pow(beta, static_cast<float>(t));
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t t, float grad_scale) {
  const float bc1 = adamw_bias_correction(beta1, t);
  const float bc2 = adamw_bias_correction(beta2, t);
  parallel_range(n, 1 << 15, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
#ifdef __AVX2__
    const __m256 gs = _mm256_set1_ps(grad_scale), b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2);
    const __m256 ob1 = _mm256_set1_ps(1.f - beta1), ob2 = _mm256_set1_ps(1.f - beta2);
    const __m256 c1 = _mm256_set1_ps(bc1), c2 = _mm256_set1_ps(bc2), ep = _mm256_set1_ps(eps);
    const __m256 lrv = _mm256_set1_ps(lr), wd = _mm256_set1_ps(weight_decay);
    for (; i + 8 <= i1; i += 8) {
      __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
      __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(ob1, gi));
      __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(ob2, gi), gi));
      _mm256_storeu_ps(m + i, mi);
      _mm256_storeu_ps(v + i, vi);
      __m256 mh = _mm256_div_ps(mi, c1), vh = _mm256_div_ps(vi, c2);
      __m256 pi = _mm256_loadu_ps(p + i);
      __m256 upd = _mm256_add_ps(_mm256_div_ps(mh, _mm256_add_ps(_mm256_sqrt_ps(vh), ep)), _mm256_mul_ps(wd, pi));
      _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(lrv, upd)));
    }
#endif
    for (; i < i1; ++i) {
      float gi = g[i] * grad_scale;
      m[i] = beta1 * m[i] + (1.f - beta1) * gi;
      v[i] = beta2 * v[i] + (1.f - beta2) * gi * gi;
      float mh = m[i] / bc1, vh = v[i] / bc2;
      p[i] -= lr * (mh / (std::sqrt(vh) + eps) + weight_decay * p[i]);
    }
  });
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay, bool nesterov, bool first,
                float grad_scale) {
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      float gi = g[i] * grad_scale + weight_decay * p[i];
      float step = gi;
      if (momentum != 0.f) {
        buf[i] = first ? gi : momentum * buf[i] + gi;
        step = nesterov ? gi + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * step;
    }
  });
}

double sum_squares(const float* g, int64_t n) {
  // one partial per fixed-size block, summed in block order: the same total for any thread count
  constexpr int64_t kBlock = 1 << 14;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks), 0.0);
  parallel_range(blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t i = b * kBlock, e = std::min(n, (b + 1) * kBlock);
      double s = 0;
#ifdef __AVX2__
      __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
      for (; i + 8 <= e; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(lo, lo));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(hi, hi));
      }
      alignas(32) double lanes[4];
      _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
      s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
      for (; i < e; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
      part[static_cast<size_t>(b)] = s;
    }
  });
  double total = 0;
  for (double s : part) total += s;
  return total;
}

}  // namespace oases::kernels
