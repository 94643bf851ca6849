// The CUDA executor backend: runs a Program's instruction stream on a compute stream and a
// communication stream following its StreamPlan (executor/stream_plan.h).
//
// Memory: the activation arena is one device allocation of the memory plan's peak, so every value
// has a fixed device address and every kernel's operands are bound once, when the runner is made;
// constants and graph inputs have their own allocations; kernel scratch (norm and loss partial
// sums, collective staging) comes from the stream-ordered pool (cudaMallocAsync) and is released
// in stream order after the launch.
//
// Uploads: constants go up on the first run and again only when the host says they changed
// (constants_changed: parameters restored from a checkpoint); between steps the device copy is the
// current one (the DeviceTrainer updates it in place). Inputs are copied into one of two page-locked
// staging buffers, sent to a device staging buffer on a copy stream, and moved to their slots on
// the compute stream once both the copy and the previous reader are done, so the next
// micro-batch's upload overlaps this one's compute.
//
// A run enqueues every launch, event record and event wait of the plan, then the copies of graph
// outputs and kept values into the (page-locked) host arena, and waits once at the end, with the
// NCCL watchdog. Nothing inside the step waits on the host.
#pragma once

#include <cudnn.h>

#include <memory>
#include <string>
#include <vector>

#include "executor/cuda/cuda_context.h"
#include "executor/cuda/nccl_communicator.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/stream_plan.h"

namespace oases::cuda {

class CudaRunner : public DeviceRunner {
 public:
  CudaRunner(const Program& p, const ExecOptions& o, RunState* st) : prog_(p), opts_(o), state_(st) {}
  const std::vector<CommGroup*>& groups() const { return opts_.groups; }
  ~CudaRunner() override;
  Status init();

  void run(const std::vector<const void*>& inputs, void* host_arena, std::vector<double>* node_ms) override;
  void stage_inputs(const std::vector<const void*>& inputs) override;
  void enqueue_program(bool timed) override;
  void synchronize(const char* what) override;
  void read_timing(std::vector<double>* node_ms) override;
  void read_spans(std::vector<DeviceSpan>* spans) override;
  void constants_changed() override { consts_dirty_ = true; }
  void* address(ValueId v) const override;
  void copy_to_host(ValueId v, void* dst) override;
  void copy_from_host(ValueId v, const void* src) override;
  size_t peak_device_bytes() const override;

  cudaStream_t compute_stream() const { return streams_[0]; }
  int device() const { return device_; }
  const Program& program() const { return prog_; }

 private:
  const Program& prog_;
  ExecOptions opts_;
  RunState* state_;
  int device_ = 0;
  cudaStream_t streams_[kNumStreams] = {nullptr, nullptr, nullptr};  // compute, communication, channel
  cudaStream_t copy_stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t origin_ = nullptr;     // a timed enqueue's first event (the time base of its spans)
  std::vector<int> stream_of_;       // per instruction: the stream of its last timed launch (-1: none)
  std::vector<cudaEvent_t> timing_;  // node timing: a start and an end event per instruction, made on first use
  cudaEvent_t fork_ = nullptr, comm_end_ = nullptr, channel_end_ = nullptr, done_ = nullptr;
  StreamPlan plan_;
  void* arena_ = nullptr;
  void* consts_ = nullptr;
  void* inputs_ = nullptr;
  size_t consts_bytes_ = 0, inputs_bytes_ = 0;
  std::vector<int64_t> const_off_, input_off_;  // by ValueId, -1 when not one
  bool consts_dirty_ = true;
  // input staging: page-locked host buffers and device buffers, used in turn
  void* pinned_[2] = {nullptr, nullptr};
  void* staged_[2] = {nullptr, nullptr};
  cudaEvent_t sent_[2] = {nullptr, nullptr};      // the copy stream's upload of buffer i is done
  cudaEvent_t consumed_[2] = {nullptr, nullptr};  // the compute stream has moved buffer i into place
  int next_stage_ = 0;
  unsigned long long* fault_ = nullptr;
  unsigned long long* fault_host_ = nullptr;
  bool fault_armed_ = false;  // the fault word was reset since the last wait
  std::unique_ptr<BlasHandles> blas_;
  cudnnHandle_t cudnn_ = nullptr;
  std::vector<KernelContext> ctx_;
  std::vector<const CudaKernelFn*> fns_;
  std::vector<NcclGroup*> nccl_;
  std::vector<ValueId> copy_back_;
  void* registered_host_ = nullptr;

  void* device_ptr(ValueId v) const;
  void upload_constants();
  void check_fault();
};

}  // namespace oases::cuda
