#include "executor/multi_tensor.h"

#include <limits>

namespace oases {

Expected<MultiTensorPlan> plan_multi_tensor(const std::vector<int64_t>& numel, int64_t chunk) {
  if (chunk < 1) return error("multi-tensor chunk {} must be positive", chunk);
  MultiTensorPlan p;
  p.chunk = chunk;
  p.first_block.reserve(numel.size() + 1);
  for (size_t t = 0; t < numel.size(); ++t) {
    if (numel[t] < 0) return error("multi-tensor tensor {} has {} elements", t, numel[t]);
    p.first_block.push_back(static_cast<int32_t>(p.block_tensor.size()));
    for (int64_t s = 0; s < numel[t]; s += chunk) {
      if (p.block_tensor.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        return error("multi-tensor launch over {} tensors needs more than 2^31 - 1 blocks of {} elements", numel.size(), chunk);
      }
      p.block_tensor.push_back(static_cast<int32_t>(t));
      p.block_start.push_back(s);
    }
  }
  p.first_block.push_back(static_cast<int32_t>(p.block_tensor.size()));
  return p;
}

}  // namespace oases
