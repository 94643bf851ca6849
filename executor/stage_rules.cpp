#include "executor/stage_rules.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "executor/training.h"

namespace oases {

std::vector<double> counted_sum_squares(const std::vector<double>& ss, const std::vector<bool>& counts_in_norm) {
  std::vector<double> counted = ss;
  for (size_t i = 0; i < counted.size(); ++i) {
    if (!counts_in_norm[i]) counted[i] = 0;
  }
  return counted;
}

void drop_tied_copies(std::map<std::string, Tensor>* tensors, const std::vector<std::string>& param_names,
                      const std::vector<bool>& counts_in_norm) {
  for (size_t i = 0; i < counts_in_norm.size(); ++i) {
    if (counts_in_norm[i]) continue;
    const std::string& name = param_names.at(i);
    tensors->erase(name);
    for (const char* suffix : kOptimizerStateSuffixes) tensors->erase(name + suffix);
  }
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

double StageRules::from_last_stage(double x) {
  return piped() ? world_->sum(last_stage() && rt_.rank() == 0 ? x : 0.0) : x;
}

std::map<std::string, Tensor> StageRules::pooled(const std::map<std::string, Tensor>& full) {
  // one copy per stage is sent: the stage's other ranks hold the same tensors
  return piped() ? world_->merge_tensors(rt_.rank() == 0 ? full : std::map<std::string, Tensor>{}) : full;
}

Status StageRules::check_transfers(const Plan& plan) {
  if (!piped()) return Status::ok();
  std::vector<std::vector<std::string>> all;
  std::vector<int> stage_of;
  for (const std::string& text : world_->gather_strings(join_lines(stage_.transfers))) {
    all.push_back(split_lines(text));
    stage_of.push_back(plan.stage_of_rank(static_cast<int64_t>(stage_of.size())));
  }
  return check_stage_transfers(stage_of, all);
}

double StageRules::global_norm(const std::vector<double>& ss, const std::vector<ShardingSpec>& specs) {
  if (!piped()) return std::sqrt(rt_.global_sum_squares(ss, specs));
  // the stage's sum once (its rank 0's: every rank of the stage has it after the stage's reduction)
  double mine = rt_.global_sum_squares(counted_sum_squares(ss, stage_.counts_in_norm), specs);
  return std::sqrt(world_->sum(rt_.rank() == 0 ? mine : 0.0));
}

void StageRules::use_global_norm(Trainer& tr, const std::vector<ShardingSpec>& specs) {
  // one rank keeps the trainer's own norm (the same value, summed in its own order)
  if (!piped() && !rt_.distributed()) return;
  tr.global_norm = [this, &specs](const std::vector<double>& ss) { return global_norm(ss, specs); };
}

Status StageRules::refuse_save(const CheckpointGuard& guard, const std::string& path) {
  return CheckpointGuard::refuse_save(everyone().gather_strings(guard.refusal()), path);
}

Status StageRules::save(Checkpoint ck, const std::string& path, const std::vector<std::string>& param_names) {
  if (!piped()) return lead() ? save_checkpoint(ck, path) : Status::ok();
  drop_tied_copies(&ck.tensors, param_names, stage_.counts_in_norm);
  // one id per save, in every stage file and the manifest: a stage file left from another save is refused
  const int64_t save_id = static_cast<int64_t>(
      world_->sum(lead() ? static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() % (int64_t{1} << 50)) : 0.0));
  ck.extra_json = nlohmann::json{{"pipeline_save", save_id}, {"stage", stage_.stage}, {"stages", stages_}}.dump();
  Status st = rt_.rank() == 0 ? save_checkpoint(ck, stage_checkpoint_path(path, stage_.stage, stages_)) : Status::ok();
  // every rank learns whether any stage failed, so none goes on as if the save were whole
  double failed = world_->sum(st.is_ok() ? 0.0 : 1.0);
  if (!st.is_ok()) return st;
  if (failed > 0) return error("{}: not written: another stage could not write its file", path);
  return lead() ? save_stage_manifest(path, stages_, ck.step, ck.fingerprint, save_id) : Status::ok();
}

}  // namespace oases
