// Dropout, forward and backward: y = x · keep / (1 − ratio), keep = 1 with probability 1 − ratio.
// The mask is never stored for the backward pass: keep is a pure function of (key, position of
// the element in the whole, unsplit tensor), drawn by a counter-based generator (splitmix64):
//   keep(i) = mix64(key + i) >= ratio · 2⁶⁴,  key = dropout_key(seed, step, chunk, key node)
// so an element gets the same mask under any chunking, sharding or recomputation, and the backward
// (dx = dy · keep / (1 − ratio)) is the forward applied to dy with the same key.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace oases::kernels {

// Key of one dropout node's masks for one (seed, step, chunk); the same bits as the CUDA generator's
// (kernels/cuda/random.h).
uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t chunk, std::string_view key_node);

// `local` is this tensor's shape; it is the block at `offsets` of the whole tensor of shape
// `whole` (the same rank), whose row-major element index feeds the generator. mask (may be null)
// receives keep as 0/1. ratio in [0, 1).
void dropout(const float* x, float* y, uint8_t* mask, const std::vector<int64_t>& local, const std::vector<int64_t>& whole,
             const std::vector<int64_t>& offsets, uint64_t key, float ratio);

}  // namespace oases::kernels
