// The executor: a graph compiled into a Program, an instruction stream (compute, collective
// start, collective wait) with each node's CPU kernel resolved and its operands placed by the
// memory plan in one arena. Collectives of a scheduled program run on a communication thread in
// the order they were started; the compute thread only waits where it reads their results.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/cpu_evaluator.h"
#include "executor/kernel_context.h"
#include "graph/evaluator.h"
#include "graph/graph.h"
#include "graph/passes/fusion.h"
#include "graph/program_order.h"
#include "planner/memory_plan.h"
#include "planner/rank_program.h"

namespace oases {

class DeviceRunner;  // executor/device.h

// One instruction: the planner's scheduled op (graph/program_order.h), the same kinds.
using Instr = ScheduledOp;

// One timed interval of a run, for traces and the overlap report.
struct TraceEvent {
  NodeId node = kNoId;
  int thread = 0;        // 0 compute, 1 communication
  std::string category;  // "compute" | "comm" | "wait" | "issue" (a collective handed to its thread, no duration)
  double start_us = 0, dur_us = 0;
  std::string label;  // an event of no node (node kNoId): its name (the trainer's update after a run)
};

// One instruction's run on a device in its runner's last timed enqueue (DeviceRunner::read_spans):
// the stream it ran on (0 compute, 1 communication) and its interval from the enqueue's first event.
struct DeviceSpan {
  size_t instr = 0;
  int stream = 0;
  double start_us = 0, dur_us = 0;
};

// A device run's spans as trace events from `origin_us`: kernels on their stream's thread (0
// compute, 1 communication); each collective on the communication stream also gets an issue at its
// start and a wait for the part of it no compute kernel ran beside (what the compute stream waited
// for: the CPU executor's wait events), starting where the last compute kernel beside it ended (the
// compute before that is its room), so --overlap-report reads both alike. A collective run on
// the compute stream is all exposed, as a CPU collective run in line.
std::vector<TraceEvent> device_trace_events(const Graph& g, const std::vector<ScheduledOp>& instrs, const std::vector<DeviceSpan>& spans,
                                            double origin_us);

struct Program {
  Graph graph;  // the canonical graph as compiled: with the executor's fused ops (graph/passes/fusion.h)
  std::vector<Instr> instrs;
  MemoryPlan memory;
  std::vector<const CpuKernelFn*> kernels;  // per instruction
  FusionStats fusion;
  ReshardPlans reshards;  // each Reshard node's transfer plan (planner/reshard_nodes.h), by node name
};

struct ExecOptions {
  std::set<ValueId> keep;          // values to keep readable after run() (besides the graph outputs)
  int threads = 0;                 // kernel threads (kernels/cpu/parallel.h); 0: the default
  bool fuse = true;                // executor-level fusion and in-place outputs (graph/passes/fusion.h); OASES_NO_FUSION=1 turns both off
  std::vector<CommGroup*> groups;  // this rank's group per mesh axis (distributed programs)
  Communicator* comm = nullptr;    // this rank's communicator (Reshard between meshes)
  // Device programs: this rank's device communicator (NCCL, or ranks sharing devices) that the
  // Reshard kernels transfer through; the host one (comm) stays for everything else.
  Communicator* device_comm = nullptr;
  // The transfer plans of the graph's Reshard nodes (planner/reshard_nodes.h plan_reshards), for
  // a graph compiled here; a laid-out program carries its own.
  ReshardPlans reshards;
  // Instruction order from the scheduler (planner/schedule.h); empty: topological order with
  // collectives run in line by the compute thread.
  std::vector<ScheduledOp> order;
  // "cpu", or "cuda": the program runs on the GPU (executor/device.h); the host API is unchanged.
  std::string device = "cpu";
};

// Compiles `g` (canonical, fully shaped) into a program: laid out (fused, memory-planned) as
// planner/rank_program.h lay_out_program does, then bound to kernels; the error names the first
// node without a CPU kernel.
Expected<Program> compile_program(Graph g, const ExecOptions& opts = {});
// Binds the CPU kernels to an already laid-out program (planner/rank_program.h build_rank_program).
Expected<Program> compile_program(ProgramLayout layout);
// A compiled program's instructions as a schedule (what the simulator replays).
std::vector<ScheduledOp> program_order(const Program& p);

// Each executor's communication thread asks the OS to run it OASES_COMM_NICE nice levels from the
// process's (default -10; 0 leaves it alone): a collective whose link time is over, or whose peer
// just arrived, should not wait for a core behind the ranks' computation (with ranks sharing cores,
// a woken communication thread otherwise waits out a compute thread's time slice, and the
// collective "runs long" beside the computation it was to hide behind). Raising a priority needs
// CAP_SYS_NICE or a nice rlimit (root has both); where refused, the thread runs at the process's.
// What happened, for reports: "communication threads at nice -10 (the process at 0)" (the nice read
// back from the thread), or why not. The thread is named "oases-comm" once its priority is set.
std::string comm_thread_priority();

class Executor {
 public:
  static Expected<std::unique_ptr<Executor>> create(Graph g, const ExecOptions& opts = {});
  // Runs a compiled program (opts.order, keep and fuse were the program's to use already).
  static Expected<std::unique_ptr<Executor>> create(Program p, const ExecOptions& opts = {});

  // Runs the program on inputs matched by name; returns the graph outputs in order. Errors name
  // the input or node at fault.
  Expected<std::vector<Tensor>> run(const std::map<std::string, Tensor>& inputs);
  // Runs without copying the outputs out; read them with view() or read().
  Status execute(const std::map<std::string, Tensor>& inputs);
  // A value's contents after run() (graph outputs, kept values, constants).
  Tensor read(ValueId v) const;
  // Checks `inputs` against the graph's inputs (names, types, shapes) and returns their host
  // pointers by ValueId (valid while `inputs` lives); what execute() does before running.
  Expected<std::vector<const void*>> input_pointers(const std::map<std::string, Tensor>& inputs) const;
  // The device runner of a program that runs on a device (executor/device.h), else null.
  DeviceRunner* device_runner() { return device_.get(); }
  // The host changed constants (parameters): a device program uploads them before its next run.
  void constants_changed();
  // Work that writes constants (the distributed optimizer's all-gathers of updated parameters),
  // finished by the next run before anything reads them: on the communication thread ahead of the
  // program's collectives (every rank of a group runs them in the same order), each waited for just
  // before the first instruction that reads one of its `writes`, so it flies beside the compute
  // before that; without a communication thread (or on a device), run at the start of the run.
  struct ConstantWrite {
    std::vector<ValueId> writes;
    std::function<void()> run;
  };
  void defer_constant_writes(std::vector<ConstantWrite> w) { deferred_ = std::move(w); }
  bool has_deferred_writes() const { return !deferred_.empty(); }
  // Per-instruction times measured elsewhere (a DeviceTrainer's timed step), as node_ms().
  void set_node_ms(std::vector<double> ms) { node_ms_ = std::move(ms); }

  const Graph& graph() const { return prog_.graph; }
  // Storage of a constant (a parameter): the optimizer and tests update it in place.
  Tensor& constant_storage(ValueId v) { return prog_.graph.value(v).constant; }
  // A value's current contents without copying (valid until the next run).
  TensorView view(ValueId v) const;
  const Program& program() const { return prog_; }
  RunState& state() { return state_; }
  // Per-node wall time of the last run, when node timing is on (oases-train/oases-run --profile,
  // oases-profile's measured runs).
  void set_node_timing(bool on) { node_timing_ = on; }
  bool node_timing() const { return node_timing_; }
  const std::vector<double>& node_ms() const { return node_ms_; }
  // Per-instruction {start, end} on the compute thread's own CPU clock (microseconds of CPU time
  // it was given), when timing nodes on the host: a kernel's work whatever share of the cores the
  // thread got (ranks sharing cores), and between two of them the executor's own work. Kernels and
  // waits have one; collective starts (run on the communication thread) and devices do not.
  const std::vector<std::pair<double, double>>& node_cpu_us() const { return node_cpu_us_; }
  // Timed events of every run since the last clear (compute, collectives, waits), when tracing.
  void set_tracing(bool on) { tracing_ = on; }
  bool tracing() const { return tracing_; }
  // A device run's spans (the runner's last timed enqueue) as trace events from `origin_us`
  // (now_us() when it was enqueued): kernels on their stream's thread (0 compute, 1 communication),
  // each collective on the communication stream with an issue at its start and a wait for the part
  // of it no compute kernel ran beside (what the compute stream waited for), as the CPU's events.
  void add_device_events(double origin_us);
  std::vector<TraceEvent> take_events();
  // An event of the caller's own (the trainer's gradient norm and update: work of this rank's
  // compute thread outside the program), kept with the program's when tracing.
  void add_event(TraceEvent e) {
    if (tracing_) events_.push_back(std::move(e));
  }
  // Microseconds since this executor was made (the time base of trace events).
  double now_us() const;

 private:
  Program prog_;
  void* arena_ = nullptr;
  size_t arena_size_ = 0;
  std::vector<const void*> input_ptrs_;  // by ValueId, during run
  std::vector<Tensor> held_inputs_;
  RunState state_;
  bool node_timing_ = false;
  std::vector<double> node_ms_;
  std::vector<std::pair<double, double>> node_cpu_us_;
  std::vector<KernelContext> contexts_;
  std::vector<CommGroup*> groups_;
  bool tracing_ = false;
  std::vector<TraceEvent> events_;
  std::vector<TraceEvent> comm_events_;  // recorded by the communication thread
  struct CommThread;
  std::unique_ptr<CommThread> comm_;
  // The second channel: collectives with attribute channel >= 1 (Reshard between meshes) run on a
  // thread of their own, so a pending receive never sits in front of the mesh's collectives.
  std::unique_ptr<CommThread> channel_;
  CommThread* thread_of(const Node& n) const;
  double t0_ = 0;
  std::unique_ptr<DeviceRunner> device_;  // set when the program runs on a device
  std::vector<ConstantWrite> deferred_;    // for the next run (defer_constant_writes)

  void* ptr_of(ValueId v) const;
  void bind(size_t i);
  void run_compute(size_t i);

 public:
  ~Executor();
};

}  // namespace oases
