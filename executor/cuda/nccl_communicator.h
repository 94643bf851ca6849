// NCCL groups: the CommGroup interface over device memory. Each call enqueues the collective on
// the stream the CUDA executor set (set_stream) and returns at once; the executor orders it
// against the compute stream with events and learns of its completion (or of a failed peer,
// through ncclCommGetAsyncError and a deadline) without blocking the host inside a step.
// Calls between begin_batch() and end_batch() are issued as one ncclGroupStart/ncclGroupEnd.
// Every failing NCCL call throws with the call spelled out; abort() tears the communicator down
// with ncclCommAbort so no rank hangs on a peer that died.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "executor/communicator.h"

namespace oases::cuda {

class NcclGroup : public CommGroup {
 public:
  NcclGroup(ncclComm_t comm, std::vector<int> members, int rank);
  ~NcclGroup() override;
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }

  void set_stream(cudaStream_t s) { stream_ = s; }
  cudaStream_t stream() const { return stream_; }
  void begin_batch();
  void end_batch();

  void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) override;
  void all_gather(const void* in, void* out, int64_t bytes) override;
  void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) override;
  void all_to_all(const void* in, void* out, int64_t bytes) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void shift(const void* in, void* out, int64_t bytes, int offset) override;
  // A one-element all-reduce, waited for on the host with the watchdog (not for use inside a step).
  void barrier() override;

  // Throws (and aborts the communicator) when NCCL reported an asynchronous error.
  void check_async();
  void abort(const std::string& why);
  bool aborted() const { return aborted_; }
  // Seconds the host waits for a step with this group's collectives before aborting (--comm-timeout).
  void set_timeout(double s) { timeout_s_ = s; }
  double timeout() const { return timeout_s_; }

 private:
  ncclComm_t comm_ = nullptr;
  std::vector<int> members_;
  int rank_ = 0;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
  int batch_depth_ = 0;
  double timeout_s_ = kDefaultCommTimeoutS;
};

ncclDataType_t nccl_type(DType t);

// Waits for `done` (an event recorded after the step's work) while watching `groups` for
// asynchronous NCCL errors; past `timeout_s` every group is aborted and the call throws saying a
// peer may have failed. `what` names the wait in the message.
void wait_with_watchdog(cudaEvent_t done, const std::vector<NcclGroup*>& groups, double timeout_s, const std::string& what);

}  // namespace oases::cuda
