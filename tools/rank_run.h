// oases-train's run of one rank (tools/train_driver.cpp makes one per rank): its steps are in
// rank_run.cpp, what it writes (checkpoints, dumps, logs, traces, reports) in rank_run_output.cpp.
#pragma once

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/loss_scaler.h"
#include "executor/node_time_report.h"
#include "executor/run_report.h"
#include "executor/stage_rules.h"
#include "executor/test_hooks.h"
#include "graph/atomic_file.h"
#include "tools/train_setup.h"

namespace oases {

// One rank's training run: its trainer, data, checkpoints, logs and reports. What ties a
// pipeline's ranks into one model (the loss of the last stage, the norm, per-stage checkpoints,
// pooled tensors) is executor/stage_rules.h; `rules` is the plain run's version of it otherwise.
// Collectives happen in the same order on every rank: each method is called by all ranks alike.
class RankRun {
 public:
  RankRun(const TrainSetup& s, RankRuntime& rt)
      : s_(s),
        a_(s.a),
        rt_(rt),
        sampler_(&s.data.tokens, 0, s.split, s.a.seed),
        val_sampler_(&s.data.tokens, s.split, static_cast<int64_t>(s.data.tokens.size()), s.a.seed + 1),
        fault_(TestFault::from_env()) {}
  RankRun(const RankRun&) = delete;  // the trainer's norm holds a reference to pspecs_
  RankRun& operator=(const RankRun&) = delete;
  // The step log replaces its file when the run ends, also when it stops with an error.
  ~RankRun() {
    if (log_ && log_->is_open()) (void)log_->commit();
  }

  Status start(RankRuntime* world);
  Status before_training();
  int64_t first_step() const { return start_; }
  int64_t end_step() const { return end_; }
  Status step(int64_t step);
  Status finish();

 private:
  Trainer& tr() { return *trainer_; }
  bool lead() const { return rules_->lead(); }
  Status resume();
  std::map<std::string, Tensor> slice_feeds(const std::map<std::string, Tensor>& global) const;
  Expected<std::vector<std::map<std::string, Tensor>>> next_feeds();
  Expected<double> eval(const std::map<std::string, Tensor>& feeds);
  Expected<double> validate();
  Status save(int64_t step);
  Status dump();
  void print_start() const;
  void after_update(const StepStats& st, int64_t step);
  Status check_nonfinite(const StepStats& st, int64_t step) const;
  Status log_step(const StepStats& st, int64_t done, const std::optional<double>& val);
  Status write_trace();

  const TrainSetup& s_;
  const TrainArgs& a_;
  RankRuntime& rt_;
  DeviceComms device_comms_;
  std::optional<ScheduleOptions> sched_;
  std::unique_ptr<Trainer> trainer_;
  std::optional<StageRules> rules_;
  const GlobalProgram* gp_ = nullptr;  // this rank's program (a pipeline rank: its stage's)
  std::vector<ShardingSpec> pspecs_;   // this rank's parameters: their layouts and global shapes
  std::vector<Shape> pshapes_;
  BatchSampler sampler_, val_sampler_;
  LossScalerConfig lsc_;
  LossScaler scaler_;
  bool tracing_ = false;
  // never save a non-finite state (executor/training.h): every rank refuses alike, before the
  // save's collectives, and the file keeps what it held
  CheckpointGuard guard_;
  // The step log grows in LOG.tmp (after LOG's old lines: resumed runs append) and replaces LOG
  // when the run ends, also when it stops with an error: a full disk is reported at the step it
  // fills and never leaves an empty or cut LOG.
  std::optional<AtomicFile> log_;
  int64_t start_ = 0, end_ = 0, tokens_per_step_ = 0, log_every_ = 1;
  std::chrono::steady_clock::time_point run_start_;
  double first_val_ = NAN, last_val_ = NAN;
  OverlapStats overlap_;
  nlohmann::json trace_json_ = nlohmann::json::array();
  const TestFault fault_;  // the tests of peer failures
  NodeTimeReport prof_;
};

}  // namespace oases
