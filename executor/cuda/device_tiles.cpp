#include "executor/cuda/device_tiles.h"

#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/nd.h"

namespace oases::cuda {

CudaTileMemory::~CudaTileMemory() {
  for (void* p : scratch_) cudaFreeAsync(p, stream_);
}

char* CudaTileMemory::scratch(int64_t bytes) {
  void* p = nullptr;
  OASES_CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), stream_));
  scratch_.push_back(p);
  return static_cast<char*>(p);
}

void CudaTileMemory::copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es) {
  if (region.empty()) return;
  copy(from, to, static_cast<size_t>(es), box_copy_plan(region.offset, region.extent, from_box.offset, from_box.extent, to_box.offset, to_box.extent),
       stream_);
}

}  // namespace oases::cuda
