// What the device trainer (device_trainer.cpp) and its GPU tests share: the scalars of one update
// as the multi-tensor kernels read them (kernels/cuda/optim.h), from the optimizer's knobs.
#pragma once

#include "executor/optimizer.h"
#include "kernels/cuda/optim.h"

namespace oases::cuda {

// The update's scalars for `k` with gradients scaled by `grad_scale` (1 / (micro-batches · loss
// scale)); no skipping, the device's own norm.
inline StepScalars step_scalars(const OptimizerKnobs& k, float grad_scale) {
  StepScalars sc;
  sc.lr = k.lr;
  sc.beta1 = k.beta1;
  sc.beta2 = k.beta2;
  sc.one_minus_beta1 = k.one_minus_beta1;
  sc.one_minus_beta2 = k.one_minus_beta2;
  sc.eps = k.eps;
  sc.weight_decay = k.weight_decay;
  sc.bc1 = k.bc1;
  sc.bc2 = k.bc2;
  sc.momentum = k.momentum;
  sc.grad_scale = grad_scale;
  sc.clip = k.clip;
  sc.adamw = k.adamw ? 1 : 0;
  sc.nesterov = k.nesterov ? 1 : 0;
  sc.first = k.first ? 1 : 0;
  return sc;
}

}  // namespace oases::cuda
