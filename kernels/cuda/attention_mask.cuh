// The attention score of query i and key j of (batch b, head h) with the causal limit and the mask
// of an AttentionDesc applied: -inf where masked (shared by both attention paths).
#pragma once

#include "kernels/cuda/attention.h"

namespace oases::cuda {

__device__ __forceinline__ float attention_masked(const AttentionDesc& a, int64_t b, int64_t h, int64_t i, int64_t j, float s) {
  if (a.causal && j > i + (a.tk - a.tq)) return -INFINITY;
  if (a.mask) {
    int64_t off = b * a.mask_strides[0] + h * a.mask_strides[1] + i * a.mask_strides[2] + j * a.mask_strides[3];
    if (a.mask_is_bool) {
      if (!static_cast<const uint8_t*>(a.mask)[off]) return -INFINITY;
    } else {
      s += static_cast<const float*>(a.mask)[off];
    }
  }
  return s;
}

}  // namespace oases::cuda
