// Checkpoint files (executor/checkpoint.h): a save then a load gives back every tensor bit for bit,
// the step, the optimizer state and the sampler's position; truncated or foreign files are errors
// that name the file, never a crash.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "executor/checkpoint.h"
#include "tests/common/onnx_builder.h"

namespace oases {
namespace {

using testutil::TempDir;

Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.fingerprint = "gpt2_bytes:tp2";
  c.step = 17;
  c.optimizer_t = 17;
  c.optimizer_kind = "adamw";
  c.sampler_state = "{\"epoch\":1,\"position\":4096,\"rng\":\"123456789\"}";
  c.seed = 0x0123456789abcdefULL;
  c.tensors["w"] = Tensor::from_f32({1.5f, -2.25f, 3.0e-8f, 7.0f, 0.0f, -0.0f}, {2, 3});
  c.tensors["w.m"] = Tensor::from_f32({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, {2, 3});
  c.tensors["w.v"] = Tensor::from_f32({1e-3f, 2e-3f, 3e-3f, 4e-3f, 5e-3f, 6e-3f}, {2, 3});
  c.tensors["ids"] = Tensor::from_int64({1, -2, 1LL << 40}, {3});
  c.extra_json = "{\"losses\":[5.5,4.25]}";
  return c;
}

void expect_same_tensor(const std::string& name, const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  ASSERT_EQ(a.shape(), b.shape()) << name;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name << ": bytes differ";
}

TEST(Checkpoint, SaveThenLoadGivesEverythingBack) {
  TempDir dir;
  std::string path = (dir / "ck.oases").string();
  Checkpoint c = sample_checkpoint();
  ASSERT_TRUE(save_checkpoint(c, path).is_ok());
  auto back = load_checkpoint(path);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->fingerprint, c.fingerprint);
  EXPECT_EQ(back->step, c.step);
  EXPECT_EQ(back->optimizer_t, c.optimizer_t);
  EXPECT_EQ(back->optimizer_kind, c.optimizer_kind);
  EXPECT_EQ(back->sampler_state, c.sampler_state);
  EXPECT_EQ(back->seed, c.seed);
  ASSERT_EQ(back->tensors.size(), c.tensors.size());
  for (const auto& [name, t] : c.tensors) {
    auto it = back->tensors.find(name);
    ASSERT_NE(it, back->tensors.end()) << name << " missing after the load";
    expect_same_tensor(name, t, it->second);
  }
  // no temporary file left beside it
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A diverged run must not replace the last good checkpoint: a NaN or Inf anywhere in a float32
// tensor (weights or moments) is an error naming the file and the tensor, the old file untouched.
TEST(Checkpoint, NonFiniteTensorsAreNeverWritten) {
  TempDir dir;
  std::string path = (dir / "ck.oases").string();
  ASSERT_TRUE(save_checkpoint(sample_checkpoint(), path).is_ok());
  std::string before = testutil::read_bytes(path);
  for (float bad : {std::nanf(""), HUGE_VALF, -HUGE_VALF}) {
    for (const char* name : {"w", "w.v"}) {
      Checkpoint c = sample_checkpoint();
      c.tensors[name].mutable_data<float>()[4] = bad;
      Status st = save_checkpoint(c, path);
      ASSERT_FALSE(st.is_ok()) << name << " holding " << bad << " was written";
      EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(std::string("'") + name + "'"), std::string::npos) << st.message();
      EXPECT_EQ(testutil::read_bytes(path), before);
      EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    }
  }
}

TEST(Checkpoint, TruncatedFilesAreErrorsNamingTheFile) {
  TempDir dir;
  std::string path = (dir / "ck.oases").string();
  ASSERT_TRUE(save_checkpoint(sample_checkpoint(), path).is_ok());
  std::string bytes = testutil::read_bytes(path);
  ASSERT_GT(bytes.size(), 64u);
  // cut in the tensor data, in the header, in the length field, and an empty file
  for (size_t keep : {bytes.size() - 1, bytes.size() / 2, size_t{20}, size_t{12}, size_t{0}}) {
    std::string cut = (dir / ("cut" + std::to_string(keep))).string();
    testutil::write_bytes(cut, bytes.substr(0, keep));
    auto r = load_checkpoint(cut);
    ASSERT_FALSE(r) << "a file cut to " << keep << " of " << bytes.size() << " bytes loaded";
    EXPECT_NE(r.status().message().find(cut), std::string::npos) << r.status().message();
  }
}

TEST(Checkpoint, ForeignAndMissingFilesAreErrors) {
  TempDir dir;
  std::string foreign = (dir / "not_a_checkpoint").string();
  testutil::write_bytes(foreign, std::string("PK\x03\x04 this is a zip, not a checkpoint, padded to some length", 60));
  auto r = load_checkpoint(foreign);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find(foreign), std::string::npos) << r.status().message();
  auto missing = load_checkpoint((dir / "absent").string());
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("absent"), std::string::npos) << missing.status().message();
}

}  // namespace
}  // namespace oases
