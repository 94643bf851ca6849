#include "executor/cuda/nccl_communicator.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "executor/device.h"
#include "graph/sharding.h"
#include "kernels/cuda/check.h"

#define OASES_NCCL_CHECK(call)                                                                                                  \
  do {                                                                                                                          \
    ncclResult_t oases_r_ = (call);                                                                                             \
    if (oases_r_ != ncclSuccess)                                                                                                \
      ::oases::cuda::throw_error("NCCL", #call, static_cast<long>(oases_r_), ncclGetErrorString(oases_r_), __FILE__, __LINE__); \
  } while (0)

namespace oases {
namespace cuda {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF64: return ncclFloat64;
    case DType::kI64: return ncclInt64;
    case DType::kI32: return ncclInt32;
    case DType::kU8:
    case DType::kBool: return ncclUint8;
    case DType::kI8: return ncclInt8;
    case DType::kU32: return ncclUint32;
    case DType::kU64: return ncclUint64;
    default: throw OasesError(fmt::format("[nccl] type {} has no NCCL equivalent", dtype_name(t)));
  }
}

namespace {
ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kMax ? ncclMax : ncclSum;
}
}  // namespace

void NcclRegistry::add(NcclGroup* g) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.insert(g);
}

void NcclRegistry::remove(NcclGroup* g) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.erase(g);
}

std::vector<NcclGroup*> NcclRegistry::groups() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<NcclGroup*>(groups_.begin(), groups_.end());
}

void NcclRegistry::abort_all(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (NcclGroup* g : groups_) g->abort(why);
}

NcclGroup::NcclGroup(ncclComm_t comm, std::vector<int> members, int rank, std::shared_ptr<NcclRegistry> registry)
    : comm_(comm), members_(std::move(members)), rank_(rank), registry_(std::move(registry)) {
  if (registry_) registry_->add(this);
}

NcclGroup::~NcclGroup() {
  if (registry_) registry_->remove(this);
  if (!comm_) return;
  if (aborted_) return;
  ncclCommDestroy(comm_);
}

void NcclGroup::send(const void* data, int64_t bytes, int peer) {
  OASES_NCCL_CHECK(ncclSend(data, static_cast<size_t>(bytes), ncclUint8, peer, comm_, stream_));
}

void NcclGroup::recv(void* data, int64_t bytes, int peer) {
  OASES_NCCL_CHECK(ncclRecv(data, static_cast<size_t>(bytes), ncclUint8, peer, comm_, stream_));
}

void NcclGroup::begin_batch() {
  OASES_NCCL_CHECK(ncclGroupStart());
  ++batch_depth_;
}

void NcclGroup::end_batch() {
  --batch_depth_;
  OASES_NCCL_CHECK(ncclGroupEnd());
}

void NcclGroup::all_reduce(void* data, int64_t count, DType dt, ReduceOp op) {
  OASES_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), comm_, stream_));
}

void NcclGroup::all_gather(const void* in, void* out, int64_t bytes) {
  OASES_NCCL_CHECK(ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
}

void NcclGroup::reduce_scatter(const void* in, void* out, int64_t count, DType dt, ReduceOp op) {
  OASES_NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), comm_, stream_));
}

void NcclGroup::all_to_all(const void* in, void* out, int64_t bytes) {
  // chunk j of `in` to member j, chunk i of every member into `out`: paired send/recv in one group
  OASES_NCCL_CHECK(ncclGroupStart());
  for (int j = 0; j < size(); ++j) {
    OASES_NCCL_CHECK(ncclSend(static_cast<const char*>(in) + j * bytes, static_cast<size_t>(bytes), ncclUint8, j, comm_, stream_));
    OASES_NCCL_CHECK(ncclRecv(static_cast<char*>(out) + j * bytes, static_cast<size_t>(bytes), ncclUint8, j, comm_, stream_));
  }
  OASES_NCCL_CHECK(ncclGroupEnd());
}

void NcclGroup::shift(const void* in, void* out, int64_t bytes, int offset) {
  // one ring step: a paired send and receive in one NCCL group (device memory)
  int n = size(), to = ((rank_ + offset) % n + n) % n, from = ((rank_ - offset) % n + n) % n;
  OASES_NCCL_CHECK(ncclGroupStart());
  OASES_NCCL_CHECK(ncclSend(in, static_cast<size_t>(bytes), ncclUint8, to, comm_, stream_));
  OASES_NCCL_CHECK(ncclRecv(out, static_cast<size_t>(bytes), ncclUint8, from, comm_, stream_));
  OASES_NCCL_CHECK(ncclGroupEnd());
}

void NcclGroup::broadcast(void* data, int64_t bytes, int root) {
  OASES_NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_));
}

void NcclGroup::barrier() {
  float* one = nullptr;
  OASES_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_));
  OASES_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), stream_));
  all_reduce(one, 1, DType::kF32, ReduceOp::kSum);
  OASES_CUDA_CHECK(cudaFreeAsync(one, stream_));
  cudaEvent_t ev;
  OASES_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  OASES_CUDA_CHECK(cudaEventRecord(ev, stream_));
  try {
    wait_with_watchdog(ev, {this}, timeout_s_, "NCCL barrier of " + describe());
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  cudaEventDestroy(ev);
}

void NcclGroup::check_async() {
  if (aborted_) throw OasesError(fmt::format("NCCL {} was aborted", describe()));
  ncclResult_t st = ncclSuccess;
  OASES_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
  if (st != ncclSuccess && st != ncclInProgress) {
    std::string msg = fmt::format("NCCL {} failed asynchronously: {} (a peer may have failed)", describe(), ncclGetErrorString(st));
    abort(msg);
    throw OasesError(msg);
  }
}

void NcclGroup::abort(const std::string&) {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

void wait_with_watchdog(cudaEvent_t done, const std::vector<NcclGroup*>& groups, double timeout_s, const std::string& what) {
  auto t0 = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) OASES_CUDA_CHECK(e);
    for (NcclGroup* g : groups) g->check_async();
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!groups.empty() && waited > timeout_s) {
      std::string msg =
          fmt::format("{}: nothing completed for {:.0f} s; a peer may have failed or hung. NCCL communicators aborted", what, waited);
      for (NcclGroup* g : groups) g->abort(msg);
      throw OasesError(msg);
    }
    // spin briefly (the usual case: the step is about to finish), then back off
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spin > 20000 ? 1000 : 50));
  }
}


ncclComm_t nccl_comm_over(CommGroup& host) {
  ncclUniqueId id{};
  if (host.rank() == 0) OASES_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(&id, static_cast<int64_t>(sizeof(id)), 0);  // over MPI or local threads, with their timeout
  ncclComm_t comm = nullptr;
  OASES_NCCL_CHECK(ncclCommInitRank(&comm, host.size(), id, host.rank()));
  return comm;
}

// An event recorded on the stream after an NCCL transfer (at end_batch() for one issued in a batch:
// NCCL enqueues a group's work only when the group ends).
struct NcclEvent {
  cudaEvent_t event = nullptr;
  bool recorded = false;
  ~NcclEvent() {
    if (event) cudaEventDestroy(event);
  }
};

namespace {

class NcclRequest : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<NcclEvent> r, NcclGroup* g, std::string what) : r_(std::move(r)), g_(g), what_(std::move(what)) {}
  void wait() override {
    if (done_) return;
    if (!r_->recorded) throw OasesError(fmt::format("{}: waited for inside its batch (NCCL starts it at end_batch)", what_));
    wait_with_watchdog(r_->event, {g_}, g_->timeout(), what_);
    done_ = true;
  }
  // enqueued on the stream it was issued on: later work there follows it without a host wait
  void wait_ordered() override {
    if (!r_->recorded) throw OasesError(fmt::format("{}: waited for inside its batch (NCCL starts it at end_batch)", what_));
    g_->check_async();
  }
  bool test() override {
    if (done_ || !r_->recorded) return done_;
    g_->check_async();
    cudaError_t e = cudaEventQuery(r_->event);
    if (e == cudaErrorNotReady) return false;
    OASES_CUDA_CHECK(e);
    return done_ = true;
  }

 private:
  std::shared_ptr<NcclEvent> r_;
  NcclGroup* g_;
  std::string what_;
  bool done_ = false;
};

}  // namespace

// A rank's transfer to itself outside a batch: a device copy, enqueued by whichever of the send and
// the receive comes second.
struct NcclCommunicator::SelfTransfer {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
  NcclEvent done;
};

namespace {

class SelfRequest : public CommRequest {
 public:
  // `unmatched`: the error of a wait before the other side was issued
  SelfRequest(std::shared_ptr<void> keep, NcclEvent* done, std::string unmatched)
      : keep_(std::move(keep)), done_(done), unmatched_(std::move(unmatched)) {}
  void wait() override {
    if (!done_->recorded) throw OasesError(unmatched_);
    OASES_CUDA_CHECK(cudaEventSynchronize(done_->event));
  }
  // the copy was enqueued on the communicator's stream when the second side was issued
  void wait_ordered() override {
    if (!done_->recorded) throw OasesError(unmatched_);
  }
  bool test() override {
    if (!done_->recorded) return false;
    cudaError_t e = cudaEventQuery(done_->event);
    if (e == cudaErrorNotReady) return false;
    OASES_CUDA_CHECK(e);
    return true;
  }

 private:
  std::shared_ptr<void> keep_;
  NcclEvent* done_;
  std::string unmatched_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator* host) : host_(host) {
  timeout_s = host->timeout_s;
}

NcclCommunicator::~NcclCommunicator() {
  drop_channel_groups();
  pairs_.clear();
}

std::unique_ptr<NcclGroup> NcclCommunicator::adopt(ncclComm_t comm, std::vector<int> members, int rank) {
  auto g = std::make_unique<NcclGroup>(comm, std::move(members), rank, registry_);
  g->set_timeout(timeout_s);
  g->set_stream(stream_);
  return g;
}

std::unique_ptr<CommGroup> NcclCommunicator::make_group(const std::vector<int>& ranks) {
  std::unique_ptr<CommGroup> hg = host_->make_group(ranks);
  return adopt(nccl_comm_over(*hg), ranks, hg->rank());
}

std::unique_ptr<CommGroup> NcclCommunicator::make_channel_group(const std::vector<int>& ranks, int tag) {
  std::unique_ptr<CommGroup> hg = host_->make_member_group(ranks, tag);
  return adopt(nccl_comm_over(*hg), ranks, hg->rank());
}

void NcclCommunicator::abort(const std::string& why) {
  registry_->abort_all(why);
  host_->abort(why);
}

NcclGroup& NcclCommunicator::pair(int peer, int tag) {
  if (peer < 0 || peer >= size()) throw OasesError(fmt::format("NCCL transfer with rank {}: the world has ranks 0 … {}", peer, size() - 1));
  if (tag < 0 || tag > kMaxChannelTag) throw OasesError(fmt::format("NCCL transfer tag {} is outside 0 … {}", tag, kMaxChannelTag));
  auto& g = pairs_[{peer, tag}];
  if (g) return *g;
  ncclUniqueId id{};
  ncclComm_t comm = nullptr;
  if (peer == rank()) {
    OASES_NCCL_CHECK(ncclGetUniqueId(&id));
    OASES_NCCL_CHECK(ncclCommInitRank(&comm, 1, id, 0));
    g = adopt(comm, {peer}, 0);
    return *g;
  }
  // the lower rank makes the id and sends it over the host's point to point (this tag's)
  const int lo = std::min(peer, rank()), hi = std::max(peer, rank());
  if (rank() == lo) {
    OASES_NCCL_CHECK(ncclGetUniqueId(&id));
    host_->isend(&id, static_cast<int64_t>(sizeof(id)), hi, tag)->wait();
  } else {
    host_->irecv(&id, static_cast<int64_t>(sizeof(id)), lo, tag)->wait();
  }
  OASES_NCCL_CHECK(ncclCommInitRank(&comm, 2, id, rank() == lo ? 0 : 1));
  g = adopt(comm, {lo, hi}, rank() == lo ? 0 : 1);
  return *g;
}

void NcclCommunicator::begin_batch() {
  if (batch_depth_++ == 0) OASES_NCCL_CHECK(ncclGroupStart());
}

void NcclCommunicator::end_batch() {
  if (batch_depth_ <= 0) throw OasesError("NCCL: end_batch without begin_batch");
  if (--batch_depth_ > 0) return;
  OASES_NCCL_CHECK(ncclGroupEnd());
  for (auto& r : batched_) {
    OASES_CUDA_CHECK(cudaEventRecord(r->event, stream_));
    r->recorded = true;
  }
  batched_.clear();
}

std::unique_ptr<CommRequest> NcclCommunicator::self_transfer(const void* send, void* recv, int64_t bytes, int tag) {
  auto& mine = send ? self_sends_[tag] : self_recvs_[tag];
  auto& theirs = send ? self_recvs_[tag] : self_sends_[tag];
  std::shared_ptr<SelfTransfer> t;
  if (!theirs.empty()) {
    t = theirs.front();
    theirs.erase(theirs.begin());
    if (t->bytes != bytes)
      throw OasesError(fmt::format("rank {}: a transfer to itself on tag {} sends {} bytes into a receive of {}", rank(), tag,
                                   send ? bytes : t->bytes, send ? t->bytes : bytes));
    if (send) t->src = send;
    if (recv) t->dst = recv;
    OASES_CUDA_CHECK(cudaEventCreateWithFlags(&t->done.event, cudaEventDisableTiming));
    if (bytes) OASES_CUDA_CHECK(cudaMemcpyAsync(t->dst, t->src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
    OASES_CUDA_CHECK(cudaEventRecord(t->done.event, stream_));
    t->done.recorded = true;
  } else {
    t = std::make_shared<SelfTransfer>();
    t->src = send;
    t->dst = recv;
    t->bytes = bytes;
    mine.push_back(t);
  }
  NcclEvent* done = &t->done;
  return std::make_unique<SelfRequest>(t, done,
                                       fmt::format("rank {}: {} to itself on tag {}: waited for before its matching {} was issued (it could "
                                                   "never complete)",
                                                   rank(), send ? "send" : "receive", tag, send ? "receive" : "send"));
}

namespace {
// `rank`'s index in a pair's communicator (its lower rank first; a rank alone with itself: 0)
int member_index(const NcclGroup& g, int rank) {
  return g.size() == 1 || rank == g.members()[0] ? 0 : 1;
}
}  // namespace

std::unique_ptr<CommRequest> NcclCommunicator::isend(const void* data, int64_t bytes, int to, int tag) {
  if (to == rank() && batch_depth_ == 0) return self_transfer(data, nullptr, bytes, tag);
  NcclGroup& g = pair(to, tag);
  g.set_stream(stream_);
  g.send(data, bytes, member_index(g, to));
  return request(g, fmt::format("NCCL send of {} bytes from rank {} to rank {} (tag {})", bytes, rank(), to, tag));
}

std::unique_ptr<CommRequest> NcclCommunicator::irecv(void* data, int64_t bytes, int from, int tag) {
  if (from == rank() && batch_depth_ == 0) return self_transfer(nullptr, data, bytes, tag);
  NcclGroup& g = pair(from, tag);
  g.set_stream(stream_);
  g.recv(data, bytes, member_index(g, from));
  return request(g, fmt::format("NCCL receive of {} bytes by rank {} from rank {} (tag {})", bytes, rank(), from, tag));
}

std::unique_ptr<CommRequest> NcclCommunicator::request(NcclGroup& g, std::string what) {
  auto r = std::make_shared<NcclEvent>();
  OASES_CUDA_CHECK(cudaEventCreateWithFlags(&r->event, cudaEventDisableTiming));
  if (batch_depth_ > 0) {
    batched_.push_back(r);
  } else {
    OASES_CUDA_CHECK(cudaEventRecord(r->event, stream_));
    r->recorded = true;
  }
  return std::make_unique<NcclRequest>(r, &g, std::move(what));
}

}  // namespace cuda

Expected<std::vector<std::unique_ptr<CommGroup>>> make_nccl_groups(const std::vector<CommGroup*>& host_groups, double timeout_s) {
  std::vector<std::unique_ptr<CommGroup>> out;
  try {
    for (CommGroup* hg : host_groups) {
      auto ng = std::make_unique<cuda::NcclGroup>(cuda::nccl_comm_over(*hg), hg->members(), hg->rank());
      ng->set_timeout(timeout_s);
      out.push_back(std::move(ng));
    }
  } catch (const std::exception& e) {
    return Status::error(fmt::format("NCCL set-up: {}", e.what()));
  }
  return out;
}

}  // namespace oases
