// The rules that make a pipeline's ranks train as one model (oases-train --pp): the loss comes from
// the last stage, the gradient norm counts a tied weight once, every rank of two stages agrees on
// the transfers between them, a checkpoint is saved per stage under a manifest, and each stage's
// full tensors are pooled on every rank. A run without a pipeline uses the same interface with
// the plain rules (its ranks are everyone), so the trainer's loop has no pipeline branches.
//
// Every method that talks to other ranks is collective over everyone(): all ranks call it, in the
// same order.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/checkpoint.h"
#include "executor/distributed.h"
#include "planner/pipeline_program.h"

namespace oases {

class CheckpointGuard;  // executor/training.h
class Trainer;          // executor/training.h

// Each parameter's Σ g² as the pipeline's norm counts it: 0 for a tied weight's copy past its
// first holder (counts_in_norm false), so the weight is counted once over the stages.
std::vector<double> counted_sum_squares(const std::vector<double>& ss, const std::vector<bool>& counts_in_norm);
// Removes from a stage's checkpoint tensors the tied weights' copies past their first holder and
// their optimizer state (kOptimizerStateSuffixes): each tensor is in one stage file only.
// `param_names` and `counts_in_norm` are per stage parameter, in the same order.
void drop_tied_copies(std::map<std::string, Tensor>* tensors, const std::vector<std::string>& param_names,
                      const std::vector<bool>& counts_in_norm);
// A rank's transfer list as one string (a line each) and back, for gather_strings.
std::string join_lines(const std::vector<std::string>& lines);
std::vector<std::string> split_lines(const std::string& text);

class StageRules {
 public:
  // A run without a pipeline: `rt` holds every rank.
  explicit StageRules(RankRuntime& rt) : rt_(rt) {}
  // A pipeline rank: `rt` is its stage's runtime (stage mesh, groups, rank in the stage), `world`
  // every rank of the run, `stage` what its stage program holds (planner/pipeline_program.h).
  StageRules(RankRuntime& rt, RankRuntime& world, StageProgramInfo stage, int stages)
      : rt_(rt), world_(&world), stage_(std::move(stage)), stages_(stages) {}

  bool piped() const { return world_ != nullptr; }
  RankRuntime& everyone() const { return piped() ? *world_ : rt_; }
  int world_rank() const { return everyone().rank(); }
  // World rank 0: the rank that prints, logs and writes the run's single files.
  bool lead() const { return world_rank() == 0; }
  int stage() const { return piped() ? stage_.stage : -1; }
  int stages() const { return stages_; }
  bool last_stage() const { return !piped() || stage_.stage == stages_ - 1; }
  const StageProgramInfo& stage_info() const { return stage_; }

  // This rank's entries of a per-parameter table of the whole model (its stage's parameters).
  template <class T>
  std::vector<T> of_stage(const std::vector<T>& all) const {
    if (!piped()) return all;
    std::vector<T> mine;
    for (size_t i : stage_.param_index) mine.push_back(all.at(i));
    return mine;
  }

  // The value the last stage's rank 0 has (the loss: other stages compute none), on every rank.
  double from_last_stage(double x);
  // Every stage's full tensors (given on each rank of the stage; its rank 0's copy is sent), on
  // every rank. A tied weight's copies must be bit-equal (RankRuntime::merge_tensors).
  std::map<std::string, Tensor> pooled(const std::map<std::string, Tensor>& full);

  // Every rank of two stages must list the same transfers between them, else both would wait
  // forever at the first step: an error names the first two ranks that differ.
  Status check_transfers(const Plan& plan);  // `plan`: the pipeline's stages and their ranks

  // The global gradient norm from this rank's per-parameter Σ g² (`specs`: their shardings over
  // the stage's mesh): a pipeline sums the stages, a tied weight once; a distributed run sums the
  // shards over their groups.
  double global_norm(const std::vector<double>& ss, const std::vector<ShardingSpec>& specs);
  // Sets tr.global_norm to global_norm over `specs` (these rules and `specs` are kept by
  // reference: both must outlive `tr`'s steps); a single rank leaves the trainer's own norm.
  void use_global_norm(Trainer& tr, const std::vector<ShardingSpec>& specs);

  // The save to `path` refused everywhere when any rank's guard refuses it.
  Status refuse_save(const CheckpointGuard& guard, const std::string& path);
  // Writes `ck`, this rank's full tensors (gathered over its stage), as the run's checkpoint at
  // `path`. Without a pipeline the lead writes it. A pipeline writes per stage: each stage's rank
  // 0 writes its file (stage_checkpoint_path) without the tied copies past their first holder
  // (`param_names`: the stage's parameters), all under one save id; a stage that fails is
  // reported on every rank, and the lead writes the manifest only after every stage file.
  Status save(Checkpoint ck, const std::string& path, const std::vector<std::string>& param_names);

 private:
  RankRuntime& rt_;
  RankRuntime* world_ = nullptr;
  StageProgramInfo stage_;
  int stages_ = 1;
};

}  // namespace oases
