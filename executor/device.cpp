#include "executor/device.h"

#include "executor/executor.h"

namespace oases {

// Defined by executor/cuda/cuda_runner.cpp, or executor/cuda/no_cuda.cpp in a build without CUDA.
Expected<std::unique_ptr<DeviceRunner>> make_cuda_runner(const Program& prog, const ExecOptions& opts, RunState* state);

Expected<std::unique_ptr<DeviceRunner>> make_device_runner(const std::string& device, const Program& prog, const ExecOptions& opts,
                                                           RunState* state) {
  if (device.empty() || device == "cpu") return std::unique_ptr<DeviceRunner>();
  if (device == "cuda") {
    OASES_RETURN_IF_ERROR(cuda_usable());
    return make_cuda_runner(prog, opts, state);
  }
  return error("unknown device '{}' (cpu or cuda)", device);
}

}  // namespace oases
