#include "kernels/cpu/optim.h"

#include <cmath>
#include <vector>

#include <omp.h>

namespace oases::kernels {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t t, float grad_scale) {
  const float bc1 = 1.f - std::pow(beta1, static_cast<float>(t));
  const float bc2 = 1.f - std::pow(beta2, static_cast<float>(t));
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.f - beta2) * gi * gi;
    float mh = m[i] / bc1, vh = v[i] / bc2;
    p[i] -= lr * (mh / (std::sqrt(vh) + eps) + weight_decay * p[i]);
  }
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum, float weight_decay, bool nesterov,
                bool first, float grad_scale) {
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale + weight_decay * p[i];
    float step = gi;
    if (momentum != 0.f) {
      buf[i] = first ? gi : momentum * buf[i] + gi;
      step = nesterov ? gi + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * step;
  }
}

double sum_squares(const float* g, int64_t n) {
  int threads = omp_get_max_threads();
  std::vector<double> part(static_cast<size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads) if (n > (1 << 15))
  {
    double s = 0;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    part[static_cast<size_t>(omp_get_thread_num())] = s;
  }
  double total = 0;
  for (double s : part) total += s;
  return total;
}

}  // namespace oases::kernels
