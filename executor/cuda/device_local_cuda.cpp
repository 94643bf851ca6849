#include "executor/cuda/device_local_cuda.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "executor/cuda/cuda_context.h"
#include "executor/cuda/nccl_communicator.h"
#include "kernels/cuda/version.h"
#include "executor/device.h"
#include "graph/sharding.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"

namespace oases::cuda {

namespace {

cudaStream_t as_stream(DeviceOps::Stream s) {
  return static_cast<cudaStream_t>(s);
}

// The device holding `p` (-1: host memory or unknown).
int device_of(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

class CudaOps : public DeviceOps {
 public:
  std::string name() const override { return "cuda"; }
  Event record(Stream s) override {
    cudaEvent_t e = nullptr;
    OASES_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    OASES_CUDA_CHECK(cudaEventRecord(e, as_stream(s)));
    return e;
  }
  void wait(Stream s, Event e) override {
    if (e) OASES_CUDA_CHECK(cudaStreamWaitEvent(as_stream(s), static_cast<cudaEvent_t>(e), 0));
  }
  void release(Event e) override {
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void copy(void* dst, const void* src, int64_t bytes, Stream s) override {
    if (dst == src || bytes <= 0) return;
    OASES_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, as_stream(s)));
  }
  void reduce(void* acc, const void* x, int64_t count, DType dt, ReduceOp op, Stream s) override {
    if (count <= 0) return;
    const int64_t bytes = count * static_cast<int64_t>(dtype_size(dt));
    // the kernel reads x on acc's device: an operand elsewhere is copied over first
    void* local = nullptr;
    if (device_of(x) != device_of(acc)) {
      local = scratch(bytes, s);
      copy(local, x, bytes, s);
      x = local;
    }
    const Elem t = elem(dt);
    binary(op == ReduceOp::kMax ? BinaryOp::kMax : BinaryOp::kAdd, t, t, acc, x, acc, broadcast_plan({count}, {{count}, {count}}),
           as_stream(s));
    if (local) free_scratch(local, s);
  }
  void* scratch(int64_t bytes, Stream s) override {
    void* p = nullptr;
    OASES_CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), as_stream(s)));
    return p;
  }
  void free_scratch(void* p, Stream s) override {
    if (p) OASES_CUDA_CHECK(cudaFreeAsync(p, as_stream(s)));
  }
};

}  // namespace

std::shared_ptr<DeviceOps> cuda_device_ops() {
  return std::make_shared<CudaOps>();
}

}  // namespace oases::cuda

namespace oases {

Expected<DeviceComms> make_device_comms(Communicator* host, const std::vector<CommGroup*>& host_groups, double timeout_s, std::string* why) {
  DeviceComms out;
  if (!host) return out;
  const int devices = cuda::device_info().count;
  const void* process = host->process_world();
  if (!process || devices >= host->size()) {
    if (why) *why = fmt::format("collectives and transfers over NCCL ({} ranks, {} GPU(s))", host->size(), devices);
    OASES_ASSIGN_OR_RETURN(out.groups, make_nccl_groups(host_groups, timeout_s));
    out.world = std::make_unique<cuda::NcclCommunicator>(host);
    out.world->timeout_s = timeout_s;
    return out;
  }
  // the process's thread ranks share one world (made by the first, found by the others)
  static std::mutex mu;
  static std::map<const void*, std::weak_ptr<DeviceLocalWorld>> worlds;
  std::shared_ptr<DeviceLocalWorld> world;
  {
    std::lock_guard<std::mutex> lock(mu);
    world = worlds[process].lock();
    if (!world) {
      world = make_device_local_world(host->size(), cuda::cuda_device_ops(), timeout_s);
      worlds[process] = world;
    }
  }
  try {
    out.world = device_local_communicator(world, host->rank());
    for (CommGroup* hg : host_groups) out.groups.push_back(out.world->make_group(hg->members()));
  } catch (const std::exception& e) {
    return Status::error(fmt::format("device-local groups: {}", e.what()));
  }
  if (why) {
    *why = fmt::format("{} thread ranks on {} GPU(s): collectives and transfers as stream-ordered copies and reductions on the devices "
                       "(device-local)",
                       host->size(), devices);
  }
  return out;
}

}  // namespace oases
