// Dynamic loss scaling for fp16 training: the loss is multiplied by S before the backward pass so
// small gradients survive fp16's range; the gradients are divided by S before the update. A step
// whose gradients hold an inf or NaN is skipped and S halves; after `growth_interval` good steps
// in a row S doubles. bf16 and fp32 runs use a fixed S = 1 (bf16 has fp32's range).
//
// Pure bookkeeping, the same for every device: the CPU trainer and the CUDA runner both feed it
// "was this step's gradient finite" and read the scale for the next step.
#pragma once

#include <cstdint>
#include <string>

namespace oases {

struct LossScalerConfig {
  bool dynamic = false;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig c = {});
  double scale() const { return scale_; }
  // Records one step's outcome; returns true when the step should be applied (finite gradients).
  bool update(bool grads_finite);
  int64_t skipped() const { return skipped_; }
  int64_t good_in_a_row() const { return good_; }
  // "scale=<S> good=<n> skipped=<n>", for checkpoints.
  std::string state() const;
  bool set_state(const std::string& s);

 private:
  LossScalerConfig cfg_;
  double scale_ = 1.0;
  int64_t good_ = 0, skipped_ = 0;
};

}  // namespace oases
