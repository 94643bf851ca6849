// oases-profile --backend cuda: the GPU at hand measured for the planner (executor/measure_cuda.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/model_loader.h"

namespace oases {

struct CudaProfileOptions {
  std::string out, model, dtype = "bf16";
  ImportOptions import;
  int64_t ranks = 8;  // the GPUs the model's plans are profiled for (rank 0's shapes)
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> degrees;  // empty: every tp candidate
  std::vector<int64_t> chunks{1, 2, 4};
  int reps = 5;
};

// Writes the profile; returns the tool's exit code (2 with one line on error).
int profile_cuda(const CudaProfileOptions& o);

}  // namespace oases
