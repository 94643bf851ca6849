// The CPU kernels as a library of their own (CMake target oases_cpu_kernels): the kernel registry
// over executor/cpu/* and an evaluator that runs single nodes with them, which constant folding
// at import uses. Tools that only import and plan (oases-plan) link this, not the executor.
#pragma once

#include <vector>

#include "executor/kernel_context.h"
#include "graph/evaluator.h"
#include "graph/graph.h"

namespace oases {

// Runs single nodes with the CPU kernels (constant folding).
class CpuEvaluator : public Evaluator {
 public:
  Expected<std::vector<Tensor>> evaluate(const Graph& g, const Node& node, const std::vector<Tensor>& inputs) const override;
};

}  // namespace oases
