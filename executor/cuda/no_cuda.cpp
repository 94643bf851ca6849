// The CUDA entry points of a build without the CUDA backend (CMake OASES_CUDA=OFF, or AUTO without
// nvcc): every one says so instead of failing to link.
#include <nlohmann/json.hpp>

#include "executor/device.h"
#include "executor/executor.h"
#include "executor/measure_cuda.h"

namespace oases {

namespace {
const char* kNoCuda = "built without CUDA (configure with -DOASES_CUDA=ON or AUTO on a machine with nvcc)";
}

Expected<std::unique_ptr<DeviceRunner>> make_cuda_runner(const Program&, const ExecOptions&, RunState*) {
  return Status::error(kNoCuda);
}
Expected<std::unique_ptr<DeviceTrainer>> make_device_trainer(DeviceRunner&, const Graph&, const std::vector<ValueId>&,
                                                             const std::vector<ValueId>&, ValueId, const Optimizer&) {
  return Status::error(kNoCuda);
}
Expected<double> measure_cuda_optimizer() {
  return Status::error(kNoCuda);
}
bool cuda_built() {
  return false;
}
Status cuda_usable() {
  return Status::error(kNoCuda);
}
Status cuda_select_device(int) {
  return Status::error(kNoCuda);
}
std::string cuda_report_json() {
  return nlohmann::json{{"built", false}, {"libraries", nlohmann::json::array()}, {"devices", {{"count", 0}, {"error", kNoCuda}}}}.dump(2);
}
std::vector<std::string> cuda_kernel_ops() {
  return {};
}
Expected<std::vector<std::unique_ptr<CommGroup>>> make_nccl_groups(const std::vector<CommGroup*>&, double) {
  return Status::error(kNoCuda);
}
Expected<DeviceComms> make_device_comms(Communicator*, const std::vector<CommGroup*>&, double, std::string*) {
  return Status::error(kNoCuda);
}

}  // namespace oases
