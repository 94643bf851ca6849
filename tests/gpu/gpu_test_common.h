// What the GPU suites share: the skip without a device, where the committed models are, and a
// committed small model's training graph with its test inputs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "executor/device.h"
#include "executor/training.h"
#include "graph/passes/mixed_precision.h"
#include "tools/model_loader.h"

namespace oases::gpu_test {

#define REQUIRE_GPU()                                                                               \
  do {                                                                                              \
    if (Status st_ = cuda_usable(); !st_.is_ok()) GTEST_SKIP() << "no GPU here: " << st_.message(); \
  } while (0)

// The checkout holding the committed models: $OASES_SOURCE_DIR where it has them (scripts/gpu_checks.sh
// sets it, so binaries built in another folder, e.g. scripts/gpu_bundle.sh's, find them), else the
// source folder this binary was built from.
inline std::filesystem::path source_dir() {
  const char* env = std::getenv("OASES_SOURCE_DIR");
  if (env && *env && std::filesystem::is_directory(std::filesystem::path(env) / "models" / "small")) return std::filesystem::path(env);
  return std::filesystem::path(OASES_SOURCE_DIR);
}

struct Loaded {
  TrainingGraph tg;
  std::map<std::string, Tensor> feeds;
};

// models/small/<name>: its training graph (mixed precision in `compute`; the loss-scale input of
// fp16 training when asked) and its test inputs, targets added for an appended loss.
inline Loaded load_small_model(const std::string& name, DType compute = DType::kF32, bool loss_scale_input = false) {
  namespace fs = std::filesystem;
  fs::path dir = source_dir() / "models" / "small" / name, data = dir / "test_data_set_0";
  Loaded out;
  ImportOptions opts;
  for (int i = 0; fs::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i) {
    auto t = read_tensor_file((data / ("input_" + std::to_string(i) + ".pb")).string());
    EXPECT_TRUE(t) << t.status().message();
    if (!t) continue;
    out.feeds[t->first] = t->second;
    opts.input_shapes[t->first] = t->second.shape();
  }
  auto m = load_model((dir / "model.onnx").string(), opts);
  EXPECT_TRUE(m) << m.status().message();
  if (!m) return out;
  TrainingSpec spec;
  if (compute != DType::kF32 || loss_scale_input) {
    spec.before_autodiff = [compute, loss_scale_input](Graph g) -> Expected<Graph> {
      if (compute != DType::kF32) OASES_RETURN_IF_ERROR(apply_mixed_precision(g, compute).status());
      if (loss_scale_input) OASES_RETURN_IF_ERROR(insert_loss_scale_input(g));
      return g;
    };
  }
  auto tg = build_training_graph(m->graph, spec);
  EXPECT_TRUE(tg) << tg.status().message();
  if (!tg) return out;
  out.tg = std::move(*tg);
  if (out.tg.appended_loss) {
    auto roles = input_roles(out.tg.graph, out.tg.targets);
    EXPECT_TRUE(roles) << roles.status().message();
    if (!roles) return out;
    for (const InputRole& r : *roles) {
      if (r.kind == InputRole::kTokens) out.feeds["oases_targets"] = shifted_targets(out.feeds.at(r.name), -100);
    }
  }
  return out;
}

}  // namespace oases::gpu_test
