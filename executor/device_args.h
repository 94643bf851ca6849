// Kernel arguments the CUDA glue derives from a node, built by plain host code so the CPU tests
// check them against the CPU kernels (the CUDA glue only passes them on).
#pragma once

#include "executor/kernel_context.h"
#include "kernels/cuda/random.h"

namespace oases {

// Dropout of node c (input 0 local shape, attributes key_node, mask_shape, mask_offsets,
// shard_axes) at `ratio`: the key, threshold and the local -> global mask index map that the CPU
// kernel (executor/cpu/common.cpp apply_dropout) walks row by row.
cuda::DropoutArgs make_dropout_args(const KernelContext& c, float ratio);

}  // namespace oases
