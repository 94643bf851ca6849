// The optimizer step on the device, over every parameter at once (multi-tensor): a handful of
// launches a step, whatever the number of parameters.
//
// A launch walks a block table: block b covers elements [block_start[b], block_start[b] + chunk)
// of tensor block_tensor[b] (blocks of one tensor are consecutive; executor/multi_tensor.h builds
// the table once, since device addresses never move). Every scalar that changes from step to step
// (learning rate, bias corrections, gradient scale) is read from device memory (StepScalars), so a
// captured CUDA graph replays later steps with their own values.
//
// Math, per element, exactly the CPU's (kernels/cpu/optim.cpp: same operations in the same order,
// no fused multiply-add), so a GPU step gives the CPU's bits for the same inputs:
//   AdamW  g = grad·s;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g·g;
//          p −= lr·( (m/bc1) / (√(v/bc2) + ε) + wd·p )
//   SGD    g = grad·s + wd·p;  buf = first ? g : μ·buf + g;  p −= lr·(nesterov ? g + μ·buf : buf)
// with s = grad_scale, lowered to grad_scale·clip/(norm + 1e-6) when clipping applies (computed in
// double as the CPU does). A step whose norm is not finite (and skip_nonfinite) changes nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/check.h"

namespace oases::cuda {

// Device-resident tables of one set of tensors (all arrays in device memory).
struct MultiTensorTables {
  float* const* param = nullptr;       // [tensors] fp32 master weights
  const float* const* grad = nullptr;  // [tensors] gradients of the last micro-batch (fp32)
  float* const* acc = nullptr;         // [tensors] gradient accumulators, or null
  float* const* m = nullptr;           // [tensors] AdamW first moment / SGD momentum
  float* const* v = nullptr;           // [tensors] AdamW second moment, or null
  const int64_t* numel = nullptr;      // [tensors]
  const uint8_t* decay = nullptr;      // [tensors] 1: weight decay applies
  const int32_t* block_tensor = nullptr;  // [blocks]
  const int64_t* block_start = nullptr;   // [blocks]
  const int32_t* first_block = nullptr;   // [tensors + 1] first block of each tensor
  int32_t tensors = 0, blocks = 0;
  int64_t chunk = 0;  // elements per block (a multiple of 4)
  // 1: every param, grad, m and v (and acc) starts on 16 bytes, so the kernels move float4s
  // (the tail of a tensor whose size is not a multiple of 4 goes element by element)
  int32_t aligned16 = 0;
};

// What the host decides for one step, written to device memory before the step's launches.
struct StepScalars {
  float lr = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0, weight_decay = 0;
  float bc1 = 1, bc2 = 1;  // AdamW bias corrections 1 − β^t, as the CPU computes them (float)
  float momentum = 0;
  float grad_scale = 1;  // 1 / (micro-batches · loss scale)
  double clip = 0;       // global-norm clip; 0: off
  double host_norm = 0;  // with use_host_norm: the norm (distributed runs sum shards on the host)
  int32_t adamw = 1, nesterov = 0, first = 0, skip_nonfinite = 0, use_host_norm = 0;
};

// What the host reads back after a step: one small copy.
struct StepOutcome {
  double loss_sum = 0;      // Σ of the micro-batches' losses (scaled by the loss scale)
  double norm = 0;          // global gradient norm (after grad_scale), NaN when the loss was not finite
  double sum_squares = 0;   // Σ g² of the raw gradients
  int32_t skipped = 0;      // 1: nothing was updated
  int32_t pad = 0;
};

// Adds micro-batch loss `loss` (one element of type t) into out->loss_sum (first: replaces it).
void add_loss(Elem t, const void* loss, bool first, StepOutcome* out, cudaStream_t s);
// acc = grad (first) or acc += grad, every tensor.
void multi_tensor_accumulate(const MultiTensorTables& tt, bool first, cudaStream_t s);
// per_tensor[i] = Σ g² of tensor i (from the accumulators when from_acc), in double with a fixed
// order; out->sum_squares the total; out->norm = √total · grad_scale, or the host's norm, NaN when
// skip_nonfinite and the loss is not finite. `partials` holds tt.blocks doubles.
void multi_tensor_norm(const MultiTensorTables& tt, bool from_acc, const StepScalars* sc, double* partials, double* per_tensor,
                       StepOutcome* out, cudaStream_t s);
// The AdamW or SGD update of every tensor (see the header), gradients from the accumulators when
// from_acc; sets out->skipped.
void multi_tensor_update(const MultiTensorTables& tt, bool from_acc, const StepScalars* sc, StepOutcome* out, cudaStream_t s);

}  // namespace oases::cuda
