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

// Examples of an op (OpSchema::examples) made once, at registration, for the registry-driven tests.
std::function<std::vector<OpExample>()> examples_of(std::vector<OpExample> examples);
// One example: its name, inputs, attributes and output count.
OpExample example(std::string name, std::vector<ExampleInput> inputs, AttrMap attrs = {}, int outputs = 1);

// Partition lowering rules shared by a forward op and its gradient op (graph/lowering.h).
Status lower_slice_lengths(LowerContext& c, bool grad);              // Slice, oases.SliceGrad
Status lower_dropout_mask(LowerContext& c);                          // Dropout, oases.DropoutGrad
Status lower_cross_entropy(LowerContext& c, bool nll);               // vocabulary-parallel loss
Status lower_cross_entropy_grad(LowerContext& c, bool nll);          // and its gradient
Status lower_attention_kv_heads(LowerContext& c, int q, bool grad);  // Attention, AttentionGrad: tp > key/value heads

}  // namespace oases::ops
