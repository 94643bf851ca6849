// Graph weights -> ONNX: writes the original model file with some initializers replaced (the
// trained parameters), everything else untouched. Initializers end up inline, or, when the model
// would pass protobuf's 2 GiB limit, in one external-data file OUT.data beside it.
#pragma once

#include <map>
#include <string>

#include "graph/tensor.h"

namespace oases {

Status export_with_initializers(const std::string& source_model, const std::map<std::string, Tensor>& values, const std::string& out_path);

}  // namespace oases
