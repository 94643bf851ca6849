#include "executor/executor.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>

#include "executor/device.h"
#include "executor/half_adapter.h"
#include "graph/op_registry.h"
#include "graph/passes/fusion.h"
#include "kernels/cpu/parallel.h"

namespace oases {

const CpuKernelRegistry& program_kernels() {
  static const CpuKernelRegistry reg = [] {
    CpuKernelRegistry r = CpuKernelRegistry::global();
    register_reshard(r);
    return r;
  }();
  return reg;
}

Expected<Program> compile_program(ProgramLayout layout) {
  Program p;
  const CpuKernelRegistry& kr = program_kernels();
  for (const ScheduledOp& op : layout.order) {
    const Node& n = layout.graph.node(op.node);
    const CpuKernelFn* fn = kr.find(n.domain, n.op_type);
    if (!fn) return error("{}: no CPU kernel for this op", n.describe());
    if (has_half_operand(layout.graph, n)) fn = half_adapted_kernel(n.domain, n.op_type, fn);  // mixed precision
    p.kernels.push_back(fn);
  }
  p.graph = std::move(layout.graph);
  p.instrs = std::move(layout.order);
  p.memory = std::move(layout.memory);
  p.fusion = layout.fusion;
  p.reshards = std::move(layout.reshards);
  if (std::string missing = unplanned_reshards(p.graph, p.reshards); !missing.empty())
    return error("{}: no transfer plan; the planner plans a program's Reshard nodes as it builds it (planner/reshard_nodes.h)", missing);
  return p;
}

Expected<Program> compile_program(Graph g, const ExecOptions& opts) {
  // executor fusion makes CPU-only ops (the oases.cpu domain) and in-place outputs planned for the
  // CPU kernels; a device program runs the canonical graph as it is
  OASES_ASSIGN_OR_RETURN(ProgramLayout layout,
                         lay_out_program(std::move(g), opts.order, opts.keep, fusion_for(opts.fuse, opts.device)));
  layout.reshards = opts.reshards;
  return compile_program(std::move(layout));
}

std::vector<ScheduledOp> program_order(const Program& p) {
  return p.instrs;
}

namespace {
// what the communication threads' priority came to: kNotYet, or the nice achieved, or refused
constexpr int kNotYet = 1000, kRefused = 1001, kLeft = 1002;
std::atomic<int> comm_nice{kNotYet};
std::atomic<int> process_nice{0};

int comm_nice_offset() {
  const char* e = std::getenv("OASES_COMM_NICE");
  if (!e || !*e) return -10;
  char* end = nullptr;
  long v = std::strtol(e, &end, 10);
  return *end == 0 && v >= -39 && v <= 39 ? static_cast<int>(v) : -10;
}

// Called on the communication thread itself (nice is per thread on Linux).
void raise_comm_thread_priority() {
  const int offset = comm_nice_offset();
  const id_t tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);  // -1 is a valid nice: errno tells
  if (errno != 0) return;
  process_nice = now;
  if (offset == 0) {
    comm_nice = kLeft;
    return;
  }
  const int want = std::clamp(now + offset, -20, 19);
  if (setpriority(PRIO_PROCESS, tid, want) != 0) {
    comm_nice = kRefused;
    return;
  }
  errno = 0;
  const int got = getpriority(PRIO_PROCESS, tid);  // what the report says is what the thread has
  comm_nice = errno == 0 ? got : want;
}
}  // namespace

std::string comm_thread_priority() {
  const int n = comm_nice.load(), p = process_nice.load();
  if (n == kNotYet) return "communication threads: none started";
  if (n == kLeft) return fmt::format("communication threads at the process's nice {} (OASES_COMM_NICE=0)", p);
  if (n == kRefused) {
    return fmt::format("communication threads at the process's nice {}: raising it was refused (needs CAP_SYS_NICE or ulimit -e)", p);
  }
  return fmt::format("communication threads at nice {} (the process at {})", n, p);
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
    raise_comm_thread_priority();
    // named once its priority is settled: `top -H`, gdb and the priority test find it by the name
    pthread_setname_np(pthread_self(), "oases-comm");
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
  // Room for tasks numbered up to n (the program's instructions, then a run's deferred writes);
  // called between runs, when nothing is queued.
  void reserve(size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    if (done.size() < n) {
      done.resize(n, 1);
      errors.resize(n);
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
  return create(std::move(p), opts);
}

Expected<std::unique_ptr<Executor>> Executor::create(Program p, const ExecOptions& opts) {
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
    c.comm = opts.comm;
    if (auto r = ex->prog_.reshards.find(n.name); r != ex->prog_.reshards.end()) c.reshard = r->second.get();
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
  if (async && !ex->device_) {
    ex->comm_ = std::make_unique<CommThread>(ex->prog_.instrs.size());
    bool second = false;
    for (const Instr& ins : ex->prog_.instrs)
      second |= ins.kind == Instr::Kind::kCommStart && gr.node(ins.node).attrs.get_int("channel", 0) > 0;
    if (second) ex->channel_ = std::make_unique<CommThread>(ex->prog_.instrs.size());
  }
  return ex;
}

Executor::~Executor() {
  device_.reset();
  comm_.reset();
  channel_.reset();
  std::free(arena_);
}

double Executor::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0_;
}

std::vector<TraceEvent> device_trace_events(const Graph& g, const std::vector<ScheduledOp>& instrs, const std::vector<DeviceSpan>& spans,
                                            double origin_us) {
  std::vector<TraceEvent> out;
  std::vector<std::pair<double, double>> busy;  // the compute stream's kernels
  for (const DeviceSpan& s : spans) {
    const NodeId node = instrs[s.instr].node;
    const bool comm = is_collective(g.node(node));
    if (!comm && s.stream == 0) busy.push_back({s.start_us, s.start_us + s.dur_us});
    out.push_back(TraceEvent{node, s.stream, comm ? "comm" : "compute", origin_us + s.start_us, s.dur_us});
  }
  std::sort(busy.begin(), busy.end());
  for (const DeviceSpan& s : spans) {
    const NodeId node = instrs[s.instr].node;
    if (s.stream == 0 || !is_collective(g.node(node))) continue;
    const double a = s.start_us, b = s.start_us + s.dur_us;
    double covered = 0, reach = a;  // compute kernels' time inside [a, b), overlaps counted once
    for (const auto& [from, to] : busy) {
      if (to <= reach || from >= b) continue;
      covered += std::min(to, b) - std::max(from, reach);
      reach = std::min(to, b);
    }
    out.push_back(TraceEvent{node, 0, "issue", origin_us + a, 0});
    // the wait: from the end of the last compute kernel beside it (all of that compute was its
    // room), as long as the compute stream sat idle while it ran
    const double exposed = b - a - covered;
    if (exposed > 0) out.push_back(TraceEvent{node, 0, "wait", origin_us + reach, exposed});
  }
  return out;
}

void Executor::add_device_events(double origin_us) {
  if (!device_) return;
  std::vector<DeviceSpan> spans;
  device_->read_spans(&spans);
  std::vector<TraceEvent> ev = device_trace_events(prog_.graph, prog_.instrs, spans, origin_us);
  events_.insert(events_.end(), ev.begin(), ev.end());
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

namespace {

// CPU time the calling thread has been given, microseconds.
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

}  // namespace

void Executor::run_compute(size_t i) {
  bind(i);
  if (node_timing_ || tracing_) {
    double c0 = node_timing_ ? thread_cpu_us() : 0;
    double t0 = now_us();
    (*prog_.kernels[i])(contexts_[i]);
    double t1 = now_us();
    if (node_timing_) {
      node_ms_[i] = (t1 - t0) / 1000.0;
      node_cpu_us_[i] = {c0, thread_cpu_us()};
    }
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

Expected<std::vector<const void*>> Executor::input_pointers(const std::map<std::string, Tensor>& inputs) const {
  const Graph& g = prog_.graph;
  std::vector<const void*> ptrs(g.num_values(), nullptr);
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
    ptrs[static_cast<size_t>(v)] = t.raw();
  }
  return ptrs;
}

void Executor::constants_changed() {
  if (device_) device_->constants_changed();
}

Status Executor::execute(const std::map<std::string, Tensor>& inputs) {
  const Graph& g = prog_.graph;
  OASES_ASSIGN_OR_RETURN(input_ptrs_, input_pointers(inputs));
  held_inputs_.clear();
  for (ValueId v : g.inputs()) held_inputs_.push_back(inputs.at(g.value(v).name));
  if (device_) {
    try {
      for (const ConstantWrite& w : deferred_) w.run();
      deferred_.clear();
      const double origin = now_us();
      std::vector<double> ms;
      device_->run(input_ptrs_, arena_, node_timing_ ? &node_ms_ : tracing_ ? &ms : nullptr);
      if (tracing_) add_device_events(origin);
    } catch (const std::exception& e) {
      return Status::error(e.what());
    }
    return Status::ok();
  }
  if (node_timing_) {
    node_ms_.assign(prog_.instrs.size(), 0.0);
    node_cpu_us_.assign(prog_.instrs.size(), {0.0, 0.0});
  }
  std::vector<size_t> start_of(static_cast<size_t>(g.max_node_id()), 0);
  // deferred writes of constants: task n + k on the communication thread, awaited before the first
  // reader of what it writes (writes_task: per value, its task; -1 none or awaited). They are in
  // order of first use; one is queued ahead of the one awaited (the first at the start), so the
  // program's own collectives wait behind at most one of them.
  std::vector<ConstantWrite> writes = std::move(deferred_);
  deferred_.clear();
  const size_t n_instrs = prog_.instrs.size();
  std::vector<int> writes_task;
  std::vector<NodeId> reader;  // per write, when tracing: the first instruction's node reading what it writes (traced as its communication)
  size_t submitted = 0;
  auto submit_through = [&](size_t k) {
    for (; submitted <= k && submitted < writes.size(); ++submitted) {
      std::function<void()> run = writes[submitted].run;
      const NodeId node = reader[submitted];
      const bool trace = tracing_ && node != kNoId;
      comm_->submit(n_instrs + submitted, [this, run, node, trace] {
        double t0 = trace ? now_us() : 0;
        run();
        if (trace) {
          std::lock_guard<std::mutex> lock(comm_->mu);
          comm_events_.push_back(TraceEvent{node, 1, "comm", t0, now_us() - t0});
        }
      });
    }
  };
  try {
    if (!writes.empty() && !comm_) {
      for (const ConstantWrite& w : writes) w.run();
    } else if (!writes.empty()) {
      comm_->reserve(n_instrs + writes.size());
      writes_task.assign(g.num_values(), -1);
      for (size_t k = 0; k < writes.size(); ++k) {
        for (ValueId v : writes[k].writes) {
          if (v != kNoId && static_cast<size_t>(v) < writes_task.size()) writes_task[static_cast<size_t>(v)] = static_cast<int>(k);
        }
      }
      reader.assign(writes.size(), kNoId);
      for (size_t i = 0; tracing_ && i < n_instrs; ++i) {
        const NodeId node = prog_.instrs[i].node;
        for (ValueId v : g.node(node).inputs) {
          if (v == kNoId || static_cast<size_t>(v) >= writes_task.size() || writes_task[static_cast<size_t>(v)] < 0) continue;
          NodeId& r = reader[static_cast<size_t>(writes_task[static_cast<size_t>(v)])];
          if (r == kNoId) r = node;
        }
      }
      submit_through(0);
    }
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  auto await_writes = [&](const Node& n) {
    for (ValueId v : n.inputs) {
      if (v == kNoId || static_cast<size_t>(v) >= writes_task.size() || writes_task[static_cast<size_t>(v)] < 0) continue;
      const size_t k = static_cast<size_t>(writes_task[static_cast<size_t>(v)]);
      submit_through(k + 1);
      double t0 = tracing_ ? now_us() : 0;
      comm_->wait(n_instrs + k);
      if (tracing_) events_.push_back(TraceEvent{n.id, 0, "wait", t0, now_us() - t0});
      for (ValueId w : writes[k].writes) {
        if (w != kNoId && static_cast<size_t>(w) < writes_task.size()) writes_task[static_cast<size_t>(w)] = -1;
      }
    }
  };
  try {
    for (size_t i = 0; i < prog_.instrs.size(); ++i) {
      const Instr& ins = prog_.instrs[i];
      if (!writes_task.empty() && ins.kind != Instr::Kind::kCommWait) await_writes(g.node(ins.node));
      switch (ins.kind) {
        case Instr::Kind::kCompute: run_compute(i); break;
        case Instr::Kind::kCommStart: {
          bind(i);
          start_of[static_cast<size_t>(ins.node)] = i;
          // when the compute thread hands it over (the comm thread may start it later)
          if (tracing_) events_.push_back(TraceEvent{ins.node, 0, "issue", now_us(), 0});
          KernelContext* c = &contexts_[i];
          const CpuKernelFn* fn = prog_.kernels[i];
          bool trace = tracing_;
          CommThread* th = thread_of(*c->node);
          int lane = th == comm_.get() ? 1 : 2;
          th->submit(i, [this, c, fn, trace, i, lane] {
            double t0 = trace ? now_us() : 0;
            (*fn)(*c);
            if (trace) {
              double t1 = now_us();
              std::lock_guard<std::mutex> lock(comm_->mu);
              comm_events_.push_back(TraceEvent{prog_.instrs[i].node, lane, "comm", t0, t1 - t0});
            }
          });
          break;
        }
        case Instr::Kind::kCommWait: {
          double t0 = tracing_ ? now_us() : 0;
          double c0 = node_timing_ ? thread_cpu_us() : 0;
          thread_of(g.node(ins.node))->wait(start_of[static_cast<size_t>(ins.node)]);
          if (node_timing_) node_cpu_us_[i] = {c0, thread_cpu_us()};
          if (tracing_) events_.push_back(TraceEvent{ins.node, 0, "wait", t0, now_us() - t0});
          break;
        }
      }
    }
    if (!writes_task.empty()) submit_through(writes.size());  // any the program never read
    if (comm_) comm_->wait_all();
    if (channel_) channel_->wait_all();
  } catch (const OasesError& e) {
    if (!writes_task.empty()) {
      try {
        submit_through(writes.size());
      } catch (...) {}
    }
    for (CommThread* th : {comm_.get(), channel_.get()}) {
      if (!th) continue;
      try {
        th->wait_all();
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

Executor::CommThread* Executor::thread_of(const Node& n) const {
  return channel_ && n.attrs.get_int("channel", 0) > 0 ? channel_.get() : comm_.get();
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

}  // namespace oases
