// Mixed precision as a graph rewrite, made on the forward + loss graph before autodiff so the
// backward pass follows it (the gradient of Cast is a Cast back):
//
//   - the model body (every node the logits depend on) computes in `compute` (float16/bfloat16):
//     each float32 initializer, input or constant it reads enters through a Cast, so parameters
//     stay float32 master weights and their gradients come out float32;
//   - the loss and what follows it (counts, sums, the loss scalar) stay float32: the logits are
//     cast back to float32 before the loss;
//   - a few operand slots keep float32 whatever: Attention's additive mask, Dropout's ratio;
//   - statistics outputs (LayerNorm mean/rstd, attention log-sum-exp) are float32 by their ops'
//     rules already; kernels accumulate in float32.
//
// Returns the number of Casts inserted.
#pragma once

#include "graph/graph.h"

namespace oases {

Expected<int> apply_mixed_precision(Graph& g, DType compute);

// Loss scaling hook (fp16): output 0 becomes loss · S with S the float32 scalar graph input
// kLossScaleInput, so the backward pass starts from S; the Trainer feeds S (executor/training.h).
// An input, not a constant: autodiff folds constant arithmetic, an input it cannot.
inline constexpr const char* kLossScaleInput = "oases_loss_scale";
Status insert_loss_scale_input(Graph& g);

// "fp32" | "bf16" | "fp16" -> the compute dtype; an error names the accepted spellings.
Expected<DType> compute_dtype_from_name(const std::string& name);

}  // namespace oases
