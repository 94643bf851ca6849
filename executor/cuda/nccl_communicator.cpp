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

NcclGroup::NcclGroup(ncclComm_t comm, std::vector<int> members, int rank) : comm_(comm), members_(std::move(members)), rank_(rank) {}

NcclGroup::~NcclGroup() {
  if (!comm_) return;
  if (aborted_) return;
  ncclCommDestroy(comm_);
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

}  // namespace cuda

Expected<std::vector<std::unique_ptr<CommGroup>>> make_nccl_groups(Communicator* host, const Mesh& mesh, int rank, double timeout_s) {
  std::vector<std::unique_ptr<CommGroup>> out;
  if (!host) return out;
  try {
    for (int a = 0; a < mesh.num_axes(); ++a) {
      std::vector<int64_t> g = mesh.group(rank, a);
      std::vector<int> members(g.begin(), g.end());
      std::unique_ptr<CommGroup> hg = host->make_group(members);
      ncclUniqueId id{};
      if (hg->rank() == 0) OASES_NCCL_CHECK(ncclGetUniqueId(&id));
      hg->broadcast(&id, static_cast<int64_t>(sizeof(id)), 0);  // over MPI or local threads, with their timeout
      ncclComm_t comm = nullptr;
      OASES_NCCL_CHECK(ncclCommInitRank(&comm, hg->size(), id, hg->rank()));
      auto ng = std::make_unique<cuda::NcclGroup>(comm, members, hg->rank());
      ng->set_timeout(timeout_s);
      out.push_back(std::move(ng));
    }
  } catch (const std::exception& e) {
    return Status::error(fmt::format("NCCL set-up: {}", e.what()));
  }
  return out;
}

}  // namespace oases
