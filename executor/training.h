// Training on one rank (the training graph itself: graph/training_graph.h): how a batch of
// tokens feeds the model's inputs, the Trainer (gradient accumulation, optimizer step, evaluation)
// (checkpoints: executor/checkpoint.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/data.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/optimizer.h"
#include "executor/zero.h"
#include "graph/graph.h"
#include "graph/training_graph.h"

namespace oases {

// How each graph input is fed from a token batch.
struct InputRole {
  // kDecoderTokens: an encoder-decoder model's decoder input, fed the batch's tokens as the
  // encoder is; the appended loss predicts its next token (as for kTokens in a decoder-only model)
  // kImage: a float input [B, C, H, W, ...] (a vision model's pixel_values): each image is drawn
  // standard normal (the range an image processor's normalised pixels have), from a generator
  // seeded by its batch row's tokens, so the same batch gives the same images on every rank, after
  // a resume and under any chunking. An image classifier's targets (logits [B, classes]) are one
  // label per row: the row's first target token, uniform over the classes with --synthetic.
  enum Kind { kTokens, kTargets, kOnes, kPositions, kZeros, kDecoderTokens, kImage };
  ValueId value = kNoId;
  std::string name;
  Kind kind = kTokens;
};
Expected<std::vector<InputRole>> input_roles(const Graph& g, ValueId appended_targets);
// Batch -> input tensors (int64 or int32 as each input wants).
std::map<std::string, Tensor> feeds_for_batch(const Graph& g, const std::vector<InputRole>& roles, const Batch& b);
// For --inputs DIR: targets of the appended loss are the token inputs shifted left, the last
// position ignored (what the reference scripts compute).
Tensor shifted_targets(const Tensor& tokens, int64_t ignore_index);

struct StepStats {
  double loss = 0;  // mean over micro-batches
  double grad_norm = 0;
  double lr = 0;
  double ms = 0;
  double run_ms = 0;     // of ms: running the training program (forward, backward, collectives; on a
                         // GPU also the uploads and the copies back), summed over micro-batches
  double update_ms = 0;  // of ms: the rest, gradient accumulation, norm and the optimizer update
  bool skipped = false;  // non-finite gradients with skip_nonfinite: nothing was updated
  // State resident on a device (DeviceTrainer): run_ms and update_ms are then the device's time for
  // the micro-batches' programs and for the update (CUDA events), and ms − both the host's share.
  bool device = false;
};

// The rule for checkpoints: a state whose loss or validation loss is not finite is never saved.
// Saving it would replace the last good checkpoint with one a resume stops at at once. Told each
// step's loss (and whether the step updated the parameters) and each validation loss, it knows
// what was seen of the current state: an update starts a new state, not yet validated (its step's
// loss was the old state's), which the caller validates before saving it; a skipped update
// (--on-nonfinite skip) keeps the state its non-finite loss came from. The losses must be the
// run's (the last stage's in a pipeline); ranks that may disagree agree through refuse_save over
// every rank's refusal().
class CheckpointGuard {
 public:
  // Step `step` (counted from 1) had this loss and, unless `updated` is false, changed the parameters.
  void after_step(int64_t step, double loss, bool updated);
  // The validation loss of the state after step `step` (0: before the first).
  void after_validation(int64_t step, double loss);
  // Whether the current state has a validation loss (none since it was made or loaded: validate
  // it before a save).
  bool validated() const { return validated_; }
  // "" when the state may be saved, else why not ("the validation loss after step 3 is nan").
  const std::string& refusal() const { return refusal_; }
  // The save to `path` refused for the first reason any rank gave (`refusals`: each rank's
  // refusal(), "" for none): one line "<path>: not written: <reason> (...)", or ok.
  static Status refuse_save(const std::vector<std::string>& refusals, const std::string& path);

 private:
  std::string refusal_;
  bool validated_ = false;
};

class Trainer {
 public:
  static Expected<std::unique_ptr<Trainer>> create(TrainingGraph tg, OptimizerConfig opt, int threads = 0);
  // With execution options (communication groups of a distributed rank).
  static Expected<std::unique_ptr<Trainer>> create(TrainingGraph tg, OptimizerConfig opt, const ExecOptions& eo);
  // Runs `compiled`, the training program of `tg` built already (planner/rank_program.h).
  static Expected<std::unique_ptr<Trainer>> create(TrainingGraph tg, OptimizerConfig opt, const ExecOptions& eo, Program compiled);
  // Global gradient norm from each parameter's local Σ g² (a distributed run sums shards over
  // their groups); unset: the plain norm over this rank's gradients.
  std::function<double(const std::vector<double>&)> global_norm;
  // Loss scaling (mixed precision, executor/loss_scaler.h). For a graph with the loss-scale input
  // (graph/passes/mixed_precision.h insert_loss_scale_input) the backward pass starts from this
  // value instead of 1; reported losses, gradient() and the update divide it out again.
  void set_loss_scale(double s);
  double loss_scale() const { return loss_scale_; }
  // Skip the update (parameters and optimizer state untouched) when the gradient norm or the loss
  // is not finite (a non-finite loss on any rank makes the global norm NaN: all ranks skip alike).
  bool skip_nonfinite = false;

  // One optimizer step over the given micro-batches (gradients averaged). `before_update` runs
  // after the gradients are complete and before the parameters change (e.g. to dump them).
  Expected<StepStats> step(const std::vector<std::map<std::string, Tensor>>& micro_batches,
                           const std::function<Status()>& before_update = {});
  // Loss and gradients of one batch without updating anything.
  Expected<double> compute_gradients(const std::map<std::string, Tensor>& feeds);
  // Forward-only loss (validation).
  Expected<double> eval_loss(const std::map<std::string, Tensor>& feeds);
  // The loss of the whole training program run without dropout and without any update (a
  // pipeline stage's validation: every stage runs its part, the last has the loss; others 0).
  Expected<double> program_loss(const std::map<std::string, Tensor>& feeds);

  const TrainingGraph& training_graph() const { return tg_; }
  Executor& executor() { return *train_; }
  Optimizer& optimizer() { return opt_; }
  // Gradient of parameter i after compute_gradients/step (accumulated, unscaled mean), whole on
  // this rank (under the distributed optimizer gathered from the pieces: collective over its group).
  Tensor gradient(size_t i) const;
  // The distributed optimizer's pieces (executor/zero.h): empty unless the program reduce-scatters
  // gradients (--zero 1). Optimizer state of such a parameter is its piece's.
  const ZeroShards& zero() const { return zero_; }
  // Under the distributed optimizer: parameter i with replicated[i] (held whole by every member of
  // `group`, its gradient given whole and equal on each: a tied weight's, summed across stages)
  // shares its optimizer state over `group` too. Before the first step or state restore.
  void zero_whole_gradients(CommGroup* group, const std::vector<bool>& replicated);
  // Current value of every trainable parameter, by initializer name (on a device: read back first;
  // the tensors are the host copies the optimizer and the program's constants share).
  std::map<std::string, Tensor> parameters();
  // The optimizer's checkpoint state (Optimizer::state), read back from a device first; whole
  // tensors of the parameters' shapes (the distributed optimizer's pieces gathered: collective).
  std::map<std::string, Tensor> optimizer_state();
  // Restores the optimizer state (Optimizer::set_state, whole tensors: the distributed optimizer
  // keeps its pieces) after the parameters' host copies were written: a device takes both before
  // the next step.
  Status set_optimizer_state(const std::map<std::string, Tensor>& s, int64_t t);
  // Device memory this trainer's program and state hold at most (0 on the CPU), and how its steps
  // run there (for --verbose).
  size_t peak_device_bytes() const;
  std::string device_notes() const;
  std::string param_name(size_t i) const { return tg_.graph.value(tg_.params[i]).name; }
  // Identity of the model for checkpoints: names, shapes and dtypes of the trainable parameters.
  std::string fingerprint() const;

 private:
  explicit Trainer(OptimizerConfig opt) : opt_(std::move(opt)) {}
  Status run_micro(const std::map<std::string, Tensor>& feeds, bool accumulate, double* loss, bool training = true);
  // The distributed optimizer's all-gathers of the updated parameters are left to the next run of
  // the training program (Executor::defer_constant_writes: beside its first instructions, each
  // bucket awaited before its parameters are read); anything else that reads the parameters
  // finishes them first.
  void hand_gathers_to_next_run();
  void finish_gathers();
  // The buckets, in order of first use (the program and the parameters' storage never change: made once).
  const std::vector<Executor::ConstantWrite>& gather_writes();
  bool gathers_pending_ = false;
  std::vector<Executor::ConstantWrite> gather_writes_;
  Expected<StepStats> device_step(const std::vector<std::map<std::string, Tensor>>& micro, const std::function<Status()>& before_update);
  // The device's parameters and moments into the host copies (when the device has newer ones),
  // and the host's to the device (when the host changed them).
  void pull_from_device();
  Status push_to_device();
  // The host copies of every parameter and its optimizer moments, in parameter order.
  void host_state(std::vector<Tensor*>* params, std::vector<std::vector<Tensor*>>* moments);

  TrainingGraph tg_;
  std::unique_ptr<Executor> train_, eval_;  // eval_: made by the first eval_loss
  ExecOptions exec_opts_;
  Optimizer opt_;
  std::vector<Tensor> accum_;  // gradient accumulators (multi-micro-batch steps)
  ZeroShards zero_;            // the distributed optimizer's pieces (none without --zero)
  int micro_in_accum_ = 0;
  double loss_scale_ = 1.0;
  // state resident on a device (executor/device.h); null on the CPU or where the device cannot
  // hold it (device_notes_ says why; the host optimizer then updates and re-uploads)
  std::unique_ptr<DeviceTrainer> dev_;
  std::string device_notes_;
  bool host_stale_ = false;    // the device's parameters and moments are newer than the host's
  bool device_stale_ = false;  // the host's are newer than the device's
  bool device_grads_ = false;  // the last gradients are the device trainer's (gradient() reads them there)
};

}  // namespace oases
