// Checkpoint files (executor/checkpoint.h): a save then a load gives back every tensor bit for bit,
// the step, the optimizer state and the sampler's position; truncated, damaged or foreign files are
// one-line errors that name the file (and the tensor or field), never a crash or a silent load.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "executor/checkpoint.h"
#include "executor/optimizer.h"
#include "tests/common/checkpoint_tamper.h"
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

// A load that must fail: one line, naming the file and `culprit` (a regex-free substring).
void expect_refused(const std::string& path, const std::string& culprit, const std::string& what) {
  auto r = load_checkpoint(path);
  ASSERT_FALSE(r) << what << ": loaded";
  const std::string& m = r.status().message();
  EXPECT_NE(m.find(path), std::string::npos) << what << ": " << m;
  EXPECT_NE(m.find(culprit), std::string::npos) << what << ": " << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": not one line: " << m;
}

std::string saved_sample(const TempDir& dir) {
  std::string path = (dir / "ck.oases").string();
  EXPECT_TRUE(save_checkpoint(sample_checkpoint(), path).is_ok());
  return testutil::read_bytes(path);
}

// One flipped bit anywhere (a tensor's bytes, an offset, the sampler state, the step, the stored
// checksum, the length) is found by the checksums.
TEST(Checkpoint, FlippedBitsAreFoundByTheChecksums) {
  TempDir dir;
  std::string good = saved_sample(dir);
  auto ck = testutil::CheckpointBytes::parse(good);
  const size_t h0 = testutil::CheckpointBytes::kHeaderStart;
  auto digit_after = [&](const std::string& key) { return h0 + ck.header.find(key) + key.size(); };
  struct Flip {
    const char* what;
    size_t at;
    const char* culprit;
  };
  // tensors are stored in name order: ids (24 bytes), w, w.m, w.v
  const Flip flips[] = {{"tensor data", ck.data_start() + 24 + 5, "tensor 'w': its checksum does not match"},
                        {"an offset", digit_after("\"offset\":"), "header's checksum"},
                        {"the sampler state", digit_after("position\\\":"), "header's checksum"},
                        {"the step", digit_after("\"step\":"), "header's checksum"},
                        {"the header checksum", 17, "header's checksum"},
                        {"the header length", 8, "header"}};
  for (const Flip& f : flips) {
    std::string bad = good;
    bad[f.at] = static_cast<char>(bad[f.at] ^ 0x01);
    std::string path = (dir / "flipped").string();
    testutil::write_bytes(path, bad);
    expect_refused(path, f.culprit, f.what);
  }
}

// Damage behind a header checksum made to match (a deliberate edit, or a collision): the field
// checks and each tensor's own checksum (over its name, dtype, shape, offset and bytes) hold.
TEST(Checkpoint, EveryHeaderFieldIsChecked) {
  TempDir dir;
  std::string good = saved_sample(dir);
  struct Edit {
    const char* what;
    std::string from, to, culprit;
  };
  const Edit edits[] = {
      {"negative step", "\"step\":17", "\"step\":-3", "'step' is -3 (must be >= 0)"},
      {"negative optimizer step", "\"t\":17", "\"t\":-1", "optimizer.'t' is -1 (must be >= 0)"},
      {"step not a number", "\"step\":17", "\"step\":\"17\"", "'step' is \"17\" (not a count)"},
      {"unknown optimizer", "\"adamw\"", "\"lion\"", "optimizer.'kind' is 'lion'"},
      {"offset moved", "\"offset\":24", "\"offset\":28", "tensor 'w': offset 28 where the previous tensor ends at 24"},
      {"offset past the file", "\"offset\":24", "\"offset\":99999999999", "offset 99999999999"},
      {"shape changed", "\"shape\":[2,3]", "\"shape\":[3,2]", "tensor 'w': its checksum does not match"},
      {"shape negative", "\"shape\":[2,3]", "\"shape\":[-2,-3]", "tensor 'w': shape [-2,-3]"},
      {"shape and size grown", "\"bytes\":24,\"crc32c\"", "\"bytes\":28,\"crc32c\"", "tensor 'ids': 28 bytes for a int64 [3] tensor"},
      {"dtype changed", "\"dtype\":\"float32\",\"name\":\"w\",\"offset\":24,\"onnx_type\":1",
       "\"dtype\":\"int32\",\"name\":\"w\",\"offset\":24,\"onnx_type\":6", "tensor 'w': its checksum does not match"},
      {"dtype unknown", "\"onnx_type\":1", "\"onnx_type\":12345", "ONNX type 12345"},
      {"name changed", "\"name\":\"w.m\"", "\"name\":\"w.q\"", "tensor 'w.q': its checksum does not match"},
      {"name repeated", "\"name\":\"w.m\"", "\"name\":\"w\"", "name 'w' is empty or repeated"},
      {"checksum missing", "\"crc32c\":", "\"crc\":", "'crc32c' is missing"},
      {"sampler state not a string", "\"sampler_state\":\"", "\"sampler_state\":7,\"x\":\"", "'sampler_state' is not a string"},
      {"version", "\"version\":2", "\"version\":3", "version 3"},
      {"format", "\"oases-checkpoint\"", "\"zip\"", "format 'zip'"},
      {"tensors not a list", "\"tensors\":[", "\"tensors\":\"x\",\"y\":[", "'tensors' is not an array"},
  };
  for (const Edit& e : edits) {
    auto ck = testutil::CheckpointBytes::parse(good);
    testutil::replace_once(ck.header, e.from, e.to);
    ck.reseal();
    std::string path = (dir / "edited").string();
    testutil::write_bytes(path, ck.bytes());
    expect_refused(path, e.culprit, e.what);
  }
}

TEST(Checkpoint, AHeaderThatIsJsonButNotAnObjectNamesTheFile) {
  TempDir dir;
  auto ck = testutil::CheckpointBytes::parse(saved_sample(dir));
  for (const char* header : {"[1,2]", "\"text\"", "42", "null"}) {
    ck.header = header;
    ck.reseal();
    ck.data.clear();
    std::string path = (dir / "json_not_object").string();
    testutil::write_bytes(path, ck.bytes());
    expect_refused(path, "not an object", header);
  }
}

// What the fuzz target (tests/fuzz/checkpoint_fuzz.cpp) pointed at: a header nested deep enough
// to overflow a recursive dump, a folder, and empty tensors, which round-trip.
TEST(Checkpoint, DeepHeadersFoldersAndEmptyTensors) {
  TempDir dir;
  auto ck = testutil::CheckpointBytes::parse(saved_sample(dir));
  testutil::replace_once(ck.header, "\"extra\":{", "\"extra\":{\"deep\":" + std::string(100000, '[') + std::string(100000, ']') + ",");
  ck.reseal();
  std::string path = (dir / "deep").string();
  testutil::write_bytes(path, ck.bytes());
  expect_refused(path, "nested 100002 levels deep", "deep header");
  expect_refused(dir.path().string(), "is a folder", "a folder");

  Checkpoint c = sample_checkpoint();
  c.tensors["empty"] = Tensor(DType::kF32, {0, 3});
  c.extra_json = "not json";
  std::string empty = (dir / "empty").string();
  ASSERT_TRUE(save_checkpoint(c, empty).is_ok());
  auto back = load_checkpoint(empty);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->tensors.at("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(back->extra_json, "\"not json\"");
}

TEST(Checkpoint, TrailingBytesAreRefused) {
  TempDir dir;
  std::string path = (dir / "longer").string();
  testutil::write_bytes(path, saved_sample(dir) + "x");
  expect_refused(path, "1 bytes after the last tensor", "one byte appended");
}

// Version 1 (no checksums) still loads, with a warning naming the file; its fields are checked.
TEST(Checkpoint, VersionOneLoadsWithAWarning) {
  TempDir dir;
  auto ck = testutil::CheckpointBytes::parse(saved_sample(dir));
  std::string path = (dir / "v1").string();
  testutil::write_bytes(path, ck.bytes_v1());
  auto r = load_checkpoint(path);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_NE(r->warning.find(path), std::string::npos) << r->warning;
  EXPECT_NE(r->warning.find("no checksums"), std::string::npos) << r->warning;
  expect_same_tensor("w", r->tensors.at("w"), sample_checkpoint().tensors.at("w"));
  EXPECT_TRUE(load_checkpoint((dir / "ck.oases").string())->warning.empty());

  testutil::replace_once(ck.header, "\"step\":17", "\"step\":-3");
  testutil::write_bytes(path, ck.bytes_v1());
  expect_refused(path, "'step' is -3", "version 1, negative step");

  // no checksum to catch a flipped exponent bit: the value check does (3e-8 -> NaN is 0x7f...)
  auto nan_ck = testutil::CheckpointBytes::parse(testutil::read_bytes(dir / "ck.oases"));
  size_t w_third = 24 + 2 * 4 + 3;  // the high byte of w[2] (little endian)
  nan_ck.data[w_third] = static_cast<char>(0x7f);
  nan_ck.data[w_third - 1] = static_cast<char>(0xc0);
  testutil::write_bytes(path, nan_ck.bytes_v1());
  expect_refused(path, "tensor 'w' holds a non-finite value at element 2", "version 1, NaN");
}

TEST(Checkpoint, NegativeStepsAreNeverWritten) {
  TempDir dir;
  Checkpoint c = sample_checkpoint();
  c.step = -1;
  std::string path = (dir / "neg").string();
  EXPECT_FALSE(save_checkpoint(c, path).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Optimizer state of another size (or missing) is refused whole, never dropped silently (which
// restarted those moments from zero).
TEST(Checkpoint, OptimizerStateMustMatchEveryParameter) {
  for (const char* kind : {"adamw", "sgd"}) {
    OptimizerConfig cfg;
    cfg.kind = kind;
    Optimizer opt(cfg);
    opt.add("w", Tensor::from_f32({1, 2, 3, 4, 5, 6}, {2, 3}));
    opt.add("b", Tensor::from_f32({1, 2}, {2}));
    auto good = opt.state();
    for (auto& [name, t] : good) t.mutable_data<float>()[0] = 0.5f;
    ASSERT_TRUE(opt.set_state(good, 7).is_ok()) << kind;
    EXPECT_EQ(opt.steps_taken(), 7);

    auto small = good;
    std::string key = std::string("b") + (cfg.kind == "adamw" ? ".v" : ".momentum");
    small[key] = Tensor::from_f32({1}, {1});
    Status st = opt.set_state(small, 9);
    ASSERT_FALSE(st.is_ok()) << kind << ": a state of the wrong size was taken";
    EXPECT_NE(st.message().find("'" + key + "' is float32 [1]"), std::string::npos) << st.message();
    EXPECT_EQ(opt.steps_taken(), 7) << "a refused state changed the optimizer";

    auto missing = good;
    missing.erase(key);
    st = opt.set_state(missing, 9);
    ASSERT_FALSE(st.is_ok()) << kind << ": a missing state was accepted";
    EXPECT_NE(st.message().find("'" + key + "' is missing"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace oases
