// The block table of multi-tensor launches (executor/multi_tensor.h) and the optimizer's step
// knobs that device updates take (executor/optimizer.h): pure host logic, checked here.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/multi_tensor.h"
#include "executor/optimizer.h"
#include "kernels/cpu/optim.h"

namespace oases {
namespace {

TEST(MultiTensorPlan, CoversEveryElementOnceInTensorOrder) {
  std::vector<int64_t> sizes = {5, 0, 16, 17, 1};
  auto p = plan_multi_tensor(sizes, 8);
  ASSERT_TRUE(p) << p.status().message();
  // 1 + 0 + 2 + 3 + 1 blocks
  ASSERT_EQ(p->block_tensor.size(), 7u);
  ASSERT_EQ(p->first_block, (std::vector<int32_t>{0, 1, 1, 3, 6, 7}));
  std::vector<std::vector<int>> seen(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) seen[t].assign(static_cast<size_t>(sizes[t]), 0);
  for (size_t b = 0; b < p->block_tensor.size(); ++b) {
    int32_t t = p->block_tensor[b];
    ASSERT_GE(b, static_cast<size_t>(p->first_block[static_cast<size_t>(t)]));
    ASSERT_LT(b, static_cast<size_t>(p->first_block[static_cast<size_t>(t) + 1]));
    for (int64_t i = p->block_start[b]; i < std::min(p->block_start[b] + p->chunk, sizes[static_cast<size_t>(t)]); ++i)
      ++seen[static_cast<size_t>(t)][static_cast<size_t>(i)];
  }
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (int c : seen[t]) EXPECT_EQ(c, 1) << "tensor " << t;
  }
}

TEST(MultiTensorPlan, RejectsBadChunksAndSizes) {
  EXPECT_FALSE(plan_multi_tensor({4}, 0));
  auto neg = plan_multi_tensor({4, -1}, 2);
  ASSERT_FALSE(neg);
  EXPECT_NE(neg.status().message().find("tensor 1"), std::string::npos) << neg.status().message();
  auto empty = plan_multi_tensor({}, 4);
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->first_block, std::vector<int32_t>{0});
}

// The knobs a device update takes are the ones the CPU update computes with: the schedule's
// learning rate as float, the bias corrections of the step being taken, SGD's first step.
TEST(OptimizerKnobs, AreTheCpuUpdatesScalars) {
  OptimizerConfig c;
  c.lr = 3e-3;
  c.warmup = 4;
  c.total_steps = 20;
  c.weight_decay = 0.01;
  Optimizer o(c);
  for (int s = 0; s < 6; ++s) {
    OptimizerKnobs k = o.next_knobs();
    EXPECT_EQ(k.t, s + 1);
    EXPECT_EQ(k.lr, static_cast<float>(learning_rate_at(c, k.t)));
    EXPECT_EQ(k.bc1, 1.f - std::pow(0.9f, static_cast<float>(k.t)));
    EXPECT_EQ(k.bc2, kernels::adamw_bias_correction(0.999f, k.t));
    EXPECT_EQ(k.one_minus_beta1, 1.f - 0.9f);
    EXPECT_EQ(k.first, s == 0);
    EXPECT_EQ(o.steps_taken(), s);
    o.record_step(k);
    EXPECT_EQ(o.steps_taken(), s + 1);
    EXPECT_EQ(o.last_lr(), learning_rate_at(c, k.t));
  }
}

}  // namespace
}  // namespace oases
