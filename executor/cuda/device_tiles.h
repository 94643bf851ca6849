// A reshard's tiles in device memory (executor/reshard_runner.h TileMemory): boxes copied by the
// strided copy kernel (kernels/cuda/nd.h box_copy_plan), scratch from the stream-ordered pool, all
// enqueued on one stream; the scratch is freed, in stream order, when the object goes. The CUDA
// Reshard kernel runs its transfers through it on the channel stream.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "executor/reshard_runner.h"

namespace oases::cuda {

class CudaTileMemory : public TileMemory {
 public:
  explicit CudaTileMemory(cudaStream_t s) : stream_(s) {}
  ~CudaTileMemory() override;
  CudaTileMemory(const CudaTileMemory&) = delete;
  CudaTileMemory& operator=(const CudaTileMemory&) = delete;

  char* scratch(int64_t bytes) override;
  void copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es) override;
  void* stream() const override { return stream_; }

 private:
  cudaStream_t stream_;
  std::vector<void*> scratch_;
};

}  // namespace oases::cuda
