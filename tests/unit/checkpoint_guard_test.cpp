// The checkpoint rule of the trainer (executor/training.h CheckpointGuard): a state whose loss or
// validation loss is not finite is never saved; an update makes a new state to validate; a skipped
// update keeps the state its non-finite loss came from; every rank refuses for the first reason
// any rank has. And the case that once saved NaN over a good checkpoint: a tiny GPT-2 after one
// update at learning rate 1e30 (finite weights, NaN validation loss).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "executor/training.h"
#include "tools/model_loader.h"

namespace fs = std::filesystem;

namespace oases {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

TEST(CheckpointGuard, AFreshStateIsUnvalidatedAndMayBeSaved) {
  CheckpointGuard g;
  EXPECT_FALSE(g.validated());
  EXPECT_EQ(g.refusal(), "");
  g.after_validation(0, 5.5);
  EXPECT_TRUE(g.validated());
  EXPECT_EQ(g.refusal(), "");
}

TEST(CheckpointGuard, ANonFiniteValidationLossRefusesUntilTheNextUpdate) {
  CheckpointGuard g;
  g.after_step(1, 5.5, /*updated=*/true);
  EXPECT_FALSE(g.validated());  // the step's loss was the old state's
  EXPECT_EQ(g.refusal(), "");
  g.after_validation(1, kNaN);
  EXPECT_TRUE(g.validated());
  EXPECT_EQ(g.refusal(), "the validation loss after step 1 is nan");
  g.after_validation(1, -kNaN);  // the sign bit of a NaN is not shown
  EXPECT_EQ(g.refusal(), "the validation loss after step 1 is nan");
  g.after_validation(1, kInf);
  EXPECT_EQ(g.refusal(), "the validation loss after step 1 is inf");
  // a finite validation of the same state does not clear what was seen of it
  g.after_validation(1, 4.0);
  EXPECT_EQ(g.refusal(), "the validation loss after step 1 is inf");
  // an update makes a new state: what was seen of the old one no longer holds
  g.after_step(2, 4.0, true);
  EXPECT_EQ(g.refusal(), "");
  EXPECT_FALSE(g.validated());
}

TEST(CheckpointGuard, ASkippedUpdateKeepsTheStateItsNonFiniteLossCameFrom) {
  CheckpointGuard g;
  g.after_step(1, 5.5, true);
  g.after_validation(1, 5.0);
  g.after_step(2, kNaN, /*updated=*/false);  // --on-nonfinite skip
  EXPECT_EQ(g.refusal(), "the loss at step 2 is nan and its update was skipped");
  EXPECT_TRUE(g.validated());  // the same state as after step 1
  g.after_step(3, -kInf, false);
  EXPECT_EQ(g.refusal(), "the loss at step 3 is -inf and its update was skipped");
  // a skipped update with a finite loss (fp16's overflowing gradients) changes nothing
  CheckpointGuard h;
  h.after_step(1, 5.5, true);
  h.after_validation(1, 5.0);
  h.after_step(2, 5.2, false);
  EXPECT_EQ(h.refusal(), "");
  EXPECT_TRUE(h.validated());
  // an update from a non-finite loss (no skipping) leaves a state that gave it
  CheckpointGuard u;
  u.after_step(1, kNaN, true);
  EXPECT_EQ(u.refusal(), "the loss at step 1 is nan");
}

TEST(CheckpointGuard, EveryRankRefusesForTheFirstReasonAnyRankHas) {
  EXPECT_TRUE(CheckpointGuard::refuse_save({}, "ck").is_ok());
  EXPECT_TRUE(CheckpointGuard::refuse_save({"", ""}, "ck").is_ok());
  Status s = CheckpointGuard::refuse_save({"", "the loss at step 3 is nan", "the validation loss after step 3 is nan"}, "run/ck");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(), "run/ck: not written: the loss at step 3 is nan (a checkpoint is never saved from a non-finite state)");
}

// The state the issue saw saved: one SGD step at lr 1e30 leaves finite weights whose validation
// loss is NaN. The training loss of that step was finite (it was the old state's).
TEST(CheckpointGuard, RefusesTheStateAHugeLearningRateLeaves) {
  fs::path dir = fs::path(OASES_SOURCE_DIR) / "models" / "small" / "gpt2_tiny";
  ImportOptions opts;
  std::map<std::string, Tensor> feeds;
  for (int i = 0; fs::exists(dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")); ++i) {
    auto t = read_tensor_file((dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")).string());
    ASSERT_TRUE(t) << t.status().message();
    feeds[t->first] = t->second;
    opts.input_shapes[t->first] = t->second.shape();
  }
  auto m = load_model((dir / "model.onnx").string(), opts);
  ASSERT_TRUE(m) << m.status().message();
  auto tg = build_training_graph(m->graph, TrainingSpec{});
  ASSERT_TRUE(tg) << tg.status().message();
  auto roles = input_roles(tg->graph, tg->targets);
  ASSERT_TRUE(roles) << roles.status().message();
  for (const InputRole& r : *roles) {
    if (r.kind == InputRole::kTokens) feeds["oases_targets"] = shifted_targets(feeds.at(r.name), -100);
  }
  OptimizerConfig oc;
  oc.kind = "sgd";
  oc.lr = 1e30;
  oc.momentum = 0;
  auto tr = Trainer::create(std::move(*tg), oc);
  ASSERT_TRUE(tr) << tr.status().message();
  (*tr)->skip_nonfinite = true;
  CheckpointGuard g;
  auto before = (*tr)->eval_loss(feeds);
  ASSERT_TRUE(before) << before.status().message();
  ASSERT_TRUE(std::isfinite(*before));
  g.after_validation(0, *before);
  EXPECT_EQ(g.refusal(), "");
  auto st = (*tr)->step({feeds});
  ASSERT_TRUE(st) << st.status().message();
  ASSERT_FALSE(st->skipped);
  ASSERT_TRUE(std::isfinite(st->loss)) << st->loss;
  g.after_step(1, st->loss, !st->skipped);
  EXPECT_EQ(g.refusal(), "");
  EXPECT_FALSE(g.validated());
  auto after = (*tr)->eval_loss(feeds);
  ASSERT_TRUE(after) << after.status().message();
  EXPECT_FALSE(std::isfinite(*after)) << *after;
  g.after_validation(1, *after);
  EXPECT_EQ(g.refusal(), "the validation loss after step 1 is nan");
  // the next step finds the loss NaN and (skipping) keeps the state
  auto next = (*tr)->step({feeds});
  ASSERT_TRUE(next) << next.status().message();
  EXPECT_TRUE(next->skipped);
  g.after_step(2, next->loss, !next->skipped);
  EXPECT_EQ(g.refusal(), "the loss at step 2 is nan and its update was skipped");
}

}  // namespace
}  // namespace oases
