// Whole-model gradients against PyTorch: for every committed model with a grads/ folder (written by
// models/export.py), the gradients of the training loss on test_data_set_0 must match PyTorch's
// within 1e-5 relative (max abs error over max |reference|, the scale floored at 1e-6, per
// parameter). Measured 2026-11-26 with OpenBLAS's SkylakeX / Haswell / Prescott kernels: 4.3e-6 /
// 3.2e-6 / 2.6e-6 at worst, all on BERT's key biases (zero in exact arithmetic, softmax ignores a
// shift of a row's scores: ~1e-12 of rounding noise on both sides, over the floor), at most 1.3e-6
// on every other parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>

#include "executor/training.h"
#include "tools/model_loader.h"

namespace fs = std::filesystem;

namespace oases {
namespace {

std::vector<std::string> models_with_grads() {
  std::vector<std::string> out;
  fs::path root = fs::path(OASES_SOURCE_DIR) / "models" / "small";
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (fs::is_directory(e.path() / "grads") && fs::exists(e.path() / "model.onnx")) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// bound on max abs error / max(max |reference|, 1e-6), per parameter
constexpr double kRtol = 1e-5;

class PyTorchGradients : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchGradients, MatchWithinRtol) {
  fs::path dir = fs::path(OASES_SOURCE_DIR) / "models" / "small" / GetParam();
  fs::path data = dir / "test_data_set_0";
  std::map<std::string, Tensor> feeds;
  ImportOptions opts;
  for (int i = 0; fs::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i) {
    auto t = read_tensor_file((data / ("input_" + std::to_string(i) + ".pb")).string());
    ASSERT_TRUE(t) << t.status().message();
    feeds[t->first] = t->second;
    opts.input_shapes[t->first] = t->second.shape();
  }
  auto m = load_model((dir / "model.onnx").string(), opts);
  ASSERT_TRUE(m) << m.status().message();
  // PyTorch trains parameters, not buffers: an exporter may write buffers (rotary tables) as
  // initializers too, so every float initializer without a reference gradient is frozen, as a
  // user would with --freeze.
  std::set<std::string> ref_names;
  for (const auto& e : fs::directory_iterator(dir / "grads")) {
    auto ref = read_tensor_file(e.path().string());
    ASSERT_TRUE(ref) << ref.status().message();
    ref_names.insert(ref->first);
  }
  std::string freeze;
  for (ValueId v : m->graph.initializers()) {
    const std::string& n = m->graph.value(v).name;
    if (!is_floating(m->graph.value(v).dtype) || ref_names.count(n)) continue;
    std::string esc;
    for (char ch : n) esc += std::string(std::strchr(".^$|()[]{}*+?\\", ch) && ch ? "\\" : "") + ch;
    freeze += (freeze.empty() ? "" : "|") + esc;
  }
  TrainingSpec spec;
  if (!freeze.empty()) spec.freeze = "^(" + freeze + ")$";
  auto tg = build_training_graph(m->graph, spec);
  ASSERT_TRUE(tg) << tg.status().message();
  if (tg->appended_loss) {
    // the next-token targets of the reference: the token input shifted left
    auto roles = input_roles(tg->graph, tg->targets);
    ASSERT_TRUE(roles) << roles.status().message();
    for (const InputRole& r : *roles) {
      if (r.kind == InputRole::kTokens) feeds["oases_targets"] = shifted_targets(feeds.at(r.name), -100);
    }
  }
  auto tr = Trainer::create(std::move(*tg), OptimizerConfig{});
  ASSERT_TRUE(tr) << tr.status().message();
  auto loss = (*tr)->compute_gradients(feeds);
  ASSERT_TRUE(loss) << loss.status().message();

  std::map<std::string, size_t> index;
  for (size_t i = 0; i < (*tr)->training_graph().params.size(); ++i) index[(*tr)->param_name(i)] = i;
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& e : fs::directory_iterator(dir / "grads")) {
    auto ref = read_tensor_file(e.path().string());
    ASSERT_TRUE(ref) << ref.status().message();
    auto it = index.find(ref->first);
    ASSERT_NE(it, index.end()) << "PyTorch has a gradient for '" << ref->first << "', Oases does not train it";
    Tensor got = (*tr)->gradient(it->second);
    ASSERT_EQ(got.shape(), ref->second.shape()) << ref->first;
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      double a = got.data<float>()[i], b = ref->second.data<float>()[i];
      max_err = std::max(max_err, std::abs(a - b));
      max_ref = std::max(max_ref, std::abs(b));
    }
    const double rel = max_err / std::max(max_ref, 1e-6);
    EXPECT_LE(rel, kRtol) << ref->first << ": max abs error " << max_err << ", max |grad| " << max_ref;
    if (rel >= worst) {
      worst = rel;
      worst_name = ref->first;
    }
    ++compared;
  }
  std::cout << "[ pytorch grads ] " << GetParam() << ": " << compared << " gradients, worst " << worst << " relative (" << worst_name
            << ")\n";
  EXPECT_EQ(compared, static_cast<int>(index.size())) << "every trained parameter has a PyTorch reference";
}

INSTANTIATE_TEST_SUITE_P(CommittedModels, PyTorchGradients, ::testing::ValuesIn(models_with_grads()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace oases
