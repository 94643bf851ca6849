// Optimizers over named fp32 parameters, with the learning-rate schedule (linear warm-up, then
// cosine decay to min_lr) and global-norm gradient clipping. State is exposed as named tensors for
// checkpoints.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/tensor.h"

namespace oases {

struct OptimizerConfig {
  std::string kind = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double min_lr = -1;       // < 0: lr / 10
  int64_t warmup = 0;       // steps of linear warm-up
  int64_t total_steps = 0;  // for the cosine schedule; 0: constant after warm-up
  bool cosine = true;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.9;
  bool nesterov = false;
  double clip = 0.0;       // global gradient-norm clip; 0 = off
  bool decay_all = false;  // false: no weight decay on rank-1 parameters (biases, norms)
};

double learning_rate_at(const OptimizerConfig& c, int64_t step);  // step counts from 1

// The scalars of one update as the kernels take them (float, as the CPU kernels compute them), so
// an update on another device (kernels/cuda/optim.h) gives the CPU's bits.
struct OptimizerKnobs {
  int64_t t = 0;  // the step being taken, from 1
  bool adamw = true, nesterov = false, first = false;
  float lr = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0, weight_decay = 0;
  float bc1 = 1, bc2 = 1;  // 1 − β^t
  float momentum = 0;
  double clip = 0;
};

class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig c) : cfg_(std::move(c)) {}
  const OptimizerConfig& config() const { return cfg_; }
  // Registers a parameter (fp32, updated in place through `value`).
  void add(const std::string& name, Tensor value);
  // Parameter i is updated on elements [offset, offset + length) of its flattened value only (the
  // distributed optimizer's piece, executor/zero.h): its moments are [length], its gradient is
  // given as `length` floats, and its state has the piece's shape.
  void set_range(size_t i, int64_t offset, int64_t length);
  // Elements of parameter i that an update touches (its numel, or its range's length).
  int64_t updated_elements(size_t i) const { return params_[i].length; }
  // Bytes of optimizer state held (moments), and what they would be for every parameter whole.
  size_t state_bytes() const;
  size_t whole_state_bytes() const;
  size_t size() const { return params_.size(); }
  // Applies one step with gradients in registration order (scaled by `grad_scale`, e.g. 1/micro-
  // batches); clips by global norm first. Returns the global norm before clipping.
  double step(const std::vector<const float*>& grads, float grad_scale);
  // Same, with the global gradient norm computed by the caller (distributed runs: shards summed
  // over their group, replicated parameters counted once).
  double step_with_norm(const std::vector<const float*>& grads, float grad_scale, double global_norm);
  // Σ g² of each parameter's (local) gradient, unscaled.
  std::vector<double> sum_squares(const std::vector<const float*>& grads) const;
  int64_t steps_taken() const { return t_; }
  double last_lr() const { return last_lr_; }
  // Global norm of the given gradients (scaled).
  double grad_norm(const std::vector<const float*>& grads, float grad_scale) const;

  // The knobs of the next step (steps_taken() + 1), without taking it.
  OptimizerKnobs next_knobs() const;
  // Records that the next step was applied elsewhere (on a device holding the state).
  void record_step(const OptimizerKnobs& k);
  // Whether parameter i takes weight decay; its moment tensors ({m, v} for adamw, {momentum}).
  bool decays(size_t i) const { return params_[i].decay; }
  std::vector<Tensor*> moments(size_t i);
  Tensor& value(size_t i) { return params_[i].value; }

  // Checkpoint state: "<param>.m", "<param>.v" (adamw) or "<param>.momentum" (sgd), plus the step.
  std::map<std::string, Tensor> state() const;
  // Every parameter's state must be there with its shard's shape; otherwise an error naming the
  // state, and the optimizer is left untouched.
  Status set_state(const std::map<std::string, Tensor>& s, int64_t t);

 private:
  struct Param {
    std::string name;
    Tensor value;
    Tensor m, v;  // adamw moments, or m = sgd momentum
    bool decay = true;
    int64_t offset = 0, length = 0;  // the elements updated (set_range), all by default
  };
  OptimizerConfig cfg_;
  std::vector<Param> params_;
  int64_t t_ = 0;
  double last_lr_ = 0;
};

}  // namespace oases
