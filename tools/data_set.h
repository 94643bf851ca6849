// Running a model on a data set in the ONNX test-data layout (input_N.pb / output_N.pb), shared by
// oases-run and the conformance runner: reading the tensors, matching them to the model's inputs,
// loading the model with its input shapes bound from the data (specialising it to the values of
// small integer inputs when shapes depend on them), and comparing outputs with a tolerance.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tools/model_loader.h"

namespace oases {

// Paths of DIR/PREFIX_N.pb in N order (prefix "input" or "output").
std::vector<std::string> numbered_files(const std::string& dir, const std::string& prefix);
// The tensors of those files with the names they carry.
Expected<std::vector<std::pair<std::string, Tensor>>> read_numbered_tensors(const std::string& dir, const std::string& prefix);

// Matches data-set tensors to the inputs of `model` by name, else by position; every model input
// must be given. Errors name the data set and the input.
Expected<std::map<std::string, Tensor>> match_model_inputs(const std::string& model,
                                                           const std::vector<std::pair<std::string, Tensor>>& given,
                                                           const std::string& data_set, const ImportOptions& opts = {});

struct FedModel {
  LoadedModel model;
  bool specialised = false;  // small integer inputs were folded in as constants
};

// load_model with each input's shape bound from `feeds` (bindings already in `opts` win). When the
// model does not load as is, because shapes depend on the values of inputs (Reshape shapes, Range
// limits, TopK's k, OneHot's depth, ...), the small integer inputs (at most 64 elements) and the
// single-element ones become constants and the model is specialised to them; `feeds` then keeps
// only what is still a graph input. The error is the first load's.
Expected<FedModel> load_model_for_feeds(const std::string& path, ImportOptions opts, std::map<std::string, Tensor>* feeds);

// Element-wise comparison of an output with its expected value: |got - want| <= atol + rtol·|want|
// for floating types (NaNs and infinities of one sign match themselves), exact equality for
// integer and bool types. A dtype or shape difference is a `problem`.
struct TensorComparison {
  double max_abs = 0, max_rel = 0;
  int64_t bad = 0;         // elements outside the tolerance
  int64_t first_bad = -1;  // flat index of the first one
  std::string problem;     // dtype or shape mismatch
  bool ok() const { return problem.empty() && bad == 0; }
};
TensorComparison compare_tensors(const Tensor& got, const Tensor& want, double rtol, double atol);

}  // namespace oases
