#include "executor/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "executor/distributed.h"
#include "executor/training.h"

namespace oases {

namespace {
constexpr char kMagic[8] = {'O', 'A', 'S', 'E', 'S', 'C', 'K', '1'};
constexpr uint64_t kMaxHeader = uint64_t{1} << 30;
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
  nlohmann::json h;
  h["format"] = "oases-checkpoint";
  h["version"] = 1;
  h["fingerprint"] = c.fingerprint;
  h["step"] = c.step;
  h["optimizer"] = {{"kind", c.optimizer_kind}, {"t", c.optimizer_t}};
  h["sampler_state"] = c.sampler_state;
  h["seed"] = c.seed;
  h["extra"] = nlohmann::json::parse(c.extra_json, nullptr, false);
  uint64_t offset = 0;
  for (const auto& [name, t] : c.tensors) {
    h["tensors"].push_back({{"name", name},
                            {"dtype", dtype_name(t.dtype())},
                            {"onnx_type", dtype_to_onnx(t.dtype())},
                            {"shape", t.shape()},
                            {"offset", offset},
                            {"bytes", t.nbytes()}});
    offset += t.nbytes();
  }
  std::string header = h.dump();
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return error("{}: cannot open for writing", tmp);
  uint64_t hl = header.size();
  bool ok = std::fwrite(kMagic, 1, 8, f) == 8 && std::fwrite(&hl, 8, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& [name, t] : c.tensors) {
    if (!ok) break;
    ok = t.nbytes() == 0 || std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return error("{}: writing the checkpoint failed (disk full?)", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return error("{}: cannot rename {} over it", path, tmp);
  return Status::ok();
}

Expected<Checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: no such checkpoint", path);
  char magic[8];
  uint64_t hl = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&hl), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) return error("{}: not an Oases checkpoint", path);
  if (hl > kMaxHeader) return error("{}: corrupt checkpoint header", path);
  std::string header(static_cast<size_t>(hl), '\0');
  in.read(header.data(), static_cast<std::streamsize>(hl));
  if (!in) return error("{}: truncated checkpoint", path);
  nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
  if (h.is_discarded() || h.value("format", "") != "oases-checkpoint") return error("{}: corrupt checkpoint header", path);
  Checkpoint c;
  try {
    c.fingerprint = h.at("fingerprint").get<std::string>();
    c.step = h.at("step").get<int64_t>();
    c.optimizer_kind = h.at("optimizer").at("kind").get<std::string>();
    c.optimizer_t = h.at("optimizer").at("t").get<int64_t>();
    c.sampler_state = h.value("sampler_state", "");
    c.seed = h.value("seed", uint64_t{0});
    c.extra_json = h.contains("extra") ? h["extra"].dump() : "{}";
    uint64_t base = 16 + hl;
    for (const auto& e : h.value("tensors", nlohmann::json::array())) {
      DType dt = dtype_from_onnx(e.at("onnx_type").get<int>());
      Shape s = e.at("shape").get<Shape>();
      uint64_t bytes = e.at("bytes").get<uint64_t>();
      if (dt == DType::kUndefined || static_cast<uint64_t>(shape_numel(s)) * dtype_size(dt) != bytes || bytes > kMaxTensorBytes) {
        return error("{}: corrupt tensor entry '{}'", path, e.at("name").get<std::string>());
      }
      Tensor t(dt, s);
      in.seekg(static_cast<std::streamoff>(base + e.at("offset").get<uint64_t>()));
      in.read(static_cast<char*>(t.raw_mutable()), static_cast<std::streamsize>(bytes));
      if (!in) return error("{}: truncated checkpoint (tensor '{}')", path, e.at("name").get<std::string>());
      c.tensors[e.at("name").get<std::string>()] = t;
    }
  } catch (const nlohmann::json::exception& e) {
    return error("{}: corrupt checkpoint header: {}", path, e.what());
  }
  return c;
}

std::map<std::string, Tensor> gather_training_state(Trainer& tr, RankRuntime& rt, const std::vector<ShardingSpec>& specs,
                                                    const std::vector<Shape>& shapes, bool with_optimizer) {
  std::map<std::string, Tensor> full;
  auto local = tr.parameters();
  std::map<std::string, Tensor> state;
  if (with_optimizer) state = tr.optimizer().state();
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
  std::map<std::string, Tensor> opt_state;
  for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
    std::string name = tr.param_name(i);
    auto it = ck.tensors.find(name);
    if (it == ck.tensors.end() || it->second.shape() != shapes[i]) return error("{}: parameter '{}' is missing", path, name);
    Tensor local = slice_for_rank(it->second, specs[i], rt.mesh(), rt.rank());
    std::memcpy(params.at(name).raw_mutable(), local.raw(), local.nbytes());
    for (const char* suffix : kOptimizerStateSuffixes) {
      auto st = ck.tensors.find(name + suffix);
      if (st != ck.tensors.end()) opt_state[name + suffix] = slice_for_rank(st->second, specs[i], rt.mesh(), rt.rank());
    }
  }
  tr.optimizer().set_state(opt_state, ck.optimizer_t);
  return Status::ok();
}

}  // namespace oases
