// Error checks for CUDA runtime, cuBLAS, cuDNN and NCCL calls: a failing call throws
// std::runtime_error naming the call, the library's message, and the place (kernels/ uses nothing
// of ours, so not OasesError; the CUDA executor turns these into the node's error).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/elem.h"

namespace oases::cuda {

[[noreturn]] void throw_error(const char* library, const char* call, long code, const char* message, const char* file, int line);

// Grid for a grid-stride loop over n elements with `threads` per block.
unsigned grid_for(int64_t n, int threads);

}  // namespace oases::cuda

#define OASES_CUDA_CHECK(call)                                                                                                  \
  do {                                                                                                                          \
    cudaError_t oases_e_ = (call);                                                                                              \
    if (oases_e_ != cudaSuccess)                                                                                                \
      ::oases::cuda::throw_error("CUDA", #call, static_cast<long>(oases_e_), cudaGetErrorString(oases_e_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration or an earlier asynchronous fault, named by the kernel.
#define OASES_CUDA_CHECK_LAUNCH(kernel_name)                                                                                            \
  do {                                                                                                                                  \
    cudaError_t oases_e_ = cudaGetLastError();                                                                                          \
    if (oases_e_ != cudaSuccess)                                                                                                        \
      ::oases::cuda::throw_error("CUDA", "launch of " kernel_name, static_cast<long>(oases_e_), cudaGetErrorString(oases_e_), __FILE__, \
                                 __LINE__);                                                                                             \
  } while (0)
