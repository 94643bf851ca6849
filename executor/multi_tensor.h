// The block table of a multi-tensor launch (kernels/cuda/optim.h): every tensor cut into blocks of
// `chunk` elements, blocks of one tensor consecutive and in tensor order, so one launch of
// ceil(n_i / chunk) summed blocks covers every tensor and a tensor's partial results sit side by
// side. Pure host logic, the same for any device.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/status.h"

namespace oases {

struct MultiTensorPlan {
  int64_t chunk = 0;
  std::vector<int32_t> block_tensor;  // [blocks]
  std::vector<int64_t> block_start;   // [blocks] first element of the block in its tensor
  std::vector<int32_t> first_block;   // [tensors + 1]
};

// Error when chunk < 1, a size is negative, or the blocks would not fit a launch (2^31 − 1).
Expected<MultiTensorPlan> plan_multi_tensor(const std::vector<int64_t>& numel, int64_t chunk);

}  // namespace oases
