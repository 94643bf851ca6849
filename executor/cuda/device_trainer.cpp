// Training state resident on the GPU (executor/device.h DeviceTrainer): the fp32 master weights
// are the program's constants on the device, the gradients its kept values; the moments, the
// gradient accumulators, the multi-tensor tables and the step's scalars are allocated here. A
// step is: per micro-batch the staged inputs, the program, the loss added on the device and (with
// several micro-batches) the gradients accumulated; then the scalars go up (one small copy from
// page-locked memory), the norm and the update run as three multi-tensor launches, the outcome
// (loss sum, norm, skipped) comes back in one small copy, and the host waits once.
//
// CUDA graphs: after one warm-up step (cuBLAS heuristics, cuDNN plans, the memory pool settle)
// each micro-batch variant (first / later, with or without accumulation) and the update are
// captured once and replayed. Staging and the scalar upload stay outside the graphs, so each step
// feeds its own inputs and learning rate. A program whose kernels take per-step host arguments
// (dropout keys) is not captured; a capture that fails turns graphs off for the run, said once.
#include <fmt/format.h>

#include "executor/cuda/cuda_runner.h"
#include "executor/cuda/device_trainer.h"
#include "executor/measure_cuda.h"
#include "executor/multi_tensor.h"
#include "kernels/cuda/optim.h"

namespace oases {

namespace cuda {

DeviceBuffers::~DeviceBuffers() {
  for (void* p : owned_) cudaFree(p);
}

void* DeviceBuffers::alloc_bytes(size_t bytes) {
  void* p = nullptr;
  OASES_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  owned_.push_back(p);
  bytes_ += bytes;
  OASES_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 16)));
  return p;
}

void* DeviceBuffers::put_bytes(const void* host, size_t bytes) {
  void* d = alloc_bytes(bytes);
  if (bytes) OASES_CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}

Expected<MultiTensorTables> multi_tensor_tables(DeviceBuffers& mem, const std::vector<float*>& param, const std::vector<const float*>& grad,
                                                const std::vector<float*>& m, const std::vector<float*>& v,
                                                const std::vector<int64_t>& numel, const std::vector<uint8_t>& decay, int64_t chunk) {
  OASES_ASSIGN_OR_RETURN(MultiTensorPlan plan, plan_multi_tensor(numel, chunk));
  MultiTensorTables tt;
  tt.param = mem.put(param);
  tt.grad = mem.put(grad);
  tt.m = mem.put(m);
  tt.v = mem.put(v);
  tt.numel = mem.put(numel);
  tt.decay = mem.put(decay);
  tt.block_tensor = mem.put(plan.block_tensor);
  tt.block_start = mem.put(plan.block_start);
  tt.first_block = mem.put(plan.first_block);
  tt.tensors = static_cast<int32_t>(numel.size());
  tt.blocks = static_cast<int32_t>(plan.block_tensor.size());
  tt.chunk = plan.chunk;
  // float4 paths: every tensor on 16 bytes (the accumulators are: 256-byte offsets in one
  // allocation) and blocks that start on multiples of 4 elements
  auto on16 = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool aligned = plan.chunk % 4 == 0;
  for (size_t i = 0; i < numel.size(); ++i) aligned = aligned && on16(param[i]) && on16(grad[i]) && on16(m[i]) && on16(v[i]);
  tt.aligned16 = aligned ? 1 : 0;
  return tt;
}

namespace {

// Why a program cannot be replayed from a captured graph ("" when it can).
std::string capture_blocker(const Graph& g, const std::vector<CommGroup*>& groups) {
  if (const char* e = std::getenv("OASES_CUDA_GRAPH"); e && std::string(e) == "0") return "OASES_CUDA_GRAPH=0";
  for (CommGroup* grp : groups) {
    // ranks sharing a device meet on the host at every collective and wait on each other's events:
    // nothing a captured graph could replay
    if (grp && !dynamic_cast<NcclGroup*>(grp)) return fmt::format("{} is not an NCCL group (ranks share a device)", grp->describe());
  }
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (op_has_trait(n, kTraitRandom)) return fmt::format("{} takes a per-step random key as a kernel argument", n.describe());
    // a Reshard's transfers meet their peers on the host where ranks share a device, and its first
    // run makes NCCL's pair and channel communicators; until replaying them is proven on GPUs, a
    // program with cross-mesh transfers runs its launches directly
    if (n.domain == kOasesDomain && n.op_type == "Reshard") return fmt::format("{} transfers between meshes (not captured yet)", n.describe());
  }
  return "";
}

class CudaTrainer : public DeviceTrainer {
 public:
  explicit CudaTrainer(CudaRunner& r) : run_(r) {}
  ~CudaTrainer() override;
  Status init(const Graph& g, const std::vector<ValueId>& params, const std::vector<ValueId>& grads, ValueId loss,
              const Optimizer& opt);

  void micro_batch(const std::vector<const void*>& inputs, int index, int count, bool timed) override;
  std::vector<double> sum_squares(double* loss_sum) override;
  Tensor gradient(size_t i) override;
  DeviceStepOutcome update(const DeviceStepPlan& plan, const double* host_norm) override;
  void download(const std::vector<Tensor*>& params, const std::vector<std::vector<Tensor*>>& moments) override {
    transfer(params, moments, true);
  }
  void upload(const std::vector<Tensor*>& params, const std::vector<std::vector<Tensor*>>& moments) override {
    transfer(params, moments, false);
  }
  size_t peak_device_bytes() const override { return run_.peak_device_bytes() + mem_.bytes(); }
  std::string notes() const override;

 private:
  CudaRunner& run_;
  std::vector<ValueId> params_, grads_;
  ValueId loss_ = kNoId;
  Elem loss_type_ = Elem::kF32;
  bool adamw_ = true;
  DeviceBuffers mem_;         // device allocations of this trainer
  float* moments_ = nullptr;  // every parameter's m (then v), in parameter order
  float* acc_ = nullptr;      // accumulators, made on the first step with several micro-batches
  std::vector<int64_t> offset_;  // element offset of parameter i in moments_ / acc_
  int64_t total_ = 0;
  MultiTensorTables tt_;
  float** acc_table_ = nullptr;  // device array the accumulators' addresses go into
  StepScalars* scalars_ = nullptr;
  StepScalars* scalars_host_ = nullptr;  // page-locked
  StepOutcome* outcome_ = nullptr;
  StepOutcome* outcome_host_ = nullptr;  // page-locked
  double* partials_ = nullptr;
  double* per_tensor_ = nullptr;
  cudaEvent_t t_start_ = nullptr, t_micro_ = nullptr, t_end_ = nullptr;
  int last_count_ = 1;
  // graphs: micro-batch variants [first][accumulate], the update [from accumulators]
  cudaGraphExec_t micro_graph_[2][2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  cudaGraphExec_t update_graph_[2] = {nullptr, nullptr};
  std::string blocker_;  // why graphs are off ("" while they may be used)
  int steps_ = 0;
  int captured_ = 0;
  int64_t replays_ = 0;

  void ensure_accumulators();
  void transfer(const std::vector<Tensor*>& params, const std::vector<std::vector<Tensor*>>& moments, bool to_host);
  // Runs `enqueue` through graph `exec` (captured on first use once warm), or directly.
  template <class F>
  void launch(cudaGraphExec_t& exec, bool may_capture, F&& enqueue);
  void graphs_off(const std::string& why);
};

CudaTrainer::~CudaTrainer() {
  cudaStreamSynchronize(run_.compute_stream());
  for (auto& row : micro_graph_) {
    for (cudaGraphExec_t e : row) {
      if (e) cudaGraphExecDestroy(e);
    }
  }
  for (cudaGraphExec_t e : update_graph_) {
    if (e) cudaGraphExecDestroy(e);
  }
  for (cudaEvent_t e : {t_start_, t_micro_, t_end_}) {
    if (e) cudaEventDestroy(e);
  }
  if (scalars_host_) cudaFreeHost(scalars_host_);
  if (outcome_host_) cudaFreeHost(outcome_host_);
}

Status CudaTrainer::init(const Graph& g, const std::vector<ValueId>& params, const std::vector<ValueId>& grads, ValueId loss,
                         const Optimizer& opt) {
  if (params.size() != grads.size()) return error("{} parameters but {} gradients", params.size(), grads.size());
  params_ = params;
  grads_ = grads;
  loss_ = loss;
  if (opt.size() != params.size()) return error("the optimizer holds {} parameters, the program {}", opt.size(), params.size());
  adamw_ = opt.config().kind == "adamw";
  std::vector<int64_t> numel;
  for (size_t i = 0; i < params.size(); ++i) {
    const Value& p = g.value(params[i]);
    const Value& gr = g.value(grads[i]);
    if (p.dtype != DType::kF32 || gr.dtype != DType::kF32)
      return error("parameter '{}' is {} with a {} gradient: the device optimizer takes float32 master weights and gradients", p.name,
                   dtype_name(p.dtype), dtype_name(gr.dtype));
    if (p.shape != gr.shape) return error("parameter '{}' {} has a gradient of shape {}", p.name, shape_str(p.shape), shape_str(gr.shape));
    if (!run_.address(params[i]) || !run_.address(grads[i]))
      return error("parameter '{}' or its gradient has no device copy", p.name);
    numel.push_back(shape_numel(p.shape));
    offset_.push_back(total_);
    total_ += (numel.back() + 63) / 64 * 64;  // 256-byte aligned tensors
  }
  if (loss != kNoId) {
    if (!run_.address(loss)) return error("the loss '{}' has no device copy", g.value(loss).name);
    loss_type_ = elem(g.value(loss).dtype);
  }
  try {
    OASES_CUDA_CHECK(cudaSetDevice(run_.device()));
    moments_ = mem_.alloc<float>(static_cast<size_t>(total_) * (adamw_ ? 2 : 1));
    std::vector<float*> p, m, v;
    std::vector<const float*> gr;
    std::vector<uint8_t> decay;
    for (size_t i = 0; i < params_.size(); ++i) {
      p.push_back(static_cast<float*>(run_.address(params_[i])));
      gr.push_back(static_cast<const float*>(run_.address(grads_[i])));
      m.push_back(moments_ + offset_[i]);
      v.push_back(adamw_ ? moments_ + total_ + offset_[i] : nullptr);
      decay.push_back(opt.decays(i) ? 1 : 0);
    }
    OASES_ASSIGN_OR_RETURN(tt_, multi_tensor_tables(mem_, p, gr, m, v, numel, decay, kChunk));
    acc_table_ = mem_.alloc<float*>(params_.size());
    scalars_ = mem_.alloc<StepScalars>(1);
    outcome_ = mem_.alloc<StepOutcome>(1);
    partials_ = mem_.alloc<double>(static_cast<size_t>(tt_.blocks));
    per_tensor_ = mem_.alloc<double>(params_.size());
    OASES_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&scalars_host_), sizeof(StepScalars)));
    OASES_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&outcome_host_), sizeof(StepOutcome)));
    for (cudaEvent_t* e : {&t_start_, &t_micro_, &t_end_}) OASES_CUDA_CHECK(cudaEventCreate(e));
  } catch (const std::exception& e) {
    return Status::error(e.what());
  }
  blocker_ = capture_blocker(run_.program().graph, run_.groups());
  return Status::ok();
}

void CudaTrainer::ensure_accumulators() {
  if (acc_) return;
  acc_ = mem_.alloc<float>(static_cast<size_t>(total_));
  std::vector<float*> a;
  for (size_t i = 0; i < params_.size(); ++i) a.push_back(acc_ + offset_[i]);
  OASES_CUDA_CHECK(cudaMemcpy(acc_table_, a.data(), a.size() * sizeof(float*), cudaMemcpyHostToDevice));
  tt_.acc = acc_table_;
}

std::string CudaTrainer::notes() const {
  if (!blocker_.empty()) return "CUDA graphs off: " + blocker_;
  if (captured_ == 0) return "CUDA graphs: the micro-batches and the update are captured after one warm-up step";
  return fmt::format("CUDA graphs: {} captured, {} launches of them", captured_, replays_);
}

void CudaTrainer::graphs_off(const std::string& why) {
  blocker_ = why;
  std::fprintf(stderr, "warning: CUDA graphs off: %s; the step's kernels are launched one by one\n", why.c_str());
}

template <class F>
void CudaTrainer::launch(cudaGraphExec_t& exec, bool may_capture, F&& enqueue) {
  cudaStream_t cs = run_.compute_stream();
  if (!may_capture || !blocker_.empty()) {  // timed launches (--profile) or graphs off
    enqueue();
    return;
  }
  if (exec) {
    OASES_CUDA_CHECK(cudaGraphLaunch(exec, cs));
    ++replays_;
    return;
  }
  if (steps_ < 1) {  // the warm-up step
    enqueue();
    return;
  }
  OASES_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  std::string failed;
  try {
    enqueue();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(cs, &graph);
  if (failed.empty() && end != cudaSuccess) failed = fmt::format("cudaStreamEndCapture: {}", cudaGetErrorString(end));
  if (failed.empty()) {
    cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    if (inst != cudaSuccess) {
      failed = fmt::format("cudaGraphInstantiate: {}", cudaGetErrorString(inst));
      exec = nullptr;
    }
  }
  if (graph) cudaGraphDestroy(graph);
  if (!failed.empty()) {
    cudaGetLastError();  // capture errors are not sticky; clear the last one
    graphs_off("the capture failed (" + failed + ")");
    enqueue();
    return;
  }
  ++captured_;
  OASES_CUDA_CHECK(cudaGraphLaunch(exec, cs));
  ++replays_;
}

void CudaTrainer::micro_batch(const std::vector<const void*>& inputs, int index, int count, bool timed) {
  cudaStream_t cs = run_.compute_stream();
  bool first = index == 0, accumulate = count > 1;
  last_count_ = count;
  if (accumulate) ensure_accumulators();
  run_.stage_inputs(inputs);
  if (first) OASES_CUDA_CHECK(cudaEventRecord(t_start_, cs));
  launch(micro_graph_[first][accumulate], !timed, [&] {
    run_.enqueue_program(timed);
    if (loss_ != kNoId) add_loss(loss_type_, run_.address(loss_), first, outcome_, cs);
    if (accumulate) multi_tensor_accumulate(tt_, first, cs);
  });
  if (loss_ == kNoId && first) OASES_CUDA_CHECK(cudaMemsetAsync(outcome_, 0, sizeof(double), cs));
  if (index == count - 1) OASES_CUDA_CHECK(cudaEventRecord(t_micro_, cs));
}

std::vector<double> CudaTrainer::sum_squares(double* loss_sum) {
  cudaStream_t cs = run_.compute_stream();
  StepScalars sc;  // raw sums only: no scaling, no skipping
  *scalars_host_ = sc;
  OASES_CUDA_CHECK(cudaMemcpyAsync(scalars_, scalars_host_, sizeof(StepScalars), cudaMemcpyHostToDevice, cs));
  multi_tensor_norm(tt_, last_count_ > 1, scalars_, partials_, per_tensor_, outcome_, cs);
  std::vector<double> ss(params_.size());
  run_.synchronize("CUDA step (gradients)");
  if (!ss.empty()) OASES_CUDA_CHECK(cudaMemcpy(ss.data(), per_tensor_, ss.size() * sizeof(double), cudaMemcpyDeviceToHost));
  OASES_CUDA_CHECK(cudaMemcpy(outcome_host_, outcome_, sizeof(StepOutcome), cudaMemcpyDeviceToHost));
  *loss_sum = outcome_host_->loss_sum;
  return ss;
}

Tensor CudaTrainer::gradient(size_t i) {
  Tensor t(DType::kF32, run_.program().graph.value(params_[i]).shape);
  OASES_CUDA_CHECK(cudaStreamSynchronize(run_.compute_stream()));
  const float* src = last_count_ > 1 ? acc_ + offset_[i] : static_cast<const float*>(run_.address(grads_[i]));
  if (t.nbytes()) OASES_CUDA_CHECK(cudaMemcpy(t.raw_mutable(), src, t.nbytes(), cudaMemcpyDeviceToHost));
  return t;
}

DeviceStepOutcome CudaTrainer::update(const DeviceStepPlan& plan, const double* host_norm) {
  cudaStream_t cs = run_.compute_stream();
  StepScalars sc = step_scalars(plan.knobs, plan.grad_scale);
  sc.skip_nonfinite = plan.skip_nonfinite ? 1 : 0;
  sc.use_host_norm = host_norm ? 1 : 0;
  sc.host_norm = host_norm ? *host_norm : 0.0;
  // the previous step's copy of the scalars finished at its wait, so the host buffer is free
  *scalars_host_ = sc;
  OASES_CUDA_CHECK(cudaMemcpyAsync(scalars_, scalars_host_, sizeof(StepScalars), cudaMemcpyHostToDevice, cs));
  bool from_acc = last_count_ > 1;
  launch(update_graph_[from_acc], true, [&] {
    multi_tensor_norm(tt_, from_acc, scalars_, partials_, per_tensor_, outcome_, cs);
    multi_tensor_update(tt_, from_acc, scalars_, outcome_, cs);
  });
  OASES_CUDA_CHECK(cudaEventRecord(t_end_, cs));
  OASES_CUDA_CHECK(cudaMemcpyAsync(outcome_host_, outcome_, sizeof(StepOutcome), cudaMemcpyDeviceToHost, cs));
  run_.synchronize("CUDA step");
  ++steps_;
  DeviceStepOutcome out;
  out.loss_sum = outcome_host_->loss_sum;
  out.norm = outcome_host_->norm;
  out.skipped = outcome_host_->skipped != 0;
  float run_ms = 0, update_ms = 0;
  if (cudaEventElapsedTime(&run_ms, t_start_, t_micro_) == cudaSuccess && cudaEventElapsedTime(&update_ms, t_micro_, t_end_) == cudaSuccess) {
    out.run_ms = run_ms;
    out.update_ms = update_ms;
  }
  cudaGetLastError();
  return out;
}

void CudaTrainer::transfer(const std::vector<Tensor*>& params, const std::vector<std::vector<Tensor*>>& moments, bool to_host) {
  OASES_CUDA_CHECK(cudaSetDevice(run_.device()));
  OASES_CUDA_CHECK(cudaStreamSynchronize(run_.compute_stream()));
  for (size_t i = 0; i < params_.size(); ++i) {
    if (to_host) {
      run_.copy_to_host(params_[i], params[i]->raw_mutable());
    } else {
      run_.copy_from_host(params_[i], params[i]->raw());
    }
    for (size_t j = 0; j < moments[i].size() && j < (adamw_ ? 2u : 1u); ++j) {
      float* dev = moments_ + static_cast<int64_t>(j) * total_ + offset_[i];
      Tensor& host = *moments[i][j];
      if (!host.nbytes()) continue;
      if (to_host) {
        OASES_CUDA_CHECK(cudaMemcpy(host.raw_mutable(), dev, host.nbytes(), cudaMemcpyDeviceToHost));
      } else {
        OASES_CUDA_CHECK(cudaMemcpy(dev, host.raw(), host.nbytes(), cudaMemcpyHostToDevice));
      }
    }
  }
}

}  // namespace
}  // namespace cuda

Expected<std::unique_ptr<DeviceTrainer>> make_device_trainer(DeviceRunner& runner, const Graph& g, const std::vector<ValueId>& params,
                                                             const std::vector<ValueId>& grads, ValueId loss, const Optimizer& opt) {
  auto* r = dynamic_cast<cuda::CudaRunner*>(&runner);
  if (!r) return Status::error("the device trainer needs a CUDA runner");
  auto t = std::make_unique<cuda::CudaTrainer>(*r);
  OASES_RETURN_IF_ERROR(t->init(g, params, grads, loss, opt));
  return std::unique_ptr<DeviceTrainer>(std::move(t));
}

}  // namespace oases

namespace oases {

Expected<double> measure_cuda_optimizer() {
  // 256 MiB of fp32 parameters in 64 tensors, through the trainer's tables and kernels
  constexpr int kTensors = 64;
  constexpr int64_t kEach = int64_t(1) << 20;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  try {
    cuda::DeviceBuffers mem;
    std::vector<float*> p, m, v;
    std::vector<const float*> g;
    for (int i = 0; i < kTensors; ++i) {
      p.push_back(mem.alloc<float>(kEach));
      g.push_back(mem.alloc<float>(kEach));
      m.push_back(mem.alloc<float>(kEach));
      v.push_back(mem.alloc<float>(kEach));
    }
    OASES_ASSIGN_OR_RETURN(cuda::MultiTensorTables tt, cuda::multi_tensor_tables(mem, p, g, m, v, std::vector<int64_t>(kTensors, kEach),
                                                                                  std::vector<uint8_t>(kTensors, 1), cuda::kChunk));
    Optimizer host(OptimizerConfig{});
    cuda::StepScalars sc = cuda::step_scalars(host.next_knobs(), 1.f);
    sc.clip = 1.0;
    auto* scd = mem.put(std::vector<cuda::StepScalars>{sc});
    auto* out = mem.alloc<cuda::StepOutcome>(1);
    auto* partials = mem.alloc<double>(static_cast<size_t>(tt.blocks));
    auto* per = mem.alloc<double>(kTensors);
    OASES_CUDA_CHECK(cudaEventCreate(&e0));
    OASES_CUDA_CHECK(cudaEventCreate(&e1));
    auto step = [&] {
      cuda::multi_tensor_norm(tt, false, scd, partials, per, out, nullptr);
      cuda::multi_tensor_update(tt, false, scd, out, nullptr);
    };
    for (int i = 0; i < 3; ++i) step();
    constexpr int kReps = 10;
    OASES_CUDA_CHECK(cudaEventRecord(e0, nullptr));
    for (int i = 0; i < kReps; ++i) step();
    OASES_CUDA_CHECK(cudaEventRecord(e1, nullptr));
    OASES_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    OASES_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    double mib = static_cast<double>(kTensors * kEach * 4) / (1 << 20);
    return static_cast<double>(ms) * 1e3 / kReps / mib;
  } catch (const std::exception& e) {
    for (cudaEvent_t ev : {e0, e1}) {
      if (ev) cudaEventDestroy(ev);
    }
    return Status::error(e.what());
  }
}

}  // namespace oases
