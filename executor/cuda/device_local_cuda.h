// The CUDA side of ranks that share devices (executor/device_local_comm.h): copies as
// cudaMemcpyAsync (peer copies through unified addressing), reductions as the element-wise kernels
// (an operand on another device copied over first), events as CUDA events, scratch from the
// stream-ordered allocator. Streams are cudaStream_t; each rank's thread sets its device first.
#pragma once

#include <memory>

#include "executor/device_local_comm.h"

namespace oases::cuda {

std::shared_ptr<DeviceOps> cuda_device_ops();

}  // namespace oases::cuda
