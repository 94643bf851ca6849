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
#include "graph/sharding.h"
#include "graph/status.h"

namespace oases {

struct Program;
struct ExecOptions;
struct RunState;

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

// --- NCCL -------------------------------------------------------------------------------------

// One NCCL communicator per group of `mesh` this rank belongs to (one per mesh axis, in axis
// order), bootstrapped over `host` (MPI or local threads): the group's first rank makes the NCCL
// unique id and broadcasts it over the host group. Collectives on these groups take device
// pointers and are enqueued on the stream the CUDA executor gives them.
Expected<std::vector<std::unique_ptr<CommGroup>>> make_nccl_groups(Communicator* host, const Mesh& mesh, int rank, double timeout_s);

}  // namespace oases
