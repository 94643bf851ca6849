#include "executor/loss_scaler.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace oases {

LossScaler::LossScaler(LossScalerConfig c) : cfg_(c), scale_(c.dynamic ? c.init_scale : 1.0) {}

bool LossScaler::update(bool grads_finite) {
  if (!cfg_.dynamic) return grads_finite;
  if (!grads_finite) {
    scale_ = std::max(cfg_.min_scale, scale_ * cfg_.backoff_factor);
    good_ = 0;
    ++skipped_;
    return false;
  }
  if (++good_ >= cfg_.growth_interval) {
    scale_ = std::min(cfg_.max_scale, scale_ * cfg_.growth_factor);
    good_ = 0;
  }
  return true;
}

std::string LossScaler::state() const {
  return fmt::format("scale={} good={} skipped={}", scale_, good_, skipped_);
}

bool LossScaler::set_state(const std::string& s) {
  double sc = 0;
  long long g = 0, k = 0;
  if (std::sscanf(s.c_str(), "scale=%lf good=%lld skipped=%lld", &sc, &g, &k) != 3 || !(sc > 0)) return false;
  scale_ = sc;
  good_ = g;
  skipped_ = k;
  return true;
}

}  // namespace oases
