// Pipeline schedules (planner/pipeline.h): each schedule's order per stage, the peak micro-batches
// in flight against the stated rule, deadlock-freedom of every stage's transfers replayed by the
// channel checker, and the simulator's step time on cases worked by hand.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "planner/cluster_spec.h"
#include "planner/pipeline.h"

namespace oases {
namespace {

const PipelineSchedule kAll[] = {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kEager1F1B};

TEST(Pipeline, OrdersRunEveryMicroBatchOnceForwardBeforeBackward) {
  for (auto p : kAll) {
    for (int S : {1, 2, 3, 4, 8}) {
      for (int M = 1; M <= 12; ++M) {
        for (int s = 0; s < S; ++s) {
          auto steps = stage_steps(p, s, S, M);
          ASSERT_EQ(static_cast<int>(steps.size()), 2 * M);
          std::vector<int> f(M, -1), b(M, -1);
          for (size_t i = 0; i < steps.size(); ++i) (steps[i].forward ? f : b)[steps[i].micro] = static_cast<int>(i);
          for (int m = 0; m < M; ++m) {
            EXPECT_GE(f[m], 0);
            EXPECT_GT(b[m], f[m]) << pipeline_name(p) << " S=" << S << " M=" << M << " s=" << s;
            if (m) { EXPECT_GT(f[m], f[m - 1]); }
            if (m) { EXPECT_GT(b[m], b[m - 1]); }
          }
        }
      }
    }
  }
}

TEST(Pipeline, PeakInFlightFollowsTheRule) {
  for (int S : {2, 3, 4, 8}) {
    for (int M = 1; M <= 12; ++M) {
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(peak_in_flight(stage_steps(PipelineSchedule::kGPipe, s, S, M)), M);
        EXPECT_EQ(peak_in_flight(stage_steps(PipelineSchedule::k1F1B, s, S, M)), std::min(M, S - s)) << S << " " << M << " " << s;
        EXPECT_EQ(peak_in_flight(stage_steps(PipelineSchedule::kEager1F1B, s, S, M)), std::min(M, 2 * (S - s)));
      }
    }
  }
  // the example everyone draws: 4 stages, 8 micro-batches, 1F1B on stage 1
  auto st = stage_steps(PipelineSchedule::k1F1B, 1, 4, 8);
  std::string seq;
  for (const PipeStep& x : st) seq += fmt::format("{}{} ", x.forward ? 'F' : 'B', x.micro);
  EXPECT_EQ(seq, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7 ");
}

TEST(Pipeline, EveryScheduleIsDeadlockFree) {
  for (auto p : kAll) {
    for (int S : {1, 2, 3, 4, 8}) {
      for (int M = 1; M <= 10; ++M) {
        Status st = check_pipeline_order(p, S, M);
        EXPECT_TRUE(st.is_ok()) << st.message();
      }
    }
  }
}

TEST(Pipeline, DeadlockFreeForAnyStageAndLinkTimes) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int it = 0; it < 200; ++it) {
    int S = 2 + static_cast<int>(rng() % 4), M = 1 + static_cast<int>(rng() % 9);
    PipelineTimes t;
    for (int s = 0; s < S; ++s) {
      t.forward_s.push_back(u(rng));
      t.backward_s.push_back(u(rng));
      if (s + 1 < S) t.transfer_s.push_back(rng() % 3 == 0 ? 0.0 : u(rng));
    }
    for (auto p : kAll) {
      Status st = check_pipeline_order(p, S, M, t);
      EXPECT_TRUE(st.is_ok()) << st.message();
    }
  }
}

TEST(Pipeline, SimulatorMatchesHandWorkedCases) {
  // no transfer time, equal stages: 1F1B and GPipe both take (M + S − 1)(f + b)
  PipelineTimes t{{1, 1, 1, 1}, {2, 2, 2, 2}, {0, 0, 0}};
  for (auto p : kAll) {
    auto sim = simulate_pipeline(p, 8, t).value();
    EXPECT_DOUBLE_EQ(sim.step_s, (8 + 4 - 1) * 3.0) << pipeline_name(p);
    EXPECT_NEAR(sim.bubble, 1 - 24.0 / 33.0, 1e-12);
  }
  // one stage: no pipeline, no bubble
  // a half-duplex link (the emulated hosts' cards) carries activations and gradients one after
  // the other, never faster. Hand-worked: stages of forward 1 / 0.5 s and backward 2 / 0.5 s,
  // transfers 3 s, 1F1B with 2 micro-batches. Stage 0: F0 0-1, F1 1-2; activations cross 1-4 and
  // 4-7; stage 1: F0 4-4.5, B0 4.5-5, F1 7-7.5, B1 7.5-8. Own lanes: gradients cross 5-8 and 8-11,
  // stage 0 runs B0 8-10, B1 11-13: 13 s. One lane: gradient 0 waits for activation 1 (7-10),
  // gradient 1 crosses 10-13, B0 10-12, B1 13-15: 15 s.
  {
    PipelineTimes two{{1, 0.5}, {2, 0.5}, {3}};
    auto full = simulate_pipeline(PipelineSchedule::k1F1B, 2, two).value();
    two.half_duplex = true;
    auto half = simulate_pipeline(PipelineSchedule::k1F1B, 2, two).value();
    EXPECT_DOUBLE_EQ(full.step_s, 13.0);
    EXPECT_DOUBLE_EQ(half.step_s, 15.0);
    EXPECT_GE(half.step_s, full.step_s);
    for (PipelineSchedule p : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kEager1F1B}) {
      PipelineTimes t4{{1, 2, 1, 1}, {2, 3, 2, 2}, {1.5, 0.5, 2}};
      double f = simulate_pipeline(p, 8, t4).value().step_s;
      t4.half_duplex = true;
      EXPECT_GE(simulate_pipeline(p, 8, t4).value().step_s, f) << pipeline_name(p);
    }
  }
  auto one = simulate_pipeline(PipelineSchedule::k1F1B, 4, PipelineTimes{{1}, {2}, {}}).value();
  EXPECT_DOUBLE_EQ(one.step_s, 12);
  EXPECT_DOUBLE_EQ(one.bubble, 0);
  // transfers as long as a forward: eager 1F1B hides them better than 1F1B
  PipelineTimes slow{{1, 1, 1, 1}, {2, 2, 2, 2}, {1, 1, 1}};
  double lazy = simulate_pipeline(PipelineSchedule::k1F1B, 8, slow).value().step_s;
  double eager = simulate_pipeline(PipelineSchedule::kEager1F1B, 8, slow).value().step_s;
  EXPECT_LT(eager, lazy);
  EXPECT_FALSE(simulate_pipeline(PipelineSchedule::kGPipe, 0, t));
  EXPECT_FALSE(simulate_pipeline(PipelineSchedule::kGPipe, 2, PipelineTimes{{1, 1}, {1}, {}}));
  EXPECT_FALSE(parse_pipeline("zero-bubble"));
  EXPECT_FALSE(parse_pipeline("zb-h2"));
}

// zb-h1: 1F1B's forwards and B's with the W's in the waits, stage s deferring at most s of them;
// 1F1B's first-stage peak in flight (held to the W) on every stage; deadlock-free (a W moves
// nothing); the gradient crossing the stages at B's pace shortens the step and its bubble: 4
// equal stages, 8 micro-batches, F = B = W = 1 (1F1B's backward 2): 1F1B (8 + 3) x 3 = 33; zb-h1
// 24 of work plus (S - 1) F = 27, the bubble (3 units) a third of 1F1B's (9).
TEST(Pipeline, ZeroBubbleH1SplitsEachBackwardAndShortensTheBubble) {
  const auto z = PipelineSchedule::kZBH1;
  EXPECT_TRUE(splits_backward(z));
  EXPECT_EQ(parse_pipeline("zb-h1").value(), z);
  for (int S : {1, 2, 3, 4, 8}) {
    for (int M = 1; M <= 12; ++M) {
      for (int s = 0; s < S; ++s) {
        auto steps = stage_steps(z, s, S, M);
        ASSERT_EQ(static_cast<int>(steps.size()), 3 * M);
        std::vector<PipeStep> fb;
        std::vector<int> b_at(static_cast<size_t>(M), -1), w_at = b_at;
        int deferred = 0, most = 0;  // W's pending (B run, W not) when a forward runs
        for (size_t i = 0; i < steps.size(); ++i) {
          const PipeStep& x = steps[i];
          if (x.weight) {
            w_at[static_cast<size_t>(x.micro)] = static_cast<int>(i);
            if (x.micro > 0) {
              EXPECT_GT(w_at[static_cast<size_t>(x.micro)], w_at[static_cast<size_t>(x.micro - 1)]);
            }
            --deferred;
            continue;
          }
          fb.push_back(x);
          if (x.forward) most = std::max(most, deferred);
          if (!x.forward) b_at[static_cast<size_t>(x.micro)] = static_cast<int>(i), ++deferred;
        }
        for (int m = 0; m < M; ++m) EXPECT_GT(w_at[static_cast<size_t>(m)], b_at[static_cast<size_t>(m)]) << "W" << m << " before its B";
        EXPECT_EQ(fb, stage_steps(PipelineSchedule::k1F1B, s, S, M));
        EXPECT_LE(most, s) << S << " " << M << " " << s;
        EXPECT_LE(peak_in_flight(steps), std::min(M, S)) << S << " " << M << " " << s;
        // the profile splits the micro-batches in flight into F-to-B and B-to-W: together the
        // peak in flight, the B-to-W ones never more than the deferred W's, none left at the end
        const std::vector<InFlight> prof = in_flight_profile(steps);
        ASSERT_EQ(prof.size(), steps.size());
        int together = 0, pending = 0;
        for (const InFlight& x : prof) {
          EXPECT_GE(x.forward_backward, 0);
          EXPECT_GE(x.backward_weight, 0);
          together = std::max(together, x.forward_backward + x.backward_weight);
          pending = std::max(pending, x.backward_weight);
        }
        EXPECT_EQ(together, peak_in_flight(steps)) << S << " " << M << " " << s;
        EXPECT_LE(pending, std::min(M, s + 1)) << S << " " << M << " " << s;
        EXPECT_EQ(prof.back().forward_backward + prof.back().backward_weight, 0);
        for (const InFlight& x : in_flight_profile(stage_steps(PipelineSchedule::k1F1B, s, S, M))) EXPECT_EQ(x.backward_weight, 0);
      }
      EXPECT_TRUE(check_pipeline_order(z, S, M).is_ok()) << check_pipeline_order(z, S, M).message();
    }
  }
  std::string seq;
  for (const PipeStep& x : stage_steps(z, 1, 4, 8)) seq += fmt::format("{}{} ", x.forward ? 'F' : x.weight ? 'W' : 'B', x.micro);
  EXPECT_EQ(seq, "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7 ");
  PipelineTimes t{{1, 1, 1, 1}, {2, 2, 2, 2}, {0, 0, 0}};
  auto one = simulate_pipeline(PipelineSchedule::k1F1B, 8, t).value();
  auto zb = simulate_pipeline(z, 8, t).value();  // the backward split evenly: B = W = 1
  EXPECT_DOUBLE_EQ(one.step_s, 33.0);
  EXPECT_DOUBLE_EQ(zb.step_s, 27.0);
  EXPECT_NEAR(zb.bubble, 1 - 24.0 / 27.0, 1e-12);
  EXPECT_DOUBLE_EQ(zb.step_s - 24.0, (one.step_s - 24.0) / 3);
  PipelineTimes given = t;
  given.weight_s = {0.5, 0.5, 0.5, 0.5};  // a W given: the backward is B's alone
  EXPECT_DOUBLE_EQ(split_backward(z, given).backward_s[0], 2.0);
  EXPECT_DOUBLE_EQ(split_backward(z, t).weight_s[2], 1.0);
  EXPECT_TRUE(split_backward(PipelineSchedule::k1F1B, t).weight_s.empty());
}

// Stages on one machine's shared cores (CPU thread ranks): the given times are the steps' while
// every stage computes; a stage computing alone gets the cores the others leave. Two stages of one
// thread on one core, F = B = 1 each while both compute (half a core each: 0.5 of a core's work).
// One micro-batch: every step runs alone, at a whole core, 4 x 0.5. Four under 1F1B: the core is
// never idle (no transfer time), so the step is the work, 2 stages x 4 x (0.5 + 0.5), where a device
// each takes (M + S - 1) x (F + B) = 10; with a core each nothing is shared.
TEST(Pipeline, StagesOnSharedCoresShareThemOnlyWhileTheyComputeTogether) {
  PipelineTimes t{{1, 1}, {1, 1}, {0}};
  t.shared_cores = 1;
  t.stage_threads = 1;
  EXPECT_DOUBLE_EQ(simulate_pipeline(PipelineSchedule::k1F1B, 1, t).value().step_s, 2.0);
  auto shared = simulate_pipeline(PipelineSchedule::k1F1B, 4, t).value();
  EXPECT_NEAR(shared.step_s, 8.0, 1e-9);
  PipelineTimes own = t;
  own.shared_cores = 0;
  EXPECT_DOUBLE_EQ(simulate_pipeline(PipelineSchedule::k1F1B, 4, own).value().step_s, 10.0);
  own.shared_cores = 2;  // a core each: the times as given
  EXPECT_DOUBLE_EQ(simulate_pipeline(PipelineSchedule::k1F1B, 4, own).value().step_s, 10.0);
  // the bubble from the steps' spans: stage 0's F0 ran alone (0.5), its others shared
  EXPECT_GT(shared.bubble, 0);
  EXPECT_LT(shared.bubble, 0.2);
  // a step's wait on the link takes its wall time whatever the cores: half of each step on the
  // link, the other half's work alone on the core (0.5 / 2) -> 0.75 a step, 4 of them in a row
  PipelineTimes linked = t;
  linked.forward_link_s = {0.5, 0.5};
  linked.backward_link_s = {0.5, 0.5};
  auto half = simulate_pipeline(PipelineSchedule::k1F1B, 1, linked);
  ASSERT_TRUE(half) << half.status().message();
  EXPECT_NEAR(half->step_s, 3.0, 1e-9);
  linked.forward_link_s = linked.backward_link_s = {1, 1};  // all on the link: as given
  auto all = simulate_pipeline(PipelineSchedule::k1F1B, 1, linked);
  ASSERT_TRUE(all) << all.status().message();
  EXPECT_NEAR(all->step_s, 4.0, 1e-9);
  // two stages whose links overlap their peers' work: no slower than without sharing, faster than all-busy work
  linked.forward_link_s = linked.backward_link_s = {0.5, 0.5};
  const double m4 = simulate_pipeline(PipelineSchedule::k1F1B, 4, linked).value().step_s;
  EXPECT_GT(m4, 8.0);
  EXPECT_LE(m4, 10.0 + 1e-9);
  // share_cores: only when every rank is on the cores
  ClusterSpec c;
  c.cores_per_node = 2;
  c.gpus_per_node = 4;
  c.threads_per_rank = 1;
  PipelineTimes s = share_cores(PipelineTimes{}, c, 2, 2);
  EXPECT_DOUBLE_EQ(s.shared_cores, 2);
  EXPECT_DOUBLE_EQ(s.stage_threads, 2);
  c.gpus_per_node = 2;  // two nodes: a stage on each, nothing shared between them
  c.nodes = 2;
  EXPECT_DOUBLE_EQ(share_cores(PipelineTimes{}, c, 2, 2).shared_cores, 0);
}

// Interleaved 1F1B (virtual stages): every chunk of every micro-batch once on its rank, a
// micro-batch's chunks forward in order and backward in reverse, S micro-batches a round; the
// warm-up and the peak in flight as the header states; deadlock-free for any times; the bubble
// (S − 1)(f + b) of one chunk, 1/V of 1F1B's, with free transfers.
TEST(Pipeline, VirtualStagesInterleaveChunksAndShrinkTheBubble) {
  const auto p = PipelineSchedule::k1F1B;
  for (int S : {2, 3, 4, 8}) {
    for (int V : {2, 3, 4}) {
      for (int M = S; M <= 3 * S; M += S) {
        for (int s = 0; s < S; ++s) {
          auto steps = stage_steps(p, s, S, M, V);
          ASSERT_EQ(static_cast<int>(steps.size()), 2 * M * V);
          std::map<std::tuple<bool, int, int>, int> at;
          for (size_t i = 0; i < steps.size(); ++i) {
            EXPECT_TRUE(at.emplace(std::make_tuple(steps[i].forward, steps[i].chunk, steps[i].micro), static_cast<int>(i)).second);
          }
          for (int m = 0; m < M; ++m) {
            for (int v = 0; v < V; ++v) {
              EXPECT_LT(at.at({true, v, m}), at.at({false, v, m}));
              if (v) {
                EXPECT_LT(at.at({true, v - 1, m}), at.at({true, v, m}));
              }
              if (v) {
                EXPECT_GT(at.at({false, v - 1, m}), at.at({false, v, m}));
              }
            }
          }
          const int w = warmup_forwards(p, s, S, M, V);
          EXPECT_EQ(w, std::min(M * V, 2 * (S - s - 1) + (V - 1) * S));
          EXPECT_EQ(peak_in_flight(steps), std::min(M * V, w + 1)) << S << " " << V << " " << M << " " << s;
          // the profile per virtual stage: a step's chunk counts its own, they add up to the
          // stage's, none below zero, none left at the end
          std::vector<int> last(static_cast<size_t>(V), 0);
          const std::vector<InFlight> prof = in_flight_profile(steps);
          for (size_t i = 0; i < prof.size(); ++i) {
            const InFlight& x = prof[i];
            EXPECT_EQ(x.chunk, steps[i].chunk);
            EXPECT_GE(x.chunk_forward_backward, 0);
            EXPECT_EQ(x.chunk_forward_backward, last[static_cast<size_t>(x.chunk)] + (steps[i].forward ? 1 : -1));
            last[static_cast<size_t>(x.chunk)] = x.chunk_forward_backward;
            EXPECT_EQ(std::accumulate(last.begin(), last.end(), 0), x.forward_backward);
          }
          EXPECT_EQ(std::count(last.begin(), last.end(), 0), V);
        }
        Status st = check_pipeline_order(p, S, M, {}, V);
        EXPECT_TRUE(st.is_ok()) << st.message();
      }
    }
  }
  std::string seq;
  for (const PipeStep& x : stage_steps(p, 1, 2, 4, 2)) seq += fmt::format("{}{}.{} ", x.forward ? 'F' : 'B', x.chunk, x.micro);
  EXPECT_EQ(seq, "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3 ");
  // stage 1 of 2 (V 2, M 4)
  const std::vector<InFlight> prof = in_flight_profile(stage_steps(p, 1, 2, 4, 2));
  EXPECT_EQ(prof[2].chunk_forward_backward, 1);  // F1.0: micro-batch 0 of the second range
  EXPECT_EQ(prof[2].forward_backward, 3);        // and 0, 1 of the first
  EXPECT_EQ(prof[7].chunk_forward_backward, 2);  // B0.0: 1 and 2 of the first range left
  // random times: the transfers' global order fits every rank's program
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int it = 0; it < 100; ++it) {
    int S = 2 + static_cast<int>(rng() % 3), V = 2 + static_cast<int>(rng() % 2), M = S * (1 + static_cast<int>(rng() % 3));
    PipelineTimes t;
    for (int c = 0; c < S * V; ++c) {
      t.forward_s.push_back(u(rng));
      t.backward_s.push_back(u(rng));
      if (c + 1 < S * V) t.transfer_s.push_back(rng() % 3 == 0 ? 0.0 : u(rng));
    }
    t.half_duplex = rng() % 2;
    Status st = check_pipeline_order(p, S, M, t, V);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  // 4 ranks, 8 micro-batches, a rank's forward 2 and backward 4 (two chunks: 1 and 2 each), free
  // transfers: 1F1B 8 x 6 + 3 x 6 = 66, interleaved 8 x 6 + 3 x 3 = 57
  PipelineTimes one{{2, 2, 2, 2}, {4, 4, 4, 4}, {0, 0, 0}};
  PipelineTimes two{std::vector<double>(8, 1.0), std::vector<double>(8, 2.0), std::vector<double>(7, 0.0)};
  auto a = simulate_pipeline(p, 8, one).value();
  auto b = simulate_pipeline(p, 8, two, 2).value();
  EXPECT_DOUBLE_EQ(a.step_s, 66.0);
  EXPECT_DOUBLE_EQ(b.step_s, 57.0);
  EXPECT_NEAR(b.bubble, 1 - 48.0 / 57.0, 1e-12);
  EXPECT_EQ(b.peak_in_flight[0], 11);  // 2 (S - 1) + (V - 1) S + 1 chunk steps: 5.5 micro-batches' activations
  // refused: another schedule, one stage, micro-batches not a multiple of the stages, too few blocks
  EXPECT_FALSE(check_virtual_stages(PipelineSchedule::kZBH1, 4, 8, 2).is_ok());
  EXPECT_FALSE(check_virtual_stages(p, 1, 8, 2).is_ok());
  EXPECT_NE(check_virtual_stages(p, 4, 6, 2).message().find("not a multiple of the 4 stages"), std::string::npos);
  EXPECT_NE(check_virtual_stages(p, 4, 8, 2, 6).message().find("need 8 block ranges"), std::string::npos);
  EXPECT_TRUE(check_virtual_stages(p, 4, 8, 2, 8).is_ok());
  EXPECT_FALSE(simulate_pipeline(p, 6, two, 2));
  EXPECT_TRUE(stage_steps(p, 0, 4, 6, 2).empty());
}

TEST(PipelineStages, CutsGivenOrBalanced) {
  auto c = cut_stages(12, 2, "0-5,6-11").value();
  EXPECT_EQ(stages_string(c), "0-5,6-11");
  EXPECT_EQ(stages_string(cut_stages(12, 4).value()), "0-2,3-5,6-8,9-11");
  EXPECT_EQ(stages_string(cut_stages(5, 2).value()), "0-2,3-4");
  // a costly first block (the embedding's stage) gets fewer blocks
  EXPECT_EQ(stages_string(cut_stages(4, 2, "", {3, 1, 1, 1}).value()), "0-0,1-3");
  EXPECT_EQ(stages_string(cut_stages(3, 3).value()), "0-0,1-1,2-2");
  struct Bad {
    int blocks, stages;
    std::string spec, words;
  };
  for (const Bad& b : {Bad{2, 3, "", "fewer than the stages"}, Bad{12, 2, "0-5,7-11", "starts at block 7, expected 6"},
                       Bad{12, 2, "0-5,6-4", "is empty"}, Bad{12, 2, "0-5", "blocks 6-11 are in no stage"},
                       Bad{12, 3, "0-5,6-11", "gives 2 stages, --pp 3"}, Bad{12, 2, "0-5,6-12", "past the model's last block 11"},
                       Bad{12, 2, "0-5,6+11", "is not FIRST-LAST"}, Bad{12, 0, "", "at least one stage"}}) {
    auto e = cut_stages(b.blocks, b.stages, b.spec);
    ASSERT_FALSE(e) << b.spec;
    EXPECT_NE(e.status().message().find(b.words), std::string::npos) << e.status().message();
  }
  EXPECT_TRUE(check_pipeline_batch(16, 2, 4, 2).is_ok());
  Status st = check_pipeline_batch(12, 2, 4, 1);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not split into dp 2 x 4 micro-batches x 1 chunks"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace oases
