#include "kernels/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace oases::kernels {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t t, float grad_scale) {
  const float bc1 = 1.f - std::pow(beta1, static_cast<float>(t));
  const float bc2 = 1.f - std::pow(beta2, static_cast<float>(t));
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
  for (int64_t i = i_begin; i < i_end; ++i) {
    float gi = g[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.f - beta2) * gi * gi;
    float mh = m[i] / bc1, vh = v[i] / bc2;
    p[i] -= lr * (mh / (std::sqrt(vh) + eps) + weight_decay * p[i]);
  }
  });
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay, bool nesterov,
                bool first, float grad_scale) {
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
      double s = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
      part[static_cast<size_t>(b)] = s;
    }
  });
  double total = 0;
  for (double s : part) total += s;
  return total;
}

}  // namespace oases::kernels
