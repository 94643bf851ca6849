// Counter-based dropout masks, bit-identical to the CPU kernels (executor/cpu/common.cpp): element
// e of the whole, unsplit mask tensor is kept when splitmix64(key + e) >= ratio · 2^64. A rank or
// a micro-batch chunk that holds part of the tensor finds e through an affine map of its local
// index (offsets of its shard and chunk), so every layout draws the single-rank mask.
#pragma once

#include <cstdint>

#include "kernels/cuda/nd.h"

namespace oases::cuda {

OASES_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct DropoutArgs {
  uint64_t key = 0;        // executor's dropout_key(run state, key node)
  uint64_t threshold = 0;  // ratio · 2^64
  float scale = 1.f;       // 1 / (1 - ratio)
  Iter local;              // the local tensor's shape
  Affine global;           // local coordinates -> index in the whole mask tensor
};

OASES_HD inline bool dropout_keep(const DropoutArgs& a, int64_t local_index) {
  int64_t e = affine_offset(a.local, a.global, local_index);
  return splitmix64(a.key + static_cast<uint64_t>(e)) >= a.threshold;
}

}  // namespace oases::cuda
