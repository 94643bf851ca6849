// Ranks that share devices (issue 32 item 2): thread ranks of one process whose collectives,
// point-to-point transfers and channel groups are stream-ordered copies and reductions on the
// devices, with NCCL's semantics: every member of a group calls its collectives in one order;
// a call enqueues the work on the stream the caller set and returns without waiting for the device
// (it waits on the host only until every member has issued the same call, twice: once for their
// inputs, once for their reads of them); each rank's later work on that stream is ordered after
// the collective by events; reductions sum in member order, so every member gets bit-identical
// results and nothing depends on timing.
//
// What the device does is behind DeviceOps: the CUDA one (executor/cuda, copies and reduction
// kernels on CUDA streams, events) and the host one here (synchronous memcpy and reduce_into, for
// the logic's tests on the CPU). A collective of member i of n (fixed order j = 0 … n-1):
//   all_reduce      tmp = in_0 op in_1 op … ; after every member's reads: data = tmp
//   all_gather      out[j] = in_j
//   reduce_scatter  tmp = chunk i of in_0 op … ; after the reads: out = tmp
//   all_to_all      out[j] = chunk i of in_j (through tmp when out overlaps in)
//   broadcast       data = data_root (the root copies nothing)
//   shift           out = in_{(i - offset) mod n} (through tmp when out overlaps in)
// Point to point (isend/irecv, any two ranks, in order per (from, to, tag)): the later of the two
// calls enqueues the copy (on its own stream, after the other side's event) and records its end;
// a request's wait() blocks the host until the other side has been issued, then orders the
// caller's stream after the copy (it does not wait for the device).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/communicator.h"
#include "graph/dtype.h"

namespace oases {

class DeviceOps {
 public:
  using Stream = void*;
  using Event = void*;
  virtual ~DeviceOps() = default;
  virtual std::string name() const = 0;
  // A new event, recorded on `s` after the work enqueued there so far.
  virtual Event record(Stream s) = 0;
  // `s` waits for `e` (work enqueued on `s` afterwards starts after it).
  virtual void wait(Stream s, Event e) = 0;
  // The event is no longer needed (every wait on it has been enqueued).
  virtual void release(Event e) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes, Stream s) = 0;
  // acc = acc op x, element-wise.
  virtual void reduce(void* acc, const void* x, int64_t count, DType dt, ReduceOp op, Stream s) = 0;
  // Stream-ordered scratch memory.
  virtual void* scratch(int64_t bytes, Stream s) = 0;
  virtual void free_scratch(void* p, Stream s) = 0;
};

// Synchronous host memory: every call done when it returns (the events are nothing).
std::shared_ptr<DeviceOps> host_device_ops();

class DeviceLocalWorld;

// N ranks as threads of one process sharing `ops`' devices; a communicator per rank thread.
std::shared_ptr<DeviceLocalWorld> make_device_local_world(int size, std::shared_ptr<DeviceOps> ops, double timeout_s = kDefaultCommTimeoutS);
std::unique_ptr<Communicator> device_local_communicator(const std::shared_ptr<DeviceLocalWorld>& world, int rank);

// The stream a device-local group's or communicator's calls enqueue on (the executor's
// communication or channel stream); null is the device's default stream.
void set_device_local_stream(CommGroup& g, DeviceOps::Stream s);
void set_device_local_stream(Communicator& c, DeviceOps::Stream s);

}  // namespace oases
