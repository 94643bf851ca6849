// ONNX ModelProto -> Graph. Reads the file (bounded), checks IR version and opsets, binds
// symbolic dimensions, converts initializers (raw_data, typed fields, external data confined to the
// model's folder and loaded lazily), inlines model-local functions, and lists every unsupported
// node at once. The result is the raw graph; graph/passes make it canonical.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace onnx {
class ModelProto;
class TensorProto;
}  // namespace onnx

namespace oases {

struct ImportOptions {
  std::map<std::string, int64_t> dims;        // --dim NAME=N binds a symbolic dimension
  std::map<std::string, Shape> input_shapes;  // --shape INPUT=d0,d1,... fixes an input's shape
  bool require_bound_dims = true;             // unbound symbolic dims are an error naming them
  // Opsets below 13 are an error unless this is set; then a model is read when every op in it is
  // unchanged since (or known here in) its older form (the conformance runner uses this).
  bool allow_older_opsets = false;
};

constexpr int kMinIrVersion = 3;
constexpr int kMaxIrVersion = 10;

// Reads and converts a model file; errors name the file.
Expected<Graph> import_onnx_file(const std::string& path, const ImportOptions& opts = {});
// Converts a parsed model; `base_dir` is where external data lives ("" forbids external data).
Expected<Graph> import_onnx_model(const onnx::ModelProto& model, const std::string& base_dir, const ImportOptions& opts = {});
// Parses a model file into a ModelProto with size limits; errors name the file.
Status read_model_proto(const std::string& path, onnx::ModelProto* model);

// TensorProto -> Tensor. External data is resolved against base_dir (must stay inside it) and
// loaded lazily. `what` names the tensor in messages.
Expected<Tensor> tensor_from_proto(const onnx::TensorProto& tp, const std::string& base_dir, const std::string& what);
// Reads a TensorProto file (the ONNX test-data layout: input_0.pb, output_0.pb); returns its name too.
Expected<std::pair<std::string, Tensor>> read_tensor_file(const std::string& path);
// Tensor -> TensorProto with raw_data.
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* tp);
Status write_tensor_file(const Tensor& t, const std::string& name, const std::string& path);

// Parses "NAME=N" and "INPUT=d0,d1" command-line bindings.
Status parse_dim_binding(const std::string& text, ImportOptions* opts);
Status parse_shape_binding(const std::string& text, ImportOptions* opts);

}  // namespace oases
