// The CUDA executor backend (executor/cuda/cuda_runner.h says how memory, uploads and a run work).
#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "executor/cuda/cuda_runner.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/version.h"

namespace oases {

namespace cuda {

Elem elem(DType t) {
  switch (t) {
    case DType::kF32: return Elem::kF32;
    case DType::kF64: return Elem::kF64;
    case DType::kF16: return Elem::kF16;
    case DType::kBF16: return Elem::kBF16;
    case DType::kI64: return Elem::kI64;
    case DType::kI32: return Elem::kI32;
    case DType::kI16: return Elem::kI16;
    case DType::kI8: return Elem::kI8;
    case DType::kU8: return Elem::kU8;
    case DType::kU16: return Elem::kU16;
    case DType::kU32: return Elem::kU32;
    case DType::kU64: return Elem::kU64;
    case DType::kBool: return Elem::kBool;
    default: throw OasesError(fmt::format("[cuda] type {} has no kernels", dtype_name(t)));
  }
}

void* CudaContext::scratch(size_t bytes) {
  void* p = nullptr;
  OASES_CUDA_CHECK(cudaMallocAsync(&p, std::max<size_t>(bytes, 16), stream));
  scratch_.push_back(p);
  return p;
}

void CudaContext::release() {
  for (void* p : scratch_) cudaFreeAsync(p, stream);
  scratch_.clear();
}

const CudaKernelRegistry& CudaKernelRegistry::global() {
  static const CudaKernelRegistry reg = [] {
    CudaKernelRegistry r;
    register_cuda_elementwise(r);
    register_cuda_layout(r);
    register_cuda_nn(r);
    register_cuda_collectives(r);
    return r;
  }();
  return reg;
}

void CudaKernelRegistry::add(const std::string& domain, const std::string& op, CudaKernelFn fn) {
  fns_[{domain, op}] = std::move(fn);
}

const CudaKernelFn* CudaKernelRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = fns_.find({domain == "ai.onnx" ? std::string() : domain, op});
  return it == fns_.end() ? nullptr : &it->second;
}

std::vector<std::string> CudaKernelRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : fns_) out.push_back(k.first.empty() ? k.second : k.first + "." + k.second);
  return out;
}

namespace {

#define OASES_CUDNN_CHECK(call)                                                                                                   \
  do {                                                                                                                            \
    cudnnStatus_t oases_s_ = (call);                                                                                              \
    if (oases_s_ != CUDNN_STATUS_SUCCESS)                                                                                         \
      ::oases::cuda::throw_error("cuDNN", #call, static_cast<long>(oases_s_), cudnnGetErrorString(oases_s_), __FILE__, __LINE__); \
  } while (0)

constexpr unsigned long long kNoFault = ULLONG_MAX;
constexpr int kFaultShift = 40;

}  // namespace

CudaRunner::~CudaRunner() {
  for (cudaStream_t s : {streams_[0], streams_[1], streams_[2], copy_stream_}) {
    if (s) cudaStreamSynchronize(s);
  }
  if (registered_host_) cudaHostUnregister(registered_host_);
  blas_.reset();
  if (cudnn_) cudnnDestroy(cudnn_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaEvent_t e : timing_) cudaEventDestroy(e);
  for (cudaEvent_t e : {fork_, comm_end_, channel_end_, done_, origin_, sent_[0], sent_[1], consumed_[0], consumed_[1]}) {
    if (e) cudaEventDestroy(e);
  }
  for (void* p : {arena_, consts_, inputs_, staged_[0], staged_[1], static_cast<void*>(fault_)}) {
    if (p) cudaFree(p);
  }
  for (void* p : {pinned_[0], pinned_[1], static_cast<void*>(fault_host_)}) {
    if (p) cudaFreeHost(p);
  }
  for (cudaStream_t s : {streams_[0], streams_[1], streams_[2], copy_stream_}) {
    if (s) cudaStreamDestroy(s);
  }
}

void* CudaRunner::device_ptr(ValueId v) const {
  const ValueSlot& s = prog_.memory.slots[static_cast<size_t>(v)];
  switch (s.kind) {
    case ValueSlot::Kind::kArena: return static_cast<char*>(arena_) + s.offset;
    case ValueSlot::Kind::kConstant:
      return const_off_[static_cast<size_t>(v)] >= 0 ? static_cast<char*>(consts_) + const_off_[static_cast<size_t>(v)] : nullptr;
    case ValueSlot::Kind::kInput:
      return input_off_[static_cast<size_t>(v)] >= 0 ? static_cast<char*>(inputs_) + input_off_[static_cast<size_t>(v)] : nullptr;
    case ValueSlot::Kind::kView: return device_ptr(s.root);
    default: return nullptr;
  }
}

void* CudaRunner::address(ValueId v) const {
  if (v == kNoId || static_cast<size_t>(v) >= prog_.memory.slots.size()) return nullptr;
  return device_ptr(v);
}

Status CudaRunner::init() {
  const Graph& g = prog_.graph;
  const CudaKernelRegistry& reg = CudaKernelRegistry::global();
  // every instruction's CUDA kernel, before anything is allocated
  for (const Instr& in : prog_.instrs) {
    const Node& n = g.node(in.node);
    const CudaKernelFn* fn = reg.find(n.domain, n.op_type);
    if (!fn) {
      std::string key = n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "." + n.op_type;
      auto it = cuda_exempt_ops().find(key);
      return error("{}: no CUDA kernel for this op{}", n.describe(), it != cuda_exempt_ops().end() ? " (" + it->second + ")" : "");
    }
    fns_.push_back(fn);
  }
  try {
    OASES_CUDA_CHECK(cudaGetDevice(&device_));
    for (cudaStream_t& s : streams_) OASES_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OASES_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    plan_ = build_stream_plan(prog_);
    events_.resize(static_cast<size_t>(plan_.num_events));
    for (cudaEvent_t& e : events_) OASES_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t* e : {&fork_, &comm_end_, &channel_end_, &done_, &sent_[0], &sent_[1], &consumed_[0], &consumed_[1]})
      OASES_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    // keep freed scratch in the pool between steps instead of returning it to the driver
    cudaMemPool_t pool;
    OASES_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t threshold = UINT64_MAX;
    OASES_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    OASES_CUDA_CHECK(cudaMalloc(&arena_, std::max<size_t>(256, prog_.memory.arena_bytes)));
    auto place = [&](std::vector<int64_t>& off, bool constants) {
      off.assign(g.num_values(), -1);
      size_t total = 0;
      for (size_t v = 0; v < prog_.memory.slots.size(); ++v) {
        ValueSlot::Kind k = prog_.memory.slots[v].kind;
        if (k != (constants ? ValueSlot::Kind::kConstant : ValueSlot::Kind::kInput)) continue;
        size_t bytes = g.value(static_cast<ValueId>(v)).nbytes();
        off[v] = static_cast<int64_t>(total);
        total += (bytes + 255) / 256 * 256;
      }
      return std::max<size_t>(total, 256);
    };
    consts_bytes_ = place(const_off_, true);
    inputs_bytes_ = place(input_off_, false);
    OASES_CUDA_CHECK(cudaMalloc(&consts_, consts_bytes_));
    OASES_CUDA_CHECK(cudaMalloc(&inputs_, inputs_bytes_));
    for (int i = 0; i < 2; ++i) {
      OASES_CUDA_CHECK(cudaMallocHost(&pinned_[i], inputs_bytes_));
      OASES_CUDA_CHECK(cudaMalloc(&staged_[i], inputs_bytes_));
      // the first use of each buffer waits for nothing
      OASES_CUDA_CHECK(cudaEventRecord(sent_[i], copy_stream_));
      OASES_CUDA_CHECK(cudaEventRecord(consumed_[i], streams_[0]));
    }
    OASES_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&fault_), sizeof(unsigned long long)));
    OASES_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&fault_host_), sizeof(unsigned long long)));
    blas_ = std::make_unique<BlasHandles>(streams_[0], size_t(32) << 20, std::getenv("OASES_CUDA_TF32") != nullptr);
    OASES_CUDNN_CHECK(cudnnCreate(&cudnn_));
    OASES_CUDNN_CHECK(cudnnSetStream(cudnn_, streams_[0]));
  } catch (const std::exception& e) {
    return Status::error(e.what());
  }
  // operands bound once: device addresses never move
  ctx_.resize(prog_.instrs.size());
  for (size_t i = 0; i < prog_.instrs.size(); ++i) {
    const Node& n = g.node(prog_.instrs[i].node);
    KernelContext& c = ctx_[i];
    c.graph = &g;
    c.node = &n;
    c.state = state_;
    c.groups = &opts_.groups;
    c.comm = opts_.device_comm;
    if (auto r = prog_.reshards.find(n.name); r != prog_.reshards.end()) c.reshard = r->second.get();
    for (ValueId v : n.inputs) {
      TensorView tv;
      if (v != kNoId) tv = TensorView{g.value(v).dtype, g.value(v).shape, device_ptr(v)};
      c.in.push_back(tv);
    }
    for (ValueId v : n.outputs) {
      TensorView tv;
      if (v != kNoId) tv = TensorView{g.value(v).dtype, g.value(v).shape, device_ptr(v)};
      c.out.push_back(tv);
    }
  }
  for (CommGroup* grp : opts_.groups) {
    if (auto* ng = dynamic_cast<NcclGroup*>(grp)) nccl_.push_back(ng);
  }
  std::set<ValueId> back(opts_.keep.begin(), opts_.keep.end());
  for (ValueId v : g.outputs()) back.insert(v);
  for (ValueId v : back) {
    const ValueSlot& s = prog_.memory.slots[static_cast<size_t>(v)];
    const ValueSlot& root = s.kind == ValueSlot::Kind::kView ? prog_.memory.slots[static_cast<size_t>(s.root)] : s;
    if (root.kind == ValueSlot::Kind::kArena && root.bytes) copy_back_.push_back(s.kind == ValueSlot::Kind::kView ? s.root : v);
  }
  return Status::ok();
}

void CudaRunner::upload_constants() {
  const Graph& g = prog_.graph;
  for (size_t v = 0; v < const_off_.size(); ++v) {
    if (const_off_[v] < 0) continue;
    const Tensor& t = g.value(static_cast<ValueId>(v)).constant;
    if (t.nbytes())
      OASES_CUDA_CHECK(
          cudaMemcpyAsync(static_cast<char*>(consts_) + const_off_[v], t.raw(), t.nbytes(), cudaMemcpyHostToDevice, streams_[0]));
  }
  consts_dirty_ = false;
}

void CudaRunner::stage_inputs(const std::vector<const void*>& inputs) {
  const Graph& g = prog_.graph;
  OASES_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t cs = streams_[0];
  if (consts_dirty_) upload_constants();
  if (!fault_armed_) {
    OASES_CUDA_CHECK(cudaMemsetAsync(fault_, 0xff, sizeof(unsigned long long), cs));
    fault_armed_ = true;
  }
  const int b = next_stage_;
  next_stage_ ^= 1;
  // the buffer's previous upload must have left the host buffer before it is overwritten
  OASES_CUDA_CHECK(cudaEventSynchronize(sent_[b]));
  size_t end = 0;
  for (size_t v = 0; v < input_off_.size(); ++v) {
    if (input_off_[v] < 0 || v >= inputs.size() || !inputs[v]) continue;
    size_t bytes = g.value(static_cast<ValueId>(v)).nbytes();
    std::memcpy(static_cast<char*>(pinned_[b]) + input_off_[v], inputs[v], bytes);
    end = std::max(end, static_cast<size_t>(input_off_[v]) + bytes);
  }
  if (end == 0) return;
  // the copy stream sends the buffer up once the compute stream has moved its last contents
  OASES_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, consumed_[b], 0));
  OASES_CUDA_CHECK(cudaMemcpyAsync(staged_[b], pinned_[b], end, cudaMemcpyHostToDevice, copy_stream_));
  OASES_CUDA_CHECK(cudaEventRecord(sent_[b], copy_stream_));
  OASES_CUDA_CHECK(cudaStreamWaitEvent(cs, sent_[b], 0));
  OASES_CUDA_CHECK(cudaMemcpyAsync(inputs_, staged_[b], end, cudaMemcpyDeviceToDevice, cs));
  OASES_CUDA_CHECK(cudaEventRecord(consumed_[b], cs));
}

void CudaRunner::enqueue_program(bool timed) {
  const Graph& g = prog_.graph;
  OASES_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t cs = streams_[0];
  if (timed && timing_.empty()) {
    timing_.resize(2 * prog_.instrs.size());
    for (cudaEvent_t& e : timing_) OASES_CUDA_CHECK(cudaEventCreate(&e));
    OASES_CUDA_CHECK(cudaEventCreate(&origin_));
  }
  if (timed) {
    stream_of_.assign(prog_.instrs.size(), -1);
    OASES_CUDA_CHECK(cudaEventRecord(origin_, cs));
  }
  // the communication and channel streams start after everything before on the compute stream
  // (and join a graph capture begun there)
  OASES_CUDA_CHECK(cudaEventRecord(fork_, cs));
  OASES_CUDA_CHECK(cudaStreamWaitEvent(streams_[1], fork_, 0));
  if (plan_.launches[2]) OASES_CUDA_CHECK(cudaStreamWaitEvent(streams_[2], fork_, 0));
  for (const StreamOp& op : plan_.ops) {
    cudaStream_t s = streams_[op.stream];
    if (op.kind == StreamOp::Kind::kRecord) {
      OASES_CUDA_CHECK(cudaEventRecord(events_[static_cast<size_t>(op.event)], s));
      continue;
    }
    if (op.kind == StreamOp::Kind::kWait) {
      OASES_CUDA_CHECK(cudaStreamWaitEvent(s, events_[static_cast<size_t>(op.event)], 0));
      continue;
    }
    CudaContext c{ctx_[op.instr],
                  s,
                  op.stream == 0 ? blas_.get() : nullptr,
                  op.stream == 0 ? cudnn_ : nullptr,
                  Fault{fault_, static_cast<unsigned long long>(op.instr) << kFaultShift},
                  {}};
    if (timed) {
      OASES_CUDA_CHECK(cudaEventRecord(timing_[2 * op.instr], s));
      stream_of_[op.instr] = op.stream;
    }
    try {
      (*fns_[op.instr])(c);
      if (timed) OASES_CUDA_CHECK(cudaEventRecord(timing_[2 * op.instr + 1], s));
    } catch (const OasesError&) {
      c.release();
      throw;
    } catch (const std::exception& e) {
      c.release();
      throw OasesError(fmt::format("{}: {}", g.node(prog_.instrs[op.instr].node).describe(), e.what()));
    }
    c.release();
  }
  // the compute stream also waits for anything the communication and channel streams still have
  // queued
  OASES_CUDA_CHECK(cudaEventRecord(comm_end_, streams_[1]));
  OASES_CUDA_CHECK(cudaStreamWaitEvent(cs, comm_end_, 0));
  if (plan_.launches[2]) {
    OASES_CUDA_CHECK(cudaEventRecord(channel_end_, streams_[2]));
    OASES_CUDA_CHECK(cudaStreamWaitEvent(cs, channel_end_, 0));
  }
}

void CudaRunner::check_fault() {
  if (!fault_armed_) return;
  fault_armed_ = false;
  unsigned long long f = *fault_host_;
  if (f == kNoFault) return;
  const Graph& g = prog_.graph;
  size_t instr = static_cast<size_t>(f >> kFaultShift);
  unsigned long long pos = f & ((1ull << kFaultShift) - 1);
  std::string who = instr < prog_.instrs.size() ? g.node(prog_.instrs[instr].node).describe() : "a kernel";
  throw OasesError(fmt::format("{}: index or label at position {} is outside its range (found on the GPU)", who, pos));
}

void CudaRunner::synchronize(const char* what) {
  OASES_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t cs = streams_[0];
  if (fault_armed_) OASES_CUDA_CHECK(cudaMemcpyAsync(fault_host_, fault_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, cs));
  OASES_CUDA_CHECK(cudaEventRecord(done_, cs));
  // the mesh's NCCL groups and the device communicator's pair and channel communicators (the
  // Reshard kernels' transfers)
  std::vector<NcclGroup*> watched = nccl_;
  if (auto* nc = dynamic_cast<NcclCommunicator*>(opts_.device_comm)) {
    for (NcclGroup* g : nc->groups()) watched.push_back(g);
  }
  double timeout = kDefaultCommTimeoutS;  // no NCCL group: the watchdog has nothing to abort and never fires
  if (!watched.empty()) {
    timeout = 0;
    for (NcclGroup* ng : watched) timeout = std::max(timeout, ng->timeout());
  }
  wait_with_watchdog(done_, watched, timeout, what);
  check_fault();
}

void CudaRunner::read_timing(std::vector<double>* node_ms) {
  node_ms->assign(prog_.instrs.size(), 0.0);
  if (timing_.empty()) return;
  for (size_t i = 0; i < prog_.instrs.size(); ++i) {
    if (prog_.instrs[i].kind == Instr::Kind::kCommWait) continue;  // no launch: the collective's start holds its time
    float ms = 0;
    OASES_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_[2 * i], timing_[2 * i + 1]));
    (*node_ms)[i] = ms;
  }
}

void CudaRunner::read_spans(std::vector<DeviceSpan>* spans) {
  spans->clear();
  if (timing_.empty()) return;
  for (size_t i = 0; i < prog_.instrs.size(); ++i) {
    if (i >= stream_of_.size() || stream_of_[i] < 0) continue;
    float from = 0, ms = 0;
    OASES_CUDA_CHECK(cudaEventElapsedTime(&from, origin_, timing_[2 * i]));
    OASES_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_[2 * i], timing_[2 * i + 1]));
    spans->push_back(DeviceSpan{i, stream_of_[i], 1000.0 * from, 1000.0 * ms});
  }
}

void CudaRunner::run(const std::vector<const void*>& inputs, void* host_arena, std::vector<double>* node_ms) {
  cudaStream_t cs = streams_[0];
  if (!registered_host_ && host_arena && prog_.memory.arena_bytes) {
    // page-locked, so the copies back are asynchronous and the only wait is the watched one below
    if (cudaHostRegister(host_arena, prog_.memory.arena_bytes, cudaHostRegisterDefault) == cudaSuccess) {
      registered_host_ = host_arena;
    } else {
      cudaGetLastError();
    }
  }
  stage_inputs(inputs);
  enqueue_program(node_ms != nullptr);
  for (ValueId v : copy_back_) {
    const ValueSlot& s = prog_.memory.slots[static_cast<size_t>(v)];
    OASES_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(host_arena) + s.offset, static_cast<char*>(arena_) + s.offset, s.bytes,
                                     cudaMemcpyDeviceToHost, cs));
  }
  synchronize("CUDA step");
  if (node_ms) read_timing(node_ms);
}

void CudaRunner::copy_to_host(ValueId v, void* dst) {
  void* src = address(v);
  if (!src) throw OasesError(fmt::format("value '{}' has no device copy", prog_.graph.value(v).name));
  OASES_CUDA_CHECK(cudaSetDevice(device_));
  OASES_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));
  OASES_CUDA_CHECK(cudaMemcpy(dst, src, prog_.graph.value(v).nbytes(), cudaMemcpyDeviceToHost));
}

void CudaRunner::copy_from_host(ValueId v, const void* src) {
  void* dst = address(v);
  if (!dst) throw OasesError(fmt::format("value '{}' has no device copy", prog_.graph.value(v).name));
  OASES_CUDA_CHECK(cudaSetDevice(device_));
  OASES_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));
  OASES_CUDA_CHECK(cudaMemcpy(dst, src, prog_.graph.value(v).nbytes(), cudaMemcpyHostToDevice));
}

size_t CudaRunner::peak_device_bytes() const {
  size_t total = std::max<size_t>(256, prog_.memory.arena_bytes) + consts_bytes_ + 3 * inputs_bytes_;
  if (blas_) total += blas_->workspace_bytes();
  cudaMemPool_t pool;
  uint64_t high = 0;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess && cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) == cudaSuccess)
    total += high;
  uint64_t graph_high = 0;
  if (cudaDeviceGetGraphMemAttribute(device_, cudaGraphMemAttrUsedMemHigh, &graph_high) == cudaSuccess) total += graph_high;
  cudaGetLastError();
  return total;
}

}  // namespace cuda

Expected<std::unique_ptr<DeviceRunner>> make_cuda_runner(const Program& prog, const ExecOptions& opts, RunState* state) {
  auto r = std::make_unique<cuda::CudaRunner>(prog, opts, state);
  OASES_RETURN_IF_ERROR(r->init());
  return std::unique_ptr<DeviceRunner>(std::move(r));
}

bool cuda_built() {
  return true;
}

Status cuda_usable() {
  cuda::DeviceInfo d = cuda::device_info();
  if (d.count > 0) return Status::ok();
  return error("no CUDA device found{}", d.error.empty() ? "" : " (" + d.error + ")");
}

Status cuda_select_device(int local_rank) {
  cuda::DeviceInfo d = cuda::device_info();
  if (d.count <= 0) return error("no CUDA device found{}", d.error.empty() ? "" : " (" + d.error + ")");
  cudaError_t e = cudaSetDevice(local_rank % d.count);
  if (e != cudaSuccess) return error("cudaSetDevice({}) failed: {}", local_rank % d.count, cudaGetErrorString(e));
  return Status::ok();
}

std::string cuda_report_json() {
  nlohmann::json j;
  j["built"] = true;
  j["libraries"] = nlohmann::json::array();
  for (const cuda::LibraryVersion& l : cuda::library_versions()) {
    j["libraries"].push_back(
        {{"library", l.library}, {"read", l.read}, {"version", l.version}, {"compiled", l.compiled}, {"note", l.note}});
  }
  cuda::DeviceInfo d = cuda::device_info();
  j["devices"] = {{"count", d.count}, {"error", d.error}, {"names", d.names}, {"sm", d.sm}, {"memory_gib", d.memory_gib}};
  return j.dump(2);
}

std::vector<std::string> cuda_kernel_ops() {
  return cuda::CudaKernelRegistry::global().ops();
}

}  // namespace oases
