// Which float initializers of a model are trained (parameters) and which are held fixed (buffers).
//
// An ONNX file does not say: exporters store both as initializers. PyTorch's TorchScript exporter
// keeps module paths for parameters it stores as they are ("model.layers.0.mlp.up_proj.weight") and
// names the ones it transformed ("onnx::MatMul_702": a transposed weight); the dynamo exporter keeps
// paths too, but names transposed weights "val_110" and stores buffers it folded (rotary cos/sin
// tables, ALiBi slopes, causal masks, fill values) under generated names ("unsqueeze_14", "full").
// The rule, in order:
//   1. An initializer named like a module path (dotted identifiers) is a parameter, unless its last
//      component is a buffer's (inv_freq, *_cached, *mask*, position_ids, slopes, embed_scale, ...).
//   2. Any other (a generated name) is a parameter when something reads it as a weight: a MatMul,
//      Gemm or Conv operand beside a non-constant one; a Gather table read with non-constant
//      indices (an embedding); a normalisation's scale or bias; a per-channel (1-D along the last
//      axis) scale or shift of an activation (an unfused norm's weight, a projection's bias); a
//      table added to a token embedding (a position embedding the exporter sliced to the sequence);
//      a token concatenated with activations along a non-batch axis (ViT's class token).
//      Reads through Transpose, Reshape, (Un)Squeeze, Flatten, Cast, Identity and Expand count as
//      reads of the initializer itself.
//   3. Everything else is a buffer: scalars, and tables read only as masks, rotary factors or
//      position-derived terms.
// Both exporters' files of one model thus give the parameters PyTorch trains (tests/e2e checks the
// count against PyTorch's). --train / --freeze regexes (apply_parameter_overrides) override it.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace oases {

struct InitializerRole {
  ValueId value = kNoId;
  bool trainable = false;
  std::string reason;  // one line, e.g. "weight of [MatMul] node '/q_proj/MatMul'"
};

// One entry per floating-point initializer of `g`, in g.initializers() order.
std::vector<InitializerRole> classify_initializers(const Graph& g);

// --train REGEX makes matching initializers parameters, --freeze REGEX buffers (freeze wins);
// ECMAScript regexes searched in the name. An invalid regex is an error naming the flag.
Status apply_parameter_overrides(const Graph& g, std::vector<InitializerRole>& roles, const std::string& train_regex,
                                 const std::string& freeze_regex);

// "N parameters (E elements), M buffers (F elements)" and one line per buffer:
// "  buffer 'NAME': float32[1, 1, 16, 8]: REASON".
std::vector<std::string> describe_parameter_split(const Graph& g, const std::vector<InitializerRole>& roles);

}  // namespace oases
