// Evaluator: runs one node on constant inputs. graph/ may not call kernels, so passes that fold
// constants receive an Evaluator from the layer that owns the kernels (executor/).
#pragma once

#include <vector>

#include "graph/graph.h"

namespace oases {

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // Output tensors of `node` (whose output values already carry dtype and shape) for `inputs`
  // (kNoId inputs are undefined tensors).
  virtual Expected<std::vector<Tensor>> evaluate(const Graph& g, const Node& node, const std::vector<Tensor>& inputs) const = 0;
};

}  // namespace oases
