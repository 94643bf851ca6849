// Devices other than the host CPU. An Executor made with ExecOptions::device = "cuda" keeps its
// program, memory plan and host-side API, and hands each run to a DeviceRunner: constants and
// inputs go up, the instruction stream runs on the device (compute and communication streams,
// executor/stream_plan.h), and the graph outputs and kept values come back into the host arena at
// their memory-plan offsets, so view(), read() and the Trainer work unchanged.
//
// The CUDA implementation lives in executor/cuda/ and is compiled only when the build has the CUDA
// backend (CMake OASES_CUDA); otherwise executor/cuda/no_cuda.cpp answers "built without CUDA".
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/communicator.h"
#include "executor/optimizer.h"
#include "graph/graph.h"
#include "graph/sharding.h"
#include "graph/status.h"

namespace oases {

struct Program;
struct ExecOptions;
struct RunState;

struct DeviceSpan;  // executor/executor.h

class DeviceRunner {
 public:
  virtual ~DeviceRunner() = default;
  // Runs the whole program once; `inputs` by ValueId (host pointers, null for non-inputs). Copies
  // the graph outputs and kept values into `host_arena`. Throws std::exception with the failing
  // node or call named.
  // With `node_ms`, also times each instruction on the device (events around its launches on its
  // stream: the kernel time plus any gap while the stream waited for the host to enqueue) into
  // (*node_ms)[instruction index].
  virtual void run(const std::vector<const void*>& inputs, void* host_arena, std::vector<double>* node_ms) = 0;

  // --- the pieces of a run, for state resident on the device (DeviceTrainer) ------------------
  // Uploads the constants if they changed on the host (the first run, or constants_changed()),
  // then the inputs: copied into a page-locked staging buffer (two, used in turn) and sent up on a
  // copy stream while earlier work computes; the compute stream waits for them. No host wait.
  virtual void stage_inputs(const std::vector<const void*>& inputs) = 0;
  // Enqueues every launch of the program (both streams; the compute stream ends after the
  // communication stream's last work); with `timed`, events around each instruction.
  virtual void enqueue_program(bool timed) = 0;
  // Waits for all enqueued work (with the NCCL watchdog); throws naming the node when a kernel
  // reported a bad index or label since the last wait.
  virtual void synchronize(const char* what) = 0;
  // Per-instruction device times of the last timed enqueue, after synchronize().
  virtual void read_timing(std::vector<double>* node_ms) = 0;
  // The same as intervals on their streams (--trace, --overlap-report), after synchronize().
  virtual void read_spans(std::vector<DeviceSpan>* spans) = 0;
  // The host changed constants (parameters restored from a checkpoint): the next run uploads them.
  virtual void constants_changed() = 0;
  // Device address of a constant, input or arena value (null when it has none).
  virtual void* address(ValueId v) const = 0;
  // Synchronous copies of one value's bytes between the device and host memory.
  virtual void copy_to_host(ValueId v, void* dst) = 0;
  virtual void copy_from_host(ValueId v, const void* src) = 0;
  // Bytes of device memory this runner holds at most (arena, constants, inputs and staging, the
  // peak of kernel scratch, workspaces).
  virtual size_t peak_device_bytes() const = 0;
};

// "cpu": nullptr (the Executor runs the program itself); "cuda": the CUDA runner or an error.
Expected<std::unique_ptr<DeviceRunner>> make_device_runner(const std::string& device, const Program& prog, const ExecOptions& opts,
                                                           RunState* state);

// --- what the build and the machine offer --------------------------------------------------

bool cuda_built();
// ok when a CUDA device can be used; else "built without CUDA" or "no CUDA device found (...)".
Status cuda_usable();
// Library versions as JSON text: {"built": bool, "libraries": [{library, read, version, compiled,
// note}], "devices": {count, error, names}}. Reads what can be read without a GPU.
std::string cuda_report_json();
// Makes this thread use device local_rank % (number of devices); errors when there is none.
Status cuda_select_device(int local_rank);
// Ops with a CUDA kernel (empty without CUDA).
std::vector<std::string> cuda_kernel_ops();
// Ops with a CPU kernel but no CUDA kernel, each with the reason (executor/cuda_coverage.cpp).
const std::map<std::string, std::string>& cuda_exempt_ops();

// --- training state resident on the device --------------------------------------------------

// What the host decided for one optimizer step (the learning-rate schedule and the loss scale
// stay on the host; executor/training.cpp).
struct DeviceStepPlan {
  OptimizerKnobs knobs;
  float grad_scale = 1;  // 1 / (micro-batches · loss scale)
  bool skip_nonfinite = false;
};
struct DeviceStepOutcome {
  double loss_sum = 0;  // Σ of the micro-batches' losses as computed (loss scale included)
  double norm = 0;
  bool skipped = false;
  double run_ms = 0, update_ms = 0;  // device time of the micro-batches and of the update
};

// Parameters (fp32 master weights: the program's constants), gradients (the program's values),
// optimizer moments and gradient accumulators live on the device between steps; a step is
// enqueued as a few multi-tensor launches after the micro-batches' programs and the host waits
// once, for the loss and the norm. After warm-up the micro-batches and the update are captured as
// CUDA graphs and replayed (OASES_CUDA_GRAPH=0: launches one by one).
class DeviceTrainer {
 public:
  virtual ~DeviceTrainer() = default;
  // Micro-batch `index` of `count`: inputs staged, program enqueued (timed when `timed`), its loss
  // added to the step's sum, and with count > 1 its gradients to the accumulators. No wait.
  virtual void micro_batch(const std::vector<const void*>& inputs, int index, int count, bool timed) = 0;
  // Waits for the enqueued micro-batches; Σ g² of each parameter's gradient and the loss sum (the
  // distributed norm; before_update hooks).
  virtual std::vector<double> sum_squares(double* loss_sum) = 0;
  // The gradient of parameter i of the step so far (accumulated when the step had several
  // micro-batches; not divided by anything), read back.
  virtual Tensor gradient(size_t i) = 0;
  // Enqueues the norm and the update, waits, returns the outcome. `host_norm`: the norm computed
  // on the host (distributed runs), else the device's own.
  virtual DeviceStepOutcome update(const DeviceStepPlan& plan, const double* host_norm) = 0;
  // State between the device and the host Optimizer and parameter tensors (checkpoints, exports,
  // evaluation): `moments[i]` are parameter i's moment tensors (m, v) or (momentum).
  virtual void download(const std::vector<Tensor*>& params, const std::vector<std::vector<Tensor*>>& moments) = 0;
  virtual void upload(const std::vector<Tensor*>& params, const std::vector<std::vector<Tensor*>>& moments) = 0;
  // Device memory held by the state (moments, accumulators, tables) plus the runner's peak.
  virtual size_t peak_device_bytes() const = 0;
  // One line on how steps run ("CUDA graphs: ..."), for --verbose; empty when nothing to say.
  virtual std::string notes() const = 0;
};

// The device trainer of a runner: `params` are constants of the program, `grads` its values
// (float32, kept), `loss` its scalar loss (kNoId: none, a pipeline stage before the last); `opt`
// the host optimizer holding the same parameters in the same order (its kind and which take
// weight decay).
Expected<std::unique_ptr<DeviceTrainer>> make_device_trainer(DeviceRunner& runner, const Graph& g, const std::vector<ValueId>& params,
                                                             const std::vector<ValueId>& grads, ValueId loss, const Optimizer& opt);

// --- NCCL -------------------------------------------------------------------------------------

// One NCCL communicator per host group (this rank's groups of its mesh, one per axis, world ranks
// as members; MPI or local threads), bootstrapped over it: the group's first rank makes the NCCL
// unique id and broadcasts it over the host group. Collectives on these groups take device
// pointers and are enqueued on the stream the CUDA executor gives them.
Expected<std::vector<std::unique_ptr<CommGroup>>> make_nccl_groups(const std::vector<CommGroup*>& host_groups, double timeout_s);

// A GPU rank's communication: its device communicator (the Reshard kernels' transfers between
// meshes, ExecOptions::device_comm) and its mesh's groups (one per axis, ExecOptions::groups).
struct DeviceComms {
  std::unique_ptr<Communicator> world;
  std::vector<std::unique_ptr<CommGroup>> groups;
};

// A GPU rank's communication over `host`: NCCL's (make_nccl_groups, and an NcclCommunicator for
// the transfers), or, where `host`'s ranks are threads of this process and the machine has fewer
// GPUs than ranks (ranks then share devices, cuda_select_device taking rank mod count, and NCCL
// refuses two ranks on one device), those of ranks that share devices
// (executor/device_local_comm.h: stream-ordered copies and reductions), one world for the
// process's thread ranks. `why` (when not null) gets which, for --verbose.
// The mesh groups are those of `host_groups` (this rank's host groups, one per mesh axis, world
// ranks as members: a pipeline stage's too), each bootstrapped over its host group.
Expected<DeviceComms> make_device_comms(Communicator* host, const std::vector<CommGroup*>& host_groups, double timeout_s,
                                        std::string* why = nullptr);

}  // namespace oases
