// Helpers shared by the op family files.
#pragma once

#include <fmt/ranges.h>

#include "graph/op_registry.h"

namespace oases::ops {

// Elements and bytes of a node's inputs and outputs, for cost functions.
double io_bytes(const Graph& g, const Node& n);
double out_numel(const Graph& g, const Node& n, int slot = 0);
OpCost elementwise_cost(const Graph& g, const Node& n, double flops_per_element);

// Schema of an op whose output has the shape and dtype of input 0.
OpSchema same_as_input_schema(const std::string& op_type, int min_in, int max_in);
// Output dtype equal to `out` or input 0's when kUndefined, shape = broadcast of all inputs.
Status infer_broadcast(InferContext& c, DType out = DType::kUndefined);

}  // namespace oases::ops
