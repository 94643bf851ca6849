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

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "executor/communicator.h"

namespace oases::cuda {

// The NCCL groups alive in a process, so that one failing rank's abort reaches every one of them
// (a group leaves it when destroyed).
class NcclRegistry {
 public:
  void add(class NcclGroup* g);
  void remove(class NcclGroup* g);
  void abort_all(const std::string& why);
  std::vector<NcclGroup*> groups();

 private:
  std::mutex mu_;
  std::set<NcclGroup*> groups_;
};

struct NcclEvent;

class NcclGroup : public StreamGroup {
 public:
  NcclGroup(ncclComm_t comm, std::vector<int> members, int rank, std::shared_ptr<NcclRegistry> registry = nullptr);
  ~NcclGroup() override;
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }

  void set_stream(void* s) override { stream_ = static_cast<cudaStream_t>(s); }
  cudaStream_t stream() const { return stream_; }
  void begin_batch() override;
  void end_batch() override;

  void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) override;
  void all_gather(const void* in, void* out, int64_t bytes) override;
  void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) override;
  void all_to_all(const void* in, void* out, int64_t bytes) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void shift(const void* in, void* out, int64_t bytes, int offset) override;
  // Point to point with member `peer` of this group (a rank's own index too, inside a batch).
  void send(const void* data, int64_t bytes, int peer);
  void recv(void* data, int64_t bytes, int peer);
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
  std::shared_ptr<NcclRegistry> registry_;
};

// An NCCL communicator of the members of `host` (a group of the host communicator, MPI or thread
// ranks): the first member makes the unique id and broadcasts it over `host`. Throws on failure.
ncclComm_t nccl_comm_over(CommGroup& host);

// The world over NCCL: point-to-point transfers between any two ranks and channel groups of any
// rank set, on device memory, enqueued on the stream set with set_stream (the executor's
// communication or channel stream) and returning at once; a request's wait() blocks the host
// until the transfer is done, watching for NCCL's asynchronous errors, and past `timeout_s` aborts
// every NCCL communicator of the process and throws. Bootstrapped over `host` (which must outlive
// it): mesh groups over the host's group of the same ranks, channel groups over the host's member
// group of the same ranks and tag (only their members call it, as for MPI and thread ranks: NCCL's
// ncclCommSplit would need every world rank), and transfers between two ranks over a two-rank
// communicator per tag, its id sent over the host's point-to-point (messages of one (from, to, tag)
// keep their order; different tags never queue behind each other). A rank's transfers to itself
// are device copies, but between begin_batch() and end_batch(), where they go to NCCL as one group
// with the others issued there.
class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(Communicator* host);
  ~NcclCommunicator() override;
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string kind() const override { return "nccl"; }
  std::unique_ptr<CommGroup> make_group(const std::vector<int>& ranks) override;
  void abort(const std::string& why) override;
  std::unique_ptr<CommRequest> isend(const void* data, int64_t bytes, int to, int tag) override;
  std::unique_ptr<CommRequest> irecv(void* data, int64_t bytes, int from, int tag) override;

  void set_stream(void* s) override { stream_ = static_cast<cudaStream_t>(s); }
  cudaStream_t stream() const { return stream_; }
  void begin_batch() override;
  void end_batch() override;
  void connect(int peer, int tag) override { pair(peer, tag); }
  // Its pair and channel communicators made so far (the step's watchdog watches them too).
  std::vector<NcclGroup*> groups() { return registry_->groups(); }

 protected:
  std::unique_ptr<CommGroup> make_channel_group(const std::vector<int>& ranks, int tag) override;

 private:
  struct SelfTransfer;
  NcclGroup& pair(int peer, int tag);  // this rank and `peer`'s communicator for `tag`, made on first use
  std::unique_ptr<CommRequest> self_transfer(const void* send, void* recv, int64_t bytes, int tag);
  std::unique_ptr<NcclGroup> adopt(ncclComm_t comm, std::vector<int> members, int rank);
  std::unique_ptr<CommRequest> request(NcclGroup& g, std::string what);  // done when the transfer just issued is

  Communicator* host_;
  cudaStream_t stream_ = nullptr;
  int batch_depth_ = 0;
  std::shared_ptr<NcclRegistry> registry_ = std::make_shared<NcclRegistry>();
  std::map<std::pair<int, int>, std::unique_ptr<NcclGroup>> pairs_;                    // (peer, tag)
  std::map<int, std::vector<std::shared_ptr<SelfTransfer>>> self_sends_, self_recvs_;  // by tag, unmatched, in order
  std::vector<std::shared_ptr<NcclEvent>> batched_;  // the batch's requests, recorded at end_batch()
};

ncclDataType_t nccl_type(DType t);

// Waits for `done` (an event recorded after the step's work) while watching `groups` for
// asynchronous NCCL errors; past `timeout_s` every group is aborted and the call throws saying a
// peer may have failed. `what` names the wait in the message.
void wait_with_watchdog(cudaEvent_t done, const std::vector<NcclGroup*>& groups, double timeout_s, const std::string& what);

}  // namespace oases::cuda
