// Communicators: one interface, three implementations (local threads, MPI processes, NCCL).
//
// A Communicator knows this rank and the world size and makes CommGroups: every member of a group
// calls make_group with the same rank list, and all ranks create their groups in the same order
// (one group per mesh axis), so no implementation can deadlock on group creation. Collectives on a
// group are blocking and deterministic: every member gets bit-identical results (sums in rank
// order), which keeps replicated parameters identical across ranks.
//
// A failed or missing peer never hangs a rank: collectives give up after `timeout_s` with an error
// naming the group and the operation, and abort() (called when a rank fails) wakes every waiter.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/dtype.h"

namespace oases {

enum class ReduceOp { kSum, kMax };

// Seconds a collective waits for its peers before the run stops (--comm-timeout): long enough for a
// slow step of a large model on a loaded machine, short enough that a hung rank is found in
// minutes, not after the 10-minute defaults of MPI/NCCL watchdogs. The flag accepts
// (0, kMaxCommTimeoutS].
inline constexpr double kDefaultCommTimeoutS = 120;
inline constexpr double kMaxCommTimeoutS = 86400;

// A pending non-blocking operation (point to point, or a broadcast on a channel group).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Blocks until the operation is done; after the communicator's timeout, throws (and stops the
  // job) with an error naming the operation and the peer.
  virtual void wait() = 0;
  // Drives the operation forward without blocking (MPI progresses a non-blocking collective only
  // inside MPI calls); true once it is done. Requests that move without being driven (thread
  // ranks' mailboxes) may answer false until wait().
  virtual bool test() { return false; }
  // Orders the work enqueued next on the stream the operation was issued on after it (device
  // communicators: without blocking the host where the device can order it; ranks sharing a device
  // wait on the host only until the peer has issued its side). Host communicators: wait().
  virtual void wait_ordered() { wait(); }
};

class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int rank() const = 0;  // index of this rank in the group
  virtual int size() const = 0;
  virtual const std::vector<int>& members() const = 0;  // world ranks
  // In place: data (count elements of dt) becomes the reduction over the group.
  virtual void all_reduce(void* data, int64_t count, DType dt, ReduceOp op) = 0;
  // out = concatenation of every member's `bytes` of in, in group order.
  virtual void all_gather(const void* in, void* out, int64_t bytes) = 0;
  // in holds size() chunks of `count` elements; out gets the reduction of this member's chunk.
  virtual void reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) = 0;
  // in holds size() chunks of `bytes`; chunk j goes to member j; out gets chunk i of every member.
  virtual void all_to_all(const void* in, void* out, int64_t bytes) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // One step of a ring: out = the `bytes` of `in` of member (rank - offset) mod size, while this
  // member's go to member (rank + offset) mod size (the decomposed all-gather and reduce-scatter
  // of collective matmuls). The default runs an all-gather and keeps one part.
  virtual void shift(const void* in, void* out, int64_t bytes, int offset);
  virtual void barrier() = 0;
  // Non-blocking broadcast from member `root`; `data` must stay alive until the wait. The default
  // runs the blocking broadcast.
  virtual std::unique_ptr<CommRequest> ibroadcast(void* data, int64_t bytes, int root);
  std::string describe() const;  // "group [0, 1] (member 1 of 2)"
};

// A group whose collectives a device enqueues on a stream and returns (NCCL, or ranks sharing
// devices: executor/device_local_comm.h): the CUDA executor sets the stream before each call and
// brackets the calls it issues together with begin_batch / end_batch.
class StreamGroup : public CommGroup {
 public:
  virtual void set_stream(void* stream) = 0;
  virtual void begin_batch() {}
  virtual void end_batch() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string kind() const = 0;  // "local" | "mpi" | "nccl"
  virtual std::unique_ptr<CommGroup> make_group(const std::vector<int>& ranks) = 0;
  // Stops every rank's pending and future collectives with an error saying why.
  virtual void abort(const std::string& why) = 0;
  // What the thread ranks of one process share (the same for all of them; null for processes):
  // what ranks sharing a device key their shared state by.
  virtual const void* process_world() const { return nullptr; }

  // Device communicators (NCCL, ranks sharing devices): the stream point-to-point transfers are
  // enqueued on (the executor's channel stream); host communicators ignore it.
  virtual void set_stream(void* stream) {}
  // Transfers issued between the two go to the device as one batch (NCCL: one group call, none of
  // whose requests may be waited for inside it). Host communicators ignore them.
  virtual void begin_batch() {}
  virtual void end_batch() {}
  // Makes the transfers with `peer` on `tag` ready to be issued (NCCL: the pair's communicator,
  // made with the peer, which calls it too, so ranks call it in one global order); others connect
  // on first use.
  virtual void connect(int peer, int tag) {}

  // Channels: traffic between meshes (cross-mesh resharding) that must never mix with, or queue
  // behind, a mesh's own collectives. Tags are 0 … kMaxChannelTag.
  static constexpr int kMaxChannelTag = 32767;
  // Non-blocking point to point between any two world ranks; messages of one (from, to, tag)
  // arrive in the order sent. `data` must stay alive until the wait.
  virtual std::unique_ptr<CommRequest> isend(const void* data, int64_t bytes, int to, int tag);
  virtual std::unique_ptr<CommRequest> irecv(void* data, int64_t bytes, int from, int tag);
  // The group of `ranks` (any world ranks; their order gives member indices) on channel `tag`,
  // created on first use and cached. Only its members call it (MPI_Comm_create_group, not a
  // world-wide split), and ranks that share several groups create them in one order.
  CommGroup& channel_group(const std::vector<int>& ranks, int tag);
  // The same, not cached: the caller owns it (a mesh's groups when meshes leave ranks out).
  std::unique_ptr<CommGroup> make_member_group(const std::vector<int>& ranks, int tag);

  double timeout_s = kDefaultCommTimeoutS;

 protected:
  virtual std::unique_ptr<CommGroup> make_channel_group(const std::vector<int>& ranks, int tag);
  // Frees the cached channel groups (an implementation that shuts its library down calls this first).
  void drop_channel_groups() { channel_groups_.clear(); }

 private:
  std::map<std::pair<std::vector<int>, int>, std::unique_ptr<CommGroup>> channel_groups_;
};

// --- local: N ranks as threads of one process --------------------------------------------------

class LocalWorld;

// Shared state of N in-process ranks; make one, hand a communicator per thread.
std::shared_ptr<LocalWorld> make_local_world(int size, double timeout_s = kDefaultCommTimeoutS);
std::unique_ptr<Communicator> local_communicator(const std::shared_ptr<LocalWorld>& world, int rank);

// Element-wise reduction helpers shared by the implementations.
void reduce_into(void* acc, const void* x, int64_t count, DType dt, ReduceOp op);

}  // namespace oases
