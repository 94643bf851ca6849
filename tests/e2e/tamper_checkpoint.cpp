// oases_tamper_checkpoint IN OUT DAMAGE: writes a copy of checkpoint IN with one kind of damage, for
// tests/e2e/test_checkpoint_integrity.sh (each must make `oases-train --resume OUT` exit 2 with a
// one-line error). DAMAGE:
//   flip-data flip-offset flip-sampler flip-step  one bit flipped (data, first offset, sampler
//                                                  state, step), nothing resealed
//   truncate                                       the last byte cut
//   negative-step not-object                       header edited and its checksum resealed
//   moment-size moment-missing                     a parameter's first optimizer moment one
//                                                  element short, or gone (a valid file)
//   v1                                             the old layout without checksums (loads)
// or `oases_tamper_checkpoint - OUT tiny` writes a valid checkpoint of a few bytes (fuzz seeds).
#include <cstdio>
#include <string>

#include "executor/checkpoint.h"
#include "tests/common/checkpoint_tamper.h"
#include "tests/common/onnx_builder.h"

using namespace oases;
using testutil::CheckpointBytes;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s IN OUT DAMAGE\n", argv[0]);
    return 2;
  }
  const std::string in = argv[1], out = argv[2], damage = argv[3];
  if (damage == "tiny") {
    Checkpoint c;
    c.fingerprint = "tiny";
    c.step = 3;
    c.optimizer_t = 3;
    c.optimizer_kind = "adamw";
    c.sampler_state = "1 2 3";
    c.tensors["w"] = Tensor::from_f32({1.5f, -2.f, 0.25f, 4.f}, {2, 2});
    c.tensors["w.m"] = Tensor::from_f32({0.1f, 0.2f, 0.3f, 0.4f}, {2, 2});
    c.tensors["w.v"] = Tensor::from_f32({0.01f, 0.02f, 0.03f, 0.04f}, {2, 2});
    c.tensors["ids"] = Tensor::from_int64({7, -1}, {2});
    Status st = save_checkpoint(c, out);
    if (!st.is_ok()) std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return st.is_ok() ? 0 : 2;
  }
  try {
    std::string bytes = testutil::read_bytes(in);
    CheckpointBytes ck = CheckpointBytes::parse(bytes);
    auto flip_after = [&](const std::string& key) {
      size_t at = ck.header.find(key);
      if (at == std::string::npos) throw std::runtime_error("no " + key + " in the header");
      size_t pos = CheckpointBytes::kHeaderStart + at + key.size();
      bytes[pos] = static_cast<char>(bytes[pos] ^ 0x01);
    };
    if (damage == "flip-data") {
      size_t pos = ck.data_start() + ck.data.size() / 2;
      bytes[pos] = static_cast<char>(bytes[pos] ^ 0x01);
    } else if (damage == "flip-offset") {
      flip_after("\"offset\":");
    } else if (damage == "flip-sampler") {
      flip_after("\"sampler_state\":\"");
    } else if (damage == "flip-step") {
      flip_after("\"step\":");
    } else if (damage == "truncate") {
      bytes.pop_back();
    } else if (damage == "negative-step") {
      size_t at = ck.header.find("\"step\":");
      ck.header.insert(at + 7, "-");
      ck.reseal();
      bytes = ck.bytes();
    } else if (damage == "not-object") {
      ck.header = "[" + ck.header + "]";
      ck.reseal();
      bytes = ck.bytes();
    } else if (damage == "v1") {
      bytes = ck.bytes_v1();
    } else if (damage == "moment-size" || damage == "moment-missing") {
      auto c = load_checkpoint(in);
      if (!c) throw std::runtime_error(c.status().message());
      auto it = c->tensors.begin();
      while (it != c->tensors.end() && !(it->first.size() > 2 && it->first.compare(it->first.size() - 2, 2, ".m") == 0)) ++it;
      if (it == c->tensors.end()) throw std::runtime_error("no '.m' tensor");
      if (damage == "moment-missing") {
        c->tensors.erase(it);
      } else {
        std::vector<float> v(it->second.data<float>(), it->second.data<float>() + it->second.numel() - 1);
        it->second = Tensor::from_f32(v, {static_cast<int64_t>(v.size())});
      }
      Status st = save_checkpoint(*c, out);
      if (!st.is_ok()) throw std::runtime_error(st.message());
      return 0;
    } else {
      std::fprintf(stderr, "unknown damage '%s'\n", damage.c_str());
      return 2;
    }
    testutil::write_bytes(out, bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
