#include "importer/onnx_export.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <onnx/onnx_pb.h>

#include "graph/atomic_file.h"
#include "importer/onnx_import.h"

namespace fs = std::filesystem;

namespace oases {

namespace {
constexpr uint64_t kInlineLimit = uint64_t{1800} << 20;  // leave room under protobuf's 2 GiB
}

Status export_with_initializers(const std::string& source_model, const std::map<std::string, Tensor>& values, const std::string& out_path) {
  onnx::ModelProto model;
  OASES_RETURN_IF_ERROR(read_model_proto(source_model, &model));
  std::string src_dir = fs::path(source_model).parent_path().string();
  if (src_dir.empty()) src_dir = ".";
  onnx::GraphProto* g = model.mutable_graph();
  std::set<std::string> replaced;
  uint64_t total = 0;
  // First materialise every initializer (new values, or the source's own data) as a Tensor.
  std::vector<Tensor> data(static_cast<size_t>(g->initializer_size()));
  for (int i = 0; i < g->initializer_size(); ++i) {
    const onnx::TensorProto& tp = g->initializer(i);
    auto it = values.find(tp.name());
    if (it != values.end()) {
      Shape want(tp.dims().begin(), tp.dims().end());
      const Shape& have = it->second.shape();
      bool same_type = dtype_to_onnx(it->second.dtype()) == tp.data_type();
      if (same_type && !want.empty() && have.size() == want.size() && have[0] == 1 && want[0] > 1 &&
          std::equal(have.begin() + 1, have.end(), want.begin() + 1)) {
        // a token the file holds once per row of its static batch (graph/passes/unfold_batch_copies.cpp):
        // written back as that many copies, so the file's graph is unchanged
        Tensor copies(it->second.dtype(), want);
        for (int64_t b = 0; b < want[0]; ++b) {
          std::memcpy(static_cast<char*>(copies.raw_mutable()) + static_cast<size_t>(b) * it->second.nbytes(), it->second.raw(),
                      it->second.nbytes());
        }
        data[i] = copies;
        replaced.insert(tp.name());
        total += data[i].nbytes();
        continue;
      }
      if (have != want || !same_type) {
        return error("{}: initializer '{}' is {}{} in the model but {}{} in the trained weights", source_model, tp.name(),
                     dtype_name(dtype_from_onnx(tp.data_type())), shape_str(want), dtype_name(it->second.dtype()),
                     shape_str(it->second.shape()));
      }
      data[i] = it->second;
      replaced.insert(tp.name());
    } else {
      OASES_ASSIGN_OR_RETURN(data[i], tensor_from_proto(tp, src_dir, source_model + ": initializer '" + tp.name() + "'"));
    }
    total += data[i].nbytes();
  }
  for (const auto& [name, t] : values) {
    if (!replaced.count(name)) return error("{}: the model has no initializer '{}'", source_model, name);
  }
  bool external = total > kInlineLimit;
  std::string data_name = fs::path(out_path).filename().string() + ".data";
  std::string data_path = (fs::path(out_path).parent_path() / data_name).string();
  std::optional<AtomicFile> ext;
  if (external) {
    OASES_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(data_path));
    ext.emplace(std::move(f));
  }
  uint64_t offset = 0;
  for (int i = 0; i < g->initializer_size(); ++i) {
    onnx::TensorProto* tp = g->mutable_initializer(i);
    std::string name = tp->name();
    tensor_to_proto(data[i], name, tp);
    if (external) {
      OASES_RETURN_IF_ERROR(ext->write(data[i].raw(), data[i].nbytes()));
      tp->clear_raw_data();
      tp->set_data_location(onnx::TensorProto::EXTERNAL);
      auto add = [&](const std::string& k, const std::string& v) {
        auto* e = tp->add_external_data();
        e->set_key(k);
        e->set_value(v);
      };
      add("location", data_name);
      add("offset", std::to_string(offset));
      add("length", std::to_string(data[i].nbytes()));
      offset += data[i].nbytes();
    }
  }
  if (ext) OASES_RETURN_IF_ERROR(ext->commit());
  std::string bytes;
  if (!model.SerializeToString(&bytes)) return error("{}: serialisation failed", out_path);
  return write_file_atomically(out_path, bytes);
}

}  // namespace oases
