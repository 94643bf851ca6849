#include "executor/executor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "executor/device.h"
#include "executor/fusion.h"
#include "executor/half_adapter.h"
#include "graph/op_registry.h"
#include "kernels/cpu/parallel.h"

namespace oases {

const CpuKernelRegistry& CpuKernelRegistry::global() {
  static const CpuKernelRegistry reg = [] {
    CpuKernelRegistry r;
    register_cpu_elementwise(r);
    register_cpu_layout(r);
    register_cpu_nn(r);
    register_cpu_collectives(r);
    register_cpu_fused(r);
    return r;
  }();
  return reg;
}

void CpuKernelRegistry::add(const std::string& domain, const std::string& op, CpuKernelFn fn) {
  fns_[{domain, op}] = std::move(fn);
}

const CpuKernelFn* CpuKernelRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = fns_.find({domain == "ai.onnx" ? std::string() : domain, op});
  return it == fns_.end() ? nullptr : &it->second;
}

std::vector<std::string> CpuKernelRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : fns_) out.push_back(k.first.empty() ? k.second : k.first + "." + k.second);
  return out;
}

namespace {

// Fusion under a scheduler's order: the compute nodes and collective starts go through the fuser
// as one order (a fused node takes the place of its chain's last node); each collective wait goes
// back before the first surviving step that followed it, or before a fused node standing in for
// steps that followed it, so no wait moves after a reader of its result.
Expected<std::vector<ScheduledOp>> fuse_scheduled(Graph& g, const std::vector<ScheduledOp>& schedule, const std::set<ValueId>& keep,
                                                  FusionStats* stats) {
  std::vector<NodeId> order;
  std::map<NodeId, size_t> index;                // node -> its position in `order` before fusion
  std::vector<std::pair<size_t, NodeId>> waits;  // (position of the step it preceded, node)
  std::map<NodeId, ScheduledOp::Kind> kind;
  for (const ScheduledOp& op : schedule) {
    if (op.kind == ScheduledOp::Kind::kCommWait) {
      waits.push_back({order.size(), op.node});
      continue;
    }
    index[op.node] = order.size();
    kind[op.node] = op.kind;
    order.push_back(op.node);
  }
  *stats = fuse_for_cpu(g, order, keep);
  // position of every step after fusion, in the old numbering (new nodes: just before the next old one)
  std::vector<double> pos(order.size());
  double next_old = static_cast<double>(index.size());
  for (size_t i = order.size(); i-- > 0;) {
    auto it = index.find(order[i]);
    if (it != index.end() && g.alive(order[i])) {
      pos[i] = static_cast<double>(it->second);
      next_old = pos[i];
    } else {
      pos[i] = next_old - 0.5;
    }
  }
  std::vector<ScheduledOp> out;
  size_t w = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    while (w < waits.size() && static_cast<double>(waits[w].first) <= pos[i] + 0.25)
      out.push_back({ScheduledOp::Kind::kCommWait, waits[w++].second});
    auto k = kind.find(order[i]);
    out.push_back({k == kind.end() ? ScheduledOp::Kind::kCompute : k->second, order[i]});
  }
  while (w < waits.size()) out.push_back({ScheduledOp::Kind::kCommWait, waits[w++].second});
  for (const ScheduledOp& op : out) {
    if (!g.alive(op.node)) return error("fusion removed node {}, which the schedule still runs", op.node);
  }
  return out;
}

}  // namespace

Expected<Program> compile_program(Graph g, const ExecOptions& opts) {
  Program p;
  // executor fusion makes CPU-only ops (the oases.cpu domain) and in-place outputs planned for the
  // CPU kernels; a device program runs the canonical graph as it is
  const bool fuse = opts.fuse && opts.device == "cpu" && std::getenv("OASES_NO_FUSION") == nullptr;
  std::vector<ScheduledOp> schedule = opts.order;
  if (fuse) {
    if (schedule.empty()) {
      OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
      p.fusion = fuse_for_cpu(g, order, opts.keep);
      for (NodeId id : order) schedule.push_back(ScheduledOp{ScheduledOp::Kind::kCompute, id});
    } else {
      OASES_ASSIGN_OR_RETURN(schedule, fuse_scheduled(g, schedule, opts.keep, &p.fusion));
    }
  }
  const CpuKernelRegistry& kr = CpuKernelRegistry::global();
  std::vector<PlanStep> steps;
  auto add = [&](Instr::Kind kind, NodeId id) -> Status {
    const Node& n = g.node(id);
    const CpuKernelFn* fn = kr.find(n.domain, n.op_type);
    if (!fn) return error("{}: no CPU kernel for this op", n.describe());
    if (has_half_operand(g, n)) fn = half_adapted_kernel(n.domain, n.op_type, fn);  // mixed precision
    for (ValueId o : n.outputs) {
      if (o != kNoId && !g.value(o).has_shape) return error("{}: output '{}' has no shape", n.describe(), g.value(o).name);
    }
    p.instrs.push_back(Instr{kind, id});
    p.kernels.push_back(fn);
    steps.push_back(PlanStep{id, kind != Instr::Kind::kCommWait, kind != Instr::Kind::kCommStart});
    return Status::ok();
  };
  if (schedule.empty()) {
    OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
    for (NodeId id : order) OASES_RETURN_IF_ERROR(add(Instr::Kind::kCompute, id));
  } else {
    // the scheduler's order: every live node once (collectives as a start and a wait)
    std::vector<int> seen(static_cast<size_t>(g.max_node_id()), 0);
    for (const ScheduledOp& op : schedule) {
      if (!g.alive(op.node)) return error("the schedule names node {}, which the graph does not have", op.node);
      Instr::Kind k = op.kind == ScheduledOp::Kind::kCompute     ? Instr::Kind::kCompute
                      : op.kind == ScheduledOp::Kind::kCommStart ? Instr::Kind::kCommStart
                                                                 : Instr::Kind::kCommWait;
      OASES_RETURN_IF_ERROR(add(k, op.node));
      if (k != Instr::Kind::kCommWait) seen[static_cast<size_t>(op.node)]++;
    }
    for (NodeId id : g.nodes()) {
      if (seen[static_cast<size_t>(id)] != 1)
        return error("the schedule runs {} {} times", g.node(id).describe(), seen[static_cast<size_t>(id)]);
    }
  }
  p.memory = MemoryPlan::build(g, steps, opts.keep, fuse ? MemoryPlan::InplaceFn(inplace_input) : MemoryPlan::InplaceFn());
  p.graph = std::move(g);
  return p;
}

std::vector<ScheduledOp> program_order(const Program& p) {
  std::vector<ScheduledOp> order;
  for (const Instr& ins : p.instrs) {
    ScheduledOp::Kind k = ins.kind == Instr::Kind::kCompute     ? ScheduledOp::Kind::kCompute
                          : ins.kind == Instr::Kind::kCommStart ? ScheduledOp::Kind::kCommStart
                                                                : ScheduledOp::Kind::kCommWait;
    order.push_back(ScheduledOp{k, ins.node});
  }
  return order;
}

// The communication thread: runs collectives in the order they were started.
struct Executor::CommThread {
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, std::function<void()>>> queue;
  std::vector<char> done;           // by instruction index of the start
  std::vector<std::string> errors;  // by instruction index
  bool stop = false;

  explicit CommThread(size_t n) : done(n, 1), errors(n) {
    worker = std::thread([this] { loop(); });
  }
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void loop() {
    for (;;) {
      std::pair<size_t, std::function<void()>> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      std::string err;
      try {
        task.second();
      } catch (const std::exception& e) {
        err = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        errors[task.first] = err;
        done[task.first] = 1;
      }
      cv.notify_all();
    }
  }
  void submit(size_t i, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done[i] = 0;
      errors[i].clear();
      queue.emplace_back(i, std::move(fn));
    }
    cv.notify_all();
  }
  // Waits for task i; rethrows its error.
  void wait(size_t i) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done[i] != 0; });
    if (!errors[i].empty()) throw OasesError(errors[i]);
  }
  void wait_all() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return queue.empty() && std::all_of(done.begin(), done.end(), [](char d) { return d != 0; }); });
  }
};

Expected<std::unique_ptr<Executor>> Executor::create(Graph g, const ExecOptions& opts) {
  if (opts.threads < 0 || opts.threads > kernels::kMaxThreads) {
    return error("{} kernel threads asked for: give 0 (the default) to {}", opts.threads, kernels::kMaxThreads);
  }
  OASES_ASSIGN_OR_RETURN(Program p, compile_program(std::move(g), opts));
  auto ex = std::unique_ptr<Executor>(new Executor());
  ex->t0_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  ex->prog_ = std::move(p);
  ex->arena_size_ = std::max<size_t>(64, ex->prog_.memory.arena_bytes);
  if (ex->arena_size_ > max_memory_bytes()) {
    // Name the largest arena value: with a runaway shape (ConstantOfShape of 2^32 floats) it is the culprit.
    const Graph& gr = ex->prog_.graph;
    const auto& slots = ex->prog_.memory.slots;
    ValueId big = kNoId;
    for (ValueId v = 0; v < static_cast<ValueId>(slots.size()); ++v) {
      if (slots[v].kind == ValueSlot::Kind::kArena && (big == kNoId || slots[v].bytes > slots[big].bytes)) big = v;
    }
    std::string culprit;
    if (big != kNoId) {
      const Value& val = gr.value(big);
      culprit =
          fmt::format(" (largest: '{}' {}{} of {} bytes{}{})", val.name, dtype_name(val.dtype), shape_str(val.shape), slots[big].bytes,
                      val.producer != kNoId ? " from " : "", val.producer != kNoId ? gr.node(val.producer).describe() : "");
    }
    return error("the activation arena needs {} bytes, over the memory limit of {} bytes{}; raise it with --max-memory", ex->arena_size_,
                 max_memory_bytes(), culprit);
  }
  ex->arena_ = std::aligned_alloc(64, (ex->arena_size_ + 63) / 64 * 64);
  if (!ex->arena_) return error("cannot allocate the activation arena of {} bytes", ex->arena_size_);
  std::memset(ex->arena_, 0, ex->arena_size_);
  if (opts.threads > 0) kernels::set_num_threads(opts.threads);
  const Graph& gr = ex->prog_.graph;
  ex->groups_ = opts.groups;
  ex->contexts_.resize(ex->prog_.instrs.size());
  bool async = false;
  for (size_t i = 0; i < ex->prog_.instrs.size(); ++i) {
    async |= ex->prog_.instrs[i].kind == Instr::Kind::kCommStart;
    const Node& n = gr.node(ex->prog_.instrs[i].node);
    KernelContext& c = ex->contexts_[i];
    c.graph = &gr;
    c.node = &n;
    c.state = &ex->state_;
    c.groups = &ex->groups_;
    for (ValueId v : n.inputs) {
      TensorView tv;
      if (v != kNoId) {
        tv.dtype = gr.value(v).dtype;
        tv.shape = gr.value(v).shape;
      }
      c.in.push_back(tv);
    }
    for (ValueId v : n.outputs) {
      TensorView tv;
      if (v != kNoId) {
        tv.dtype = gr.value(v).dtype;
        tv.shape = gr.value(v).shape;
      }
      c.out.push_back(tv);
    }
  }
  OASES_ASSIGN_OR_RETURN(ex->device_, make_device_runner(opts.device, ex->prog_, opts, &ex->state_));
  if (async && !ex->device_) ex->comm_ = std::make_unique<CommThread>(ex->prog_.instrs.size());
  return ex;
}

Executor::~Executor() {
  device_.reset();
  comm_.reset();
  std::free(arena_);
}

double Executor::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0_;
}

std::vector<TraceEvent> Executor::take_events() {
  std::vector<TraceEvent> out;
  out.swap(events_);
  return out;
}

void* Executor::ptr_of(ValueId v) const {
  const ValueSlot& s = prog_.memory.slots[v];
  switch (s.kind) {
    case ValueSlot::Kind::kArena: return static_cast<char*>(arena_) + s.offset;
    case ValueSlot::Kind::kConstant: return const_cast<void*>(prog_.graph.value(v).constant.raw());
    case ValueSlot::Kind::kInput: return const_cast<void*>(input_ptrs_[v]);
    case ValueSlot::Kind::kView: return ptr_of(s.root);
    default: return nullptr;
  }
}

void Executor::bind(size_t i) {
  KernelContext& c = contexts_[i];
  const Node& n = *c.node;
  for (size_t s = 0; s < n.inputs.size(); ++s) c.in[s].data = n.inputs[s] == kNoId ? nullptr : ptr_of(n.inputs[s]);
  for (size_t s = 0; s < n.outputs.size(); ++s) c.out[s].data = n.outputs[s] == kNoId ? nullptr : ptr_of(n.outputs[s]);
}

void Executor::run_compute(size_t i) {
  bind(i);
  if (profiling_ || tracing_) {
    double t0 = now_us();
    (*prog_.kernels[i])(contexts_[i]);
    double t1 = now_us();
    if (profiling_) node_ms_[i] = (t1 - t0) / 1000.0;
    if (tracing_)
      events_.push_back(TraceEvent{prog_.instrs[i].node, 0, is_collective(*contexts_[i].node) ? "comm" : "compute", t0, t1 - t0});
  } else {
    (*prog_.kernels[i])(contexts_[i]);
  }
}

Expected<std::vector<Tensor>> Executor::run(const std::map<std::string, Tensor>& inputs) {
  OASES_RETURN_IF_ERROR(execute(inputs));
  std::vector<Tensor> outs;
  for (ValueId v : prog_.graph.outputs()) outs.push_back(read(v));
  return outs;
}

Status Executor::execute(const std::map<std::string, Tensor>& inputs) {
  const Graph& g = prog_.graph;
  input_ptrs_.assign(g.num_values(), nullptr);
  held_inputs_.clear();
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    auto it = inputs.find(val.name);
    if (it == inputs.end()) return error("input '{}' ({}{}) was not given", val.name, dtype_name(val.dtype), shape_str(val.shape));
    const Tensor& t = it->second;
    if (t.dtype() != val.dtype) {
      return error("input '{}' has type {}, the model expects {}", val.name, dtype_name(t.dtype()), dtype_name(val.dtype));
    }
    if (t.shape() != val.shape) {
      return error("input '{}' has shape {}, the model was prepared for {}", val.name, shape_str(t.shape()), shape_str(val.shape));
    }
    held_inputs_.push_back(t);
    input_ptrs_[v] = t.raw();
  }
  if (device_) {
    try {
      device_->run(input_ptrs_, arena_);
    } catch (const std::exception& e) {
      return Status::error(e.what());
    }
    return Status::ok();
  }
  if (profiling_) node_ms_.assign(prog_.instrs.size(), 0.0);
  std::vector<size_t> start_of(static_cast<size_t>(g.max_node_id()), 0);
  try {
    for (size_t i = 0; i < prog_.instrs.size(); ++i) {
      const Instr& ins = prog_.instrs[i];
      switch (ins.kind) {
        case Instr::Kind::kCompute: run_compute(i); break;
        case Instr::Kind::kCommStart: {
          bind(i);
          start_of[static_cast<size_t>(ins.node)] = i;
          KernelContext* c = &contexts_[i];
          const CpuKernelFn* fn = prog_.kernels[i];
          bool trace = tracing_;
          comm_->submit(i, [this, c, fn, trace, i] {
            double t0 = trace ? now_us() : 0;
            (*fn)(*c);
            if (trace) {
              double t1 = now_us();
              std::lock_guard<std::mutex> lock(comm_->mu);
              comm_events_.push_back(TraceEvent{prog_.instrs[i].node, 1, "comm", t0, t1 - t0});
            }
          });
          break;
        }
        case Instr::Kind::kCommWait: {
          double t0 = tracing_ ? now_us() : 0;
          comm_->wait(start_of[static_cast<size_t>(ins.node)]);
          if (tracing_) events_.push_back(TraceEvent{ins.node, 0, "wait", t0, now_us() - t0});
          break;
        }
      }
    }
    if (comm_) comm_->wait_all();
  } catch (const OasesError& e) {
    if (comm_) {
      try {
        comm_->wait_all();
      } catch (...) {}
    }
    return Status::error(e.what());
  }
  if (tracing_ && comm_) {
    std::lock_guard<std::mutex> lock(comm_->mu);
    events_.insert(events_.end(), comm_events_.begin(), comm_events_.end());
    comm_events_.clear();
  }
  return Status::ok();
}

TensorView Executor::view(ValueId v) const {
  const Value& val = prog_.graph.value(v);
  return TensorView{val.dtype, val.shape, ptr_of(v)};
}

Tensor Executor::read(ValueId v) const {
  const Value& val = prog_.graph.value(v);
  if (val.is_constant()) return val.constant.clone();
  Tensor t(val.dtype, val.shape);
  const void* p = ptr_of(v);
  if (p && t.nbytes()) std::memcpy(t.raw_mutable(), p, t.nbytes());
  return t;
}

Expected<std::vector<Tensor>> CpuEvaluator::evaluate(const Graph& g, const Node& node, const std::vector<Tensor>& inputs) const {
  const CpuKernelFn* fn = CpuKernelRegistry::global().find(node.domain, node.op_type);
  if (!fn) return error("{}: no CPU kernel", node.describe());
  KernelContext c;
  c.graph = &g;
  c.node = &node;
  RunState st;
  c.state = &st;
  for (const Tensor& t : inputs) {
    TensorView tv;
    if (t.defined()) {
      tv.dtype = t.dtype();
      tv.shape = t.shape();
      tv.data = const_cast<void*>(t.raw());
    }
    c.in.push_back(tv);
  }
  std::vector<Tensor> outs;
  for (ValueId o : node.outputs) {
    if (o == kNoId) {
      outs.emplace_back();
      c.out.emplace_back();
      continue;
    }
    const Value& v = g.value(o);
    outs.emplace_back(v.dtype, v.shape);
    c.out.push_back(TensorView{v.dtype, v.shape, outs.back().raw_mutable()});
  }
  try {
    (*fn)(c);
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  return outs;
}

}  // namespace oases
