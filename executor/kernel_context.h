// What a CPU kernel sees: the node (attributes), views of its inputs and outputs (dtype, shape and
// a data pointer into the arena, a constant, or a graph input), and the run state (step counter
// for counter-based dropout).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace oases {

class CommGroup;
class Communicator;
struct PlannedReshard;

struct TensorView {
  DType dtype = DType::kUndefined;
  Shape shape;
  void* data = nullptr;
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool defined() const { return dtype != DType::kUndefined; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Per-run state shared by all kernels of a program.
struct RunState {
  uint64_t seed = 0;      // base seed of random ops
  uint64_t step = 0;      // training step (dropout masks are keyed by seed, step, node and chunk)
  uint64_t chunk = 0;     // micro-batch chunk being executed
  bool training = false;  // dropout active
};

struct KernelContext {
  const Graph* graph = nullptr;
  const Node* node = nullptr;
  std::vector<TensorView> in, out;
  RunState* state = nullptr;
  // Communication groups of this rank, one per mesh axis (empty on a single rank).
  const std::vector<CommGroup*>* groups = nullptr;
  // This rank's communicator, for traffic between meshes (Reshard); null on a single rank.
  Communicator* comm = nullptr;
  // A Reshard node's transfer plan (planner/reshard_nodes.h), made when the program was built.
  const PlannedReshard* reshard = nullptr;

  const AttrMap& attrs() const { return node->attrs; }
  // The group of mesh axis `a`; throws naming the node when the program runs without one.
  CommGroup& group(int64_t a) const;
  bool has_input(int i) const { return i < static_cast<int>(in.size()) && in[i].data != nullptr; }
  // Throws OasesError naming the node.
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw OasesError(node->describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
};

// Key of a dropout node's random stream for the current step and chunk (counter-based: the same
// key gives the same mask, so recomputation replays it).
uint64_t dropout_key(const RunState& s, const std::string& node_name);

using CpuKernelFn = std::function<void(KernelContext&)>;

class CpuKernelRegistry {
 public:
  static const CpuKernelRegistry& global();
  void add(const std::string& domain, const std::string& op, CpuKernelFn fn);
  const CpuKernelFn* find(const std::string& domain, const std::string& op) const;
  std::vector<std::string> ops() const;

 private:
  std::map<std::pair<std::string, std::string>, CpuKernelFn> fns_;
};

// One function per family file in executor/cpu/.
void register_cpu_elementwise(CpuKernelRegistry& r);
void register_cpu_layout(CpuKernelRegistry& r);
void register_cpu_nn(CpuKernelRegistry& r);
void register_cpu_collectives(CpuKernelRegistry& r);
void register_cpu_fused(CpuKernelRegistry& r);  // the executor's own fused ops (graph/passes/fusion.h)
// The kernels programs are bound to (executor/executor.cpp compile_program): the CPU kernels above
// and the executor's own, which need its communicators (oases.Reshard, executor/reshard_runner.cpp).
const CpuKernelRegistry& program_kernels();
void register_reshard(CpuKernelRegistry& r);

}  // namespace oases
