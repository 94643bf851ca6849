// Executor-level fusion (graph/passes/fusion.h) and in-place outputs of the memory plan: programs with
// and without them compute the same outputs and gradients, the rewrites happen where expected, and
// an input that is read later is never overwritten.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "executor/executor.h"
#include "executor/training.h"
#include "tests/common/tensor_compare.h"
#include "tools/model_loader.h"

namespace fs = std::filesystem;

namespace oases {
namespace {

struct Loaded {
  LoadedModel model;
  std::map<std::string, Tensor> feeds;
};

Loaded load_small(const std::string& name) {
  fs::path dir = fs::path(OASES_SOURCE_DIR) / "models" / "small" / name;
  Loaded l;
  ImportOptions opts;
  for (int i = 0; fs::exists(dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")); ++i) {
    auto t = read_tensor_file((dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")).string());
    EXPECT_TRUE(t) << t.status().message();
    l.feeds[t->first] = t->second;
    opts.input_shapes[t->first] = t->second.shape();
  }
  auto m = load_model((dir / "model.onnx").string(), opts);
  EXPECT_TRUE(m) << m.status().message();
  l.model = std::move(*m);
  return l;
}

class ForwardFusion : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardFusion, SameOutputsAsTheUnfusedProgram) {
  Loaded l = load_small(GetParam());
  ExecOptions on, off;
  off.fuse = false;
  auto a = Executor::create(l.model.graph, on);
  auto b = Executor::create(l.model.graph, off);
  ASSERT_TRUE(a && b);
  auto ya = (*a)->run(l.feeds);
  auto yb = (*b)->run(l.feeds);
  ASSERT_TRUE(ya) << ya.status().message();
  ASSERT_TRUE(yb) << yb.status().message();
  for (size_t i = 0; i < ya->size(); ++i) EXPECT_LT(test::max_rel_diff((*ya)[i], (*yb)[i]), 1e-5) << "output " << i;
  EXPECT_LE((*a)->program().instrs.size(), (*b)->program().instrs.size());
}

INSTANTIATE_TEST_SUITE_P(SmallModels, ForwardFusion,
                         ::testing::Values("gpt2_tiny", "gpt2_dynamo", "gpt2_erf_opset14", "bert_mask", "llama_gqa"));

TEST(ForwardFusion, Gpt2RunsAsGemmsAttentionAndNorms) {
  Loaded l = load_small("gpt2_tiny");
  auto ex = Executor::create(l.model.graph);
  ASSERT_TRUE(ex);
  const FusionStats& f = (*ex)->program().fusion;
  EXPECT_GT(f.bias, 0);
  EXPECT_GT(f.activation, 0);
  EXPECT_GT(f.residual, 0);
  EXPECT_GT(f.attention, 0);
  EXPECT_GT(f.transposes_folded, 0);  // the tied LM head reads the embedding table transposed
  for (const Instr& in : (*ex)->program().instrs) {
    const Node& n = (*ex)->program().graph.node(in.node);
    EXPECT_NE(n.op_type, "Transpose") << n.describe();
    EXPECT_NE(n.op_type, "Split") << n.describe();
    EXPECT_NE(n.op_type, "Gelu") << n.describe();
  }
}

TEST(TrainingFusion, SameGradientsAsTheUnfusedProgram) {
  Loaded l = load_small("gpt2_tiny");
  std::vector<std::vector<Tensor>> grads;
  for (bool fuse : {true, false}) {
    if (!fuse) setenv("OASES_NO_FUSION", "1", 1);
    auto tg = build_training_graph(l.model.graph, TrainingSpec{});
    ASSERT_TRUE(tg) << tg.status().message();
    std::map<std::string, Tensor> feeds = l.feeds;
    auto roles = input_roles(tg->graph, tg->targets);
    ASSERT_TRUE(roles);
    for (const InputRole& r : *roles) {
      if (r.kind == InputRole::kTokens) feeds["oases_targets"] = shifted_targets(feeds.at(r.name), -100);
    }
    auto tr = Trainer::create(std::move(*tg), OptimizerConfig{});
    unsetenv("OASES_NO_FUSION");
    ASSERT_TRUE(tr) << tr.status().message();
    const Program& p = (*tr)->executor().program();
    if (fuse) {
      EXPECT_GT(p.fusion.gather_grad, 0);  // the tied embedding's two gradient halves
      EXPECT_GT(p.memory.inplace, 0);
    } else {
      EXPECT_EQ(p.fusion.bias + p.fusion.gather_grad + p.memory.inplace, 0);
    }
    ASSERT_TRUE((*tr)->compute_gradients(feeds));
    grads.emplace_back();
    for (size_t i = 0; i < (*tr)->training_graph().params.size(); ++i) grads.back().push_back((*tr)->gradient(i));
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_LT(test::max_rel_diff(grads[0][i], grads[1][i]), 1e-5) << "parameter " << i;
}

// y = relu(x); z = y + 1; w = y * z: the Add must not write over y, which Mul reads later; Mul
// may write over z.
TEST(InPlace, NeverOverwritesAValueReadLater) {
  Graph g;
  g.opset_imports[""] = 18;
  ValueId x = g.add_input("x", DType::kF32, {4, 3});
  ValueId one = g.add_constant("one", Tensor::from_f32({1.f}, {1}));
  auto op = [&](const std::string& t, std::vector<ValueId> ins) {
    ValueId out = g.add_value(g.unique_name(t), DType::kF32, {4, 3}, true);
    g.add_node(t, ins, {out});
    return out;
  };
  ValueId y = op("Relu", {x});
  ValueId z = op("Add", {y, one});
  ValueId w = op("Mul", {y, z});
  g.set_outputs({w});
  auto ex = Executor::create(g);
  ASSERT_TRUE(ex) << ex.status().message();
  const MemoryPlan& m = (*ex)->program().memory;
  EXPECT_NE(m.slots[z].kind == ValueSlot::Kind::kView ? m.slots[z].root : z, y);
  Tensor in(DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) in.mutable_data<float>()[i] = static_cast<float>(i - 5);
  auto out = (*ex)->run({{"x", in}});
  ASSERT_TRUE(out);
  for (int i = 0; i < 12; ++i) {
    float r = std::max(0.f, static_cast<float>(i - 5));
    EXPECT_EQ((*out)[0].data<float>()[i], r * (r + 1.f));
  }
}

}  // namespace
}  // namespace oases
