#include "executor/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <boost/crc.hpp>
#include <nlohmann/json.hpp>

#include "executor/distributed.h"
#include "executor/training.h"
#include "graph/atomic_file.h"

namespace oases {

namespace {

// Version 2 ("OASESCK2") adds the header checksum after the length and a checksum per tensor;
// version 1 ("OASESCK1") files have neither and still load, with CheckpointWarning set.
constexpr char kMagicV1[8] = {'O', 'A', 'S', 'E', 'S', 'C', 'K', '1'};
constexpr char kMagicV2[8] = {'O', 'A', 'S', 'E', 'S', 'C', 'K', '2'};
constexpr uint64_t kMaxHeader = uint64_t{1} << 30;

using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

// What a tensor's checksum covers besides its bytes: a flipped shape, dtype or offset in the
// header is caught by the tensor's own checksum as well as by the header's.
std::string tensor_metadata(const std::string& name, DType dt, const Shape& shape, uint64_t offset, uint64_t bytes) {
  return fmt::format("{}\n{}\n{}\n{}\n{}", name, dtype_name(dt), shape_str(shape), offset, bytes);
}

uint32_t tensor_crc(const std::string& metadata, const void* data, size_t bytes) {
  Crc32c crc;
  crc.process_bytes(metadata.data(), metadata.size());
  crc.process_bytes(data, bytes);
  return crc.checksum();
}

uint32_t header_crc(uint64_t length, const std::string& header) {
  Crc32c crc;
  crc.process_bytes(&length, sizeof length);
  crc.process_bytes(header.data(), header.size());
  return crc.checksum();
}

// Deepest nesting of arrays and objects in JSON text: refused past a bound before nlohmann
// (whose dump() recurses) sees a hostile header of a million '['.
int64_t json_depth(const std::string& text) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}
constexpr int64_t kMaxHeaderDepth = 64;

bool known_optimizer(const std::string& kind) {
  return kind == "adamw" || kind == "sgd";
}

std::vector<const char*> state_suffixes(const std::string& optimizer_kind) {
  if (optimizer_kind == "adamw") return {".m", ".v"};
  return {".momentum"};
}

}  // namespace

Status save_checkpoint(const Checkpoint& c, const std::string& path) {
  // a diverged run must not replace the last good checkpoint with NaN weights or moments
  for (const auto& [name, t] : c.tensors) {
    if (t.dtype() != DType::kF32) continue;
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(p[i])) return error("{}: not written: tensor '{}' holds a non-finite value ({})", path, name, p[i]);
    }
  }
  if (c.step < 0 || c.optimizer_t < 0) return error("{}: not written: negative step {} or optimizer step {}", path, c.step, c.optimizer_t);
  nlohmann::json h;
  h["format"] = "oases-checkpoint";
  h["version"] = 2;
  h["fingerprint"] = c.fingerprint;
  h["step"] = c.step;
  h["optimizer"] = {{"kind", c.optimizer_kind}, {"t", c.optimizer_t}};
  h["sampler_state"] = c.sampler_state;
  h["seed"] = c.seed;
  h["extra"] = nlohmann::json::parse(c.extra_json, nullptr, false);
  if (h["extra"].is_discarded()) h["extra"] = c.extra_json;  // not JSON: kept as text
  h["tensors"] = nlohmann::json::array();
  uint64_t offset = 0;
  for (const auto& [name, t] : c.tensors) {
    uint64_t bytes = t.nbytes();
    h["tensors"].push_back({{"name", name},
                            {"dtype", dtype_name(t.dtype())},
                            {"onnx_type", dtype_to_onnx(t.dtype())},
                            {"shape", t.shape()},
                            {"offset", offset},
                            {"bytes", bytes},
                            {"crc32c", tensor_crc(tensor_metadata(name, t.dtype(), t.shape(), offset, bytes), t.raw(), bytes)}});
    offset += bytes;
  }
  std::string header = h.dump();
  uint64_t hl = header.size();
  uint32_t hcrc = header_crc(hl, header);
  OASES_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  OASES_RETURN_IF_ERROR(f.write(kMagicV2, 8));
  OASES_RETURN_IF_ERROR(f.write(&hl, 8));
  OASES_RETURN_IF_ERROR(f.write(&hcrc, 4));
  OASES_RETURN_IF_ERROR(f.write(header));
  for (const auto& [name, t] : c.tensors) OASES_RETURN_IF_ERROR(f.write(t.raw(), t.nbytes()));
  return f.commit();
}

namespace {

// Reads and checks the header's fields (every one: a checkpoint is input like any other file).
// Errors are one line: "<path>: <field>: <what is wrong>".
class HeaderReader {
 public:
  explicit HeaderReader(const std::string& path) : path_(path) {}

  Expected<const nlohmann::json*> field(const nlohmann::json& obj, const char* key, const std::string& where) {
    auto it = obj.find(key);
    if (it == obj.end()) return error("{}: corrupt checkpoint header: {}'{}' is missing", path_, where, key);
    return &*it;
  }
  Expected<std::string> string_field(const nlohmann::json& obj, const char* key, const std::string& where = "") {
    OASES_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, key, where));
    if (!v->is_string()) return error("{}: corrupt checkpoint header: {}'{}' is not a string", path_, where, key);
    return v->get<std::string>();
  }
  // An integer in [0, 2^63).
  Expected<int64_t> count_field(const nlohmann::json& obj, const char* key, const std::string& where = "") {
    OASES_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, key, where));
    if (v->is_number_integer() && !v->is_number_unsigned() && v->get<int64_t>() < 0) {
      return error("{}: corrupt checkpoint header: {}'{}' is {} (must be >= 0)", path_, where, key, v->get<int64_t>());
    }
    if (!v->is_number_integer() || v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return error("{}: corrupt checkpoint header: {}'{}' is {} (not a count)", path_, where, key, v->dump());
    }
    return v->get<int64_t>();
  }

 private:
  const std::string& path_;
};

}  // namespace

namespace {
constexpr char kStageManifestMagic[] = "OASESPP1";  // 8 bytes, then a newline and the JSON manifest
Expected<Checkpoint> load_checkpoint_file(const std::string& path, bool manifest_ok);
}  // namespace

std::string stage_checkpoint_path(const std::string& path, int stage, int stages) {
  return fmt::format("{}.stage{}-of-{}", path, stage, stages);
}

Status save_stage_manifest(const std::string& path, int stages, int64_t step, const std::string& fingerprint, int64_t save_id) {
  nlohmann::json m{{"format", "oases-pipeline-checkpoint"}, {"version", 1},           {"stages", stages},
                   {"step", step},                        {"fingerprint", fingerprint}, {"save_id", save_id}};
  m["files"] = nlohmann::json::array();
  for (int s = 0; s < stages; ++s) m["files"].push_back(std::filesystem::path(stage_checkpoint_path(path, s, stages)).filename().string());
  return write_file_atomically(path, std::string(kStageManifestMagic) + "\n" + m.dump(2) + "\n");
}

namespace {

// A pipeline run's checkpoint: the manifest's stage files (regular checkpoints beside it, each
// with its stage's tensors) merged into one.
Expected<Checkpoint> load_stage_checkpoints(const std::string& path, const std::string& text) {
  nlohmann::json m = nlohmann::json::parse(text.substr(8), nullptr, false);
  if (m.is_discarded() || !m.is_object() || m.value("format", "") != "oases-pipeline-checkpoint" || !m.contains("files") ||
      !m["files"].is_array() || m["files"].empty())
    return error("{}: a damaged pipeline checkpoint manifest", path);
  const int64_t step = m.value("step", int64_t{-1});
  const std::string fingerprint = m.value("fingerprint", "");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  Checkpoint merged;
  for (size_t stage = 0; stage < m["files"].size(); ++stage) {
    const nlohmann::json& f = m["files"][stage];
    if (!f.is_string()) return error("{}: a damaged pipeline checkpoint manifest", path);
    std::string name = f.get<std::string>();
    // stage files live beside the manifest: a name is never a path
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return error("{}: stage file '{}' is not a file name beside the manifest", path, name);
    std::string stage_path = (dir / name).string();
    auto ck = load_checkpoint_file(stage_path, /*manifest_ok=*/false);
    if (!ck) return ck.status().with_context(path);
    nlohmann::json extra = nlohmann::json::parse(ck->extra_json, nullptr, false);
    bool same_save = extra.is_object() && extra.value("pipeline_save", int64_t{-1}) == m.value("save_id", int64_t{-2}) &&
                     extra.value("stage", -1) == static_cast<int>(stage);
    if (ck->step != step || ck->fingerprint != fingerprint || !same_save)
      return error("{}: {} is not this save's stage file (another save's, or another stage's)", path, stage_path);
    std::map<std::string, Tensor> tensors = std::move(ck->tensors);
    if (stage == 0) merged = std::move(*ck);  // step, optimizer, sampler and seed: stage 0's
    for (auto& [tname, t] : tensors) {
      auto [it, fresh] = merged.tensors.emplace(tname, t);
      if (!fresh) return error("{}: tensor '{}' is in two stage files", path, tname);
    }
    if (!ck->warning.empty()) merged.warning = ck->warning;
  }
  return merged;
}

}  // namespace

Expected<Checkpoint> load_checkpoint(const std::string& path) {
  return load_checkpoint_file(path, /*manifest_ok=*/true);
}

namespace {

Expected<Checkpoint> load_checkpoint_file(const std::string& path, bool manifest_ok) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return error("{}: is a folder, not a checkpoint", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: no such checkpoint", path);
  {
    char head[8] = {0};
    in.read(head, 8);
    if (in && std::memcmp(head, kStageManifestMagic, 8) == 0) {
      // a stage file is a checkpoint, never another manifest (which could name itself)
      if (!manifest_ok) return error("{}: a pipeline manifest where a stage's checkpoint file belongs", path);
      in.seekg(0, std::ios::end);
      if (in.tellg() > (1 << 20)) return error("{}: a pipeline checkpoint manifest over 1 MiB", path);
      in.seekg(0);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return load_stage_checkpoints(path, text);
    }
    in.clear();
    in.seekg(0);
  }
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  char magic[8];
  uint64_t hl = 0;
  in.read(magic, 8);
  if (!in || (std::memcmp(magic, kMagicV1, 8) != 0 && std::memcmp(magic, kMagicV2, 8) != 0)) {
    return error("{}: not an Oases checkpoint", path);
  }
  const bool v1 = std::memcmp(magic, kMagicV1, 8) == 0;
  const uint64_t prefix = v1 ? 16 : 20;
  in.read(reinterpret_cast<char*>(&hl), 8);
  uint32_t stored_hcrc = 0;
  if (!v1) in.read(reinterpret_cast<char*>(&stored_hcrc), 4);
  if (!in) return error("{}: truncated checkpoint (in the header length)", path);
  if (hl > kMaxHeader || hl > file_size - prefix) {
    return error("{}: corrupt or truncated checkpoint: the header length {} exceeds the file ({} bytes)", path, hl, file_size);
  }
  std::string header(static_cast<size_t>(hl), '\0');
  in.read(header.data(), static_cast<std::streamsize>(hl));
  if (!in) return error("{}: truncated checkpoint (in the header)", path);
  if (!v1 && header_crc(hl, header) != stored_hcrc) {
    return error("{}: corrupt checkpoint: the header's checksum does not match (step, sampler state or tensor table damaged)", path);
  }
  if (int64_t depth = json_depth(header); depth > kMaxHeaderDepth) {
    return error("{}: corrupt checkpoint header: nested {} levels deep (at most {})", path, depth, kMaxHeaderDepth);
  }
  nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
  if (h.is_discarded()) return error("{}: corrupt checkpoint header: not JSON", path);
  if (!h.is_object()) return error("{}: corrupt checkpoint header: a JSON {}, not an object", path, h.type_name());
  HeaderReader r(path);
  OASES_ASSIGN_OR_RETURN(std::string format, r.string_field(h, "format"));
  if (format != "oases-checkpoint") return error("{}: corrupt checkpoint header: format '{}', not 'oases-checkpoint'", path, format);
  OASES_ASSIGN_OR_RETURN(int64_t version, r.count_field(h, "version"));
  if (version != (v1 ? 1 : 2)) return error("{}: corrupt checkpoint header: version {} in a version {} file", path, version, v1 ? 1 : 2);

  Checkpoint c;
  if (v1) {
    c.warning = fmt::format("{}: format version 1 carries no checksums: its integrity cannot be verified (save again to upgrade it)", path);
  }
  OASES_ASSIGN_OR_RETURN(c.fingerprint, r.string_field(h, "fingerprint"));
  OASES_ASSIGN_OR_RETURN(c.step, r.count_field(h, "step"));
  OASES_ASSIGN_OR_RETURN(const nlohmann::json* opt, r.field(h, "optimizer", ""));
  if (!opt->is_object()) return error("{}: corrupt checkpoint header: 'optimizer' is not an object", path);
  OASES_ASSIGN_OR_RETURN(c.optimizer_kind, r.string_field(*opt, "kind", "optimizer."));
  if (!known_optimizer(c.optimizer_kind)) {
    return error("{}: corrupt checkpoint header: optimizer.'kind' is '{}' (adamw or sgd)", path, c.optimizer_kind);
  }
  OASES_ASSIGN_OR_RETURN(c.optimizer_t, r.count_field(*opt, "t", "optimizer."));
  if (h.contains("sampler_state")) {
    OASES_ASSIGN_OR_RETURN(c.sampler_state, r.string_field(h, "sampler_state"));
  }
  if (h.contains("seed")) {
    if (!h["seed"].is_number_unsigned())
      return error("{}: corrupt checkpoint header: 'seed' is {} (not a 64-bit seed)", path, h["seed"].dump());
    c.seed = h["seed"].get<uint64_t>();
  }
  c.extra_json = h.contains("extra") ? h["extra"].dump() : "{}";

  const uint64_t base = prefix + hl;
  const uint64_t data_bytes = file_size - base;
  OASES_ASSIGN_OR_RETURN(const nlohmann::json* table, r.field(h, "tensors", ""));
  if (!table->is_array()) return error("{}: corrupt checkpoint header: 'tensors' is not an array", path);
  uint64_t expected_offset = 0;
  for (size_t i = 0; i < table->size(); ++i) {
    const nlohmann::json& e = (*table)[i];
    std::string at = fmt::format("tensors[{}].", i);
    if (!e.is_object()) return error("{}: corrupt checkpoint header: {} is not an object", path, at);
    OASES_ASSIGN_OR_RETURN(std::string name, r.string_field(e, "name", at));
    if (name.empty() || c.tensors.count(name))
      return error("{}: corrupt checkpoint header: {}name '{}' is empty or repeated", path, at, name);
    at = fmt::format("tensor '{}': ", name);
    OASES_ASSIGN_OR_RETURN(std::string dtype, r.string_field(e, "dtype", at));
    OASES_ASSIGN_OR_RETURN(int64_t onnx_type, r.count_field(e, "onnx_type", at));
    DType dt = onnx_type > INT32_MAX ? DType::kUndefined : dtype_from_onnx(static_cast<int>(onnx_type));
    if (dt == DType::kUndefined || dtype != dtype_name(dt)) {
      return error("{}: corrupt checkpoint: tensor '{}': dtype '{}' (ONNX type {}) is not a known type", path, name, dtype, onnx_type);
    }
    OASES_ASSIGN_OR_RETURN(const nlohmann::json* shape_json, r.field(e, "shape", at));
    Shape shape;
    bool shape_ok = shape_json->is_array();
    for (size_t d = 0; shape_ok && d < shape_json->size(); ++d) {
      const nlohmann::json& dim = (*shape_json)[d];
      shape_ok = dim.is_number_integer() && (dim.is_number_unsigned() || dim.get<int64_t>() >= 0) &&
                 dim.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
      if (shape_ok) shape.push_back(dim.get<int64_t>());
    }
    std::optional<uint64_t> nbytes = shape_ok ? checked_nbytes(shape, dt) : std::nullopt;
    if (!nbytes) return error("{}: corrupt checkpoint: tensor '{}': shape {} is not a list of sizes >= 0", path, name, shape_json->dump());
    OASES_ASSIGN_OR_RETURN(int64_t bytes, r.count_field(e, "bytes", at));
    if (static_cast<uint64_t>(bytes) != *nbytes) {
      return error("{}: corrupt checkpoint: tensor '{}': {} bytes for a {} {} tensor ({} bytes)", path, name, bytes, dtype,
                   shape_str(shape), *nbytes);
    }
    OASES_ASSIGN_OR_RETURN(int64_t offset, r.count_field(e, "offset", at));
    // the writer lays tensors end to end in table order: anything else is damage
    if (static_cast<uint64_t>(offset) != expected_offset) {
      return error("{}: corrupt checkpoint: tensor '{}': offset {} where the previous tensor ends at {}", path, name, offset,
                   expected_offset);
    }
    if (*nbytes > data_bytes - expected_offset) {
      return error("{}: truncated checkpoint: tensor '{}' ends at byte {} of the data, the file holds {}", path, name,
                   expected_offset + *nbytes, data_bytes);
    }
    if (*nbytes > max_tensor_bytes()) {
      return error("{}: tensor '{}' ({} bytes) exceeds the limit of {} bytes (--max-memory)", path, name, *nbytes, max_tensor_bytes());
    }
    std::optional<uint32_t> stored_crc;
    if (!v1) {
      OASES_ASSIGN_OR_RETURN(int64_t crc, r.count_field(e, "crc32c", at));
      if (crc > UINT32_MAX) return error("{}: corrupt checkpoint header: tensor '{}': crc32c {} is not 32 bits", path, name, crc);
      stored_crc = static_cast<uint32_t>(crc);
    }
    Tensor t(dt, shape);
    if (*nbytes > 0) {
      in.seekg(static_cast<std::streamoff>(base + expected_offset));
      in.read(static_cast<char*>(t.raw_mutable()), static_cast<std::streamsize>(*nbytes));
      if (!in) return error("{}: truncated checkpoint (tensor '{}')", path, name);
    }
    if (stored_crc && tensor_crc(tensor_metadata(name, dt, shape, expected_offset, *nbytes), t.raw(), *nbytes) != *stored_crc) {
      return error("{}: corrupt checkpoint: tensor '{}': its checksum does not match (data or metadata damaged)", path, name);
    }
    if (dt == DType::kF32) {
      const float* p = t.data<float>();
      for (int64_t k = 0; k < t.numel(); ++k) {
        if (!std::isfinite(p[k])) return error("{}: corrupt checkpoint: tensor '{}' holds a non-finite value at element {}", path, name, k);
      }
    }
    c.tensors[name] = std::move(t);
    expected_offset += *nbytes;
  }
  if (expected_offset != data_bytes) {
    return error("{}: corrupt checkpoint: {} bytes after the last tensor (the table accounts for {} of {})", path,
                 data_bytes - expected_offset, expected_offset, data_bytes);
  }
  return c;
}

}  // namespace

std::map<std::string, Tensor> gather_training_state(Trainer& tr, RankRuntime& rt, const std::vector<ShardingSpec>& specs,
                                                    const std::vector<Shape>& shapes, bool with_optimizer) {
  std::map<std::string, Tensor> full;
  auto local = tr.parameters();
  std::map<std::string, Tensor> state;
  if (with_optimizer) state = tr.optimizer_state();
  for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
    std::string name = tr.param_name(i);
    full[name] = rt.gather(local.at(name), specs[i], shapes[i]);
    if (!with_optimizer) continue;
    for (const char* suffix : kOptimizerStateSuffixes) {
      auto it = state.find(name + suffix);
      if (it != state.end()) full[name + suffix] = rt.gather(it->second, specs[i], shapes[i]);
    }
  }
  return full;
}

Status restore_training_state(const Checkpoint& ck, const std::string& path, Trainer& tr, RankRuntime& rt,
                              const std::vector<ShardingSpec>& specs, const std::vector<Shape>& shapes) {
  auto params = tr.parameters();
  // every parameter and all of its optimizer state, each with the model's shape and dtype: a
  // partial state would silently restart the moments of some parameters
  const std::vector<const char*> suffixes = state_suffixes(ck.optimizer_kind);
  for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
    std::string name = tr.param_name(i);
    const Tensor& mine = params.at(name);
    auto it = ck.tensors.find(name);
    if (it == ck.tensors.end()) return error("{}: parameter '{}' is missing", path, name);
    if (it->second.shape() != shapes[i] || it->second.dtype() != mine.dtype()) {
      return error("{}: parameter '{}' is {} {}, the model's is {} {}", path, name, dtype_name(it->second.dtype()),
                   shape_str(it->second.shape()), dtype_name(mine.dtype()), shape_str(shapes[i]));
    }
    for (const char* suffix : suffixes) {
      auto st = ck.tensors.find(name + suffix);
      if (st == ck.tensors.end()) {
        return error("{}: {} optimizer state '{}{}' is missing (the moments would restart from zero)", path, ck.optimizer_kind, name,
                     suffix);
      }
      if (st->second.shape() != shapes[i] || st->second.dtype() != DType::kF32) {
        return error("{}: optimizer state '{}{}' is {} {}, parameter '{}' needs float32 {}", path, name, suffix,
                     dtype_name(st->second.dtype()), shape_str(st->second.shape()), name, shape_str(shapes[i]));
      }
    }
  }
  std::map<std::string, Tensor> opt_state;
  for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
    std::string name = tr.param_name(i);
    Tensor local = slice_for_rank(ck.tensors.at(name), specs[i], rt.mesh(), rt.rank());
    std::memcpy(params.at(name).raw_mutable(), local.raw(), local.nbytes());
    for (const char* suffix : suffixes) {
      opt_state[name + suffix] = slice_for_rank(ck.tensors.at(name + suffix), specs[i], rt.mesh(), rt.rank());
    }
  }
  return tr.set_optimizer_state(opt_state, ck.optimizer_t).with_context(path);
}

}  // namespace oases
