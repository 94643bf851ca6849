#include "executor/optimizer.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/optim.h"

namespace oases {

double learning_rate_at(const OptimizerConfig& c, int64_t step) {
  double lr = c.lr;
  double min_lr = c.min_lr < 0 ? c.lr / 10 : c.min_lr;
  if (c.warmup > 0 && step <= c.warmup) return lr * static_cast<double>(step) / static_cast<double>(c.warmup);
  if (!c.cosine || c.total_steps <= c.warmup) return lr;
  double progress = static_cast<double>(step - c.warmup) / static_cast<double>(std::max<int64_t>(1, c.total_steps - c.warmup));
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

void Optimizer::add(const std::string& name, Tensor value) {
  Param p;
  p.name = name;
  p.decay = cfg_.decay_all || value.rank() >= 2;
  p.m = Tensor(DType::kF32, value.shape());
  if (cfg_.kind == "adamw") p.v = Tensor(DType::kF32, value.shape());
  p.length = value.numel();
  p.value = std::move(value);
  params_.push_back(std::move(p));
}

size_t Optimizer::state_bytes() const {
  size_t b = 0;
  for (const Param& p : params_) b += p.m.nbytes() + (cfg_.kind == "adamw" ? p.v.nbytes() : 0);
  return b;
}

size_t Optimizer::whole_state_bytes() const {
  size_t b = 0;
  for (const Param& p : params_) b += static_cast<size_t>(p.value.numel()) * 4 * (cfg_.kind == "adamw" ? 2 : 1);
  return b;
}

void Optimizer::set_range(size_t i, int64_t offset, int64_t length) {
  Param& p = params_.at(i);
  p.offset = offset;
  p.length = length;
  p.m = Tensor(DType::kF32, {length});
  if (cfg_.kind == "adamw") p.v = Tensor(DType::kF32, {length});
}

double Optimizer::grad_norm(const std::vector<const float*>& grads, float grad_scale) const {
  double ss = 0;
  for (size_t i = 0; i < params_.size(); ++i) ss += kernels::sum_squares(grads[i], params_[i].length);
  return std::sqrt(ss) * grad_scale;
}

std::vector<double> Optimizer::sum_squares(const std::vector<const float*>& grads) const {
  std::vector<double> ss;
  for (size_t i = 0; i < params_.size(); ++i) ss.push_back(kernels::sum_squares(grads[i], params_[i].length));
  return ss;
}

double Optimizer::step(const std::vector<const float*>& grads, float grad_scale) {
  return step_with_norm(grads, grad_scale, grad_norm(grads, grad_scale));
}

OptimizerKnobs Optimizer::next_knobs() const {
  OptimizerKnobs k;
  k.t = t_ + 1;
  k.adamw = cfg_.kind == "adamw";
  k.nesterov = cfg_.nesterov;
  k.first = k.t == 1;
  k.lr = static_cast<float>(learning_rate_at(cfg_, k.t));
  k.beta1 = static_cast<float>(cfg_.beta1);
  k.beta2 = static_cast<float>(cfg_.beta2);
  k.one_minus_beta1 = 1.f - k.beta1;
  k.one_minus_beta2 = 1.f - k.beta2;
  k.eps = static_cast<float>(cfg_.eps);
  k.weight_decay = static_cast<float>(cfg_.weight_decay);
  k.bc1 = kernels::adamw_bias_correction(k.beta1, k.t);
  k.bc2 = kernels::adamw_bias_correction(k.beta2, k.t);
  k.momentum = static_cast<float>(cfg_.momentum);
  k.clip = cfg_.clip;
  return k;
}

void Optimizer::record_step(const OptimizerKnobs& k) {
  t_ = k.t;
  last_lr_ = learning_rate_at(cfg_, k.t);
}

std::vector<Tensor*> Optimizer::moments(size_t i) {
  Param& p = params_[i];
  if (cfg_.kind == "adamw") return {&p.m, &p.v};
  return {&p.m};
}

double Optimizer::step_with_norm(const std::vector<const float*>& grads, float grad_scale, double norm) {
  OptimizerKnobs k = next_knobs();
  record_step(k);
  float scale = grad_scale;
  if (k.clip > 0 && norm > k.clip) scale = static_cast<float>(grad_scale * k.clip / (norm + 1e-6));
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    float* w = p.value.mutable_data<float>() + p.offset;
    float wd = p.decay ? k.weight_decay : 0.f;
    if (k.adamw) {
      kernels::adamw_update(w, grads[i], p.m.mutable_data<float>(), p.v.mutable_data<float>(), p.length, k.lr, k.beta1, k.beta2,
                            k.eps, wd, k.t, scale);
    } else {
      kernels::sgd_update(w, grads[i], p.m.mutable_data<float>(), p.length, k.lr, k.momentum, wd, k.nesterov, k.first, scale);
    }
  }
  return norm;
}

std::map<std::string, Tensor> Optimizer::state() const {
  std::map<std::string, Tensor> s;
  for (const Param& p : params_) {
    if (cfg_.kind == "adamw") {
      s[p.name + ".m"] = p.m;
      s[p.name + ".v"] = p.v;
    } else {
      s[p.name + ".momentum"] = p.m;
    }
  }
  return s;
}

Status Optimizer::set_state(const std::map<std::string, Tensor>& s, int64_t t) {
  // checked whole before anything is copied: a refused state leaves the optimizer as it was
  auto find = [&](const Param& p, const char* suffix) -> Expected<const Tensor*> {
    auto it = s.find(p.name + suffix);
    if (it == s.end()) return error("optimizer state '{}{}' is missing", p.name, suffix);
    if (it->second.dtype() != DType::kF32 || it->second.shape() != p.m.shape()) {
      return error("optimizer state '{}{}' is {} {}, the parameter's shard is float32 {}", p.name, suffix, dtype_name(it->second.dtype()),
                   shape_str(it->second.shape()), shape_str(p.m.shape()));
    }
    return &it->second;
  };
  std::vector<std::pair<const Tensor*, Tensor*>> copies;
  for (Param& p : params_) {
    if (cfg_.kind == "adamw") {
      OASES_ASSIGN_OR_RETURN(const Tensor* m, find(p, ".m"));
      OASES_ASSIGN_OR_RETURN(const Tensor* v, find(p, ".v"));
      copies.emplace_back(m, &p.m);
      copies.emplace_back(v, &p.v);
    } else {
      OASES_ASSIGN_OR_RETURN(const Tensor* m, find(p, ".momentum"));
      copies.emplace_back(m, &p.m);
    }
  }
  if (t < 0) return error("optimizer step {} is negative", t);
  for (auto& [src, dst] : copies) std::memcpy(dst->raw_mutable(), src->raw(), dst->nbytes());
  t_ = t;
  return Status::ok();
}

}  // namespace oases
