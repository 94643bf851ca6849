// What a rank's run writes: checkpoints, gradient dumps, the step log, the trace, the reports.
#include <cstdio>
#include <filesystem>

#include "executor/checkpoint.h"
#include "executor/cpu/blas_select.h"
#include "importer/onnx_export.h"
#include "tools/rank_run.h"

namespace fs = std::filesystem;

namespace oases {

namespace {

std::string fmt_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

std::string sanitize(const std::string& name) {
  std::string r;
  for (char c : name) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return r;
}

}  // namespace

Status RankRun::save(int64_t step) {
  if (!guard_.validated() && (s_.have_val || !s_.fixed_feeds.empty())) {
    OASES_ASSIGN_OR_RETURN(double v, validate());
    guard_.after_validation(step, v);
  }
  OASES_RETURN_IF_ERROR(rules_->refuse_save(guard_, a_.save));
  Checkpoint ck;
  ck.fingerprint = s_.fingerprint;
  ck.step = step;
  ck.optimizer_kind = a_.optimizer;
  ck.optimizer_t = tr().optimizer().steps_taken();
  ck.sampler_state = sampler_.state();
  ck.seed = a_.seed;
  ck.tensors = gather_training_state(tr(), rt_, pspecs_, pshapes_, true);
  std::vector<std::string> names;
  for (size_t i = 0; i < tr().training_graph().params.size(); ++i) names.push_back(tr().param_name(i));
  return rules_->save(std::move(ck), a_.save, names);
}

Status RankRun::dump() {
  if (lead()) {
    std::error_code ec;
    fs::create_directories(a_.dump_grads, ec);
  }
  std::map<std::string, Tensor> full;
  for (size_t i = 0; i < tr().training_graph().params.size(); ++i) full[tr().param_name(i)] = rt_.gather(tr().gradient(i), pspecs_[i], pshapes_[i]);
  full = rules_->pooled(full);
  // numbered in the whole model's parameter order
  const TrainingGraph& whole = s_.gp().train;
  for (size_t i = 0; lead() && i < whole.params.size(); ++i) {
    std::string name = whole.graph.value(whole.params[i]).name;
    auto it = full.find(name);
    if (it == full.end()) return error("internal: no stage holds the gradient of '{}'", name);
    OASES_RETURN_IF_ERROR(write_tensor_file(it->second, name, fmt::format("{}/grad_{:04d}_{}.pb", a_.dump_grads, i, sanitize(name))));
  }
  if (lead() && !a_.quiet) std::fprintf(stderr, "wrote %zu gradients to %s\n", whole.params.size(), a_.dump_grads.c_str());
  return Status::ok();
}

// "training MODEL: N parameters ..." and the BLAS in use, on the lead
void RankRun::print_start() const {
  const TrainArgs& a = a_;
  const RankRuntime& rt = rt_;
  int64_t values = 0;
  for (const Shape& sh : s_.gp().param_shapes) values += shape_numel(sh);
  std::fprintf(stderr, "training %s: %zu parameters (%lld values), batch %lld x %lld tokens%s, %lld steps%s\n", a.model.c_str(),
               s_.gp().param_shapes.size(), static_cast<long long>(values), static_cast<long long>(s_.batch), static_cast<long long>(s_.seq),
               a.grad_accum > 1 ? fmt::format(" x {} micro-batches", a.grad_accum).c_str() : "", static_cast<long long>(a.steps),
               rules_->piped() ? fmt::format(", {} ranks (pp {} x {}, {}, {} micro-batches, stages {}, {})", rules_->everyone().size(), a.pp,
                                             s_.meshes_text(), a.pipeline,
                                             a.micro_batches, s_.plan().cuts(), rt.communicator() ? rt.communicator()->kind() : "local")
                                     .c_str()
               : rt.size() > 1 ? fmt::format(", {} ranks (tp {} x dp {}, {})", rt.size(), a.tp, a.dp,
                                             rt.communicator() ? rt.communicator()->kind() : "local")
                                     .c_str()
                               : "");
  std::fprintf(stderr, "blas: %s\n", blas_core_report().c_str());
}

// The step's line in --log-json and on stderr.
Status RankRun::log_step(const StepStats& st, int64_t done, const std::optional<double>& val) {
  double tps = static_cast<double>(tokens_per_step_) / (st.ms / 1000.0);
  if (log_) {
    nlohmann::json j{{"step", done}, {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"tokens_per_s", tps}, {"ms", st.ms},
                       {"run_ms", st.run_ms}, {"update_ms", st.update_ms}};
    if (val) j["val_loss"] = *val;
    if (st.device) {
      // run_ms and update_ms are then the device's time for the programs and for the update
      j["device"] = true;
      j["device_peak_mib"] = static_cast<double>(tr().peak_device_bytes()) / (1 << 20);
    }
    if (lsc_.dynamic) {
      j["loss_scale"] = scaler_.scale();
      j["skipped"] = st.skipped;
    }
    OASES_RETURN_IF_ERROR(log_->write(j.dump() + "\n"));
    OASES_RETURN_IF_ERROR(log_->flush());
  }
  if (lead() && !a_.quiet && (done % log_every_ == 0 || done == end_ || val)) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start_).count();
    double eta = elapsed / static_cast<double>(done - start_) * static_cast<double>(a_.steps - done);
    std::fprintf(stderr, "step %lld/%lld  loss %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  %.1f ms/step  ETA %s\n",
                 static_cast<long long>(done), static_cast<long long>(a_.steps), st.loss,
                 val ? fmt::format("  val loss {:.4f}", *val).c_str() : "", st.lr, st.grad_norm, tps, st.ms, fmt_eta(eta).c_str());
  }
  return Status::ok();
}

Status RankRun::write_trace() {
  std::vector<std::string> all = rules_->everyone().gather_strings(trace_json_.dump());
  if (!lead()) return Status::ok();
  nlohmann::json about{{"model", a_.model},   {"schedule", a_.schedule.empty() ? "plain (in line)" : a_.schedule},
                       {"chunks", a_.chunks}, {"tp", a_.tp},
                       {"dp", a_.dp},         {"emulated_link", a_.emulate_link}};
  if (rules_->piped()) {
    about["pp"] = a_.pp;
    about["pipeline"] = a_.pipeline;
    about["micro_batches"] = a_.micro_batches;
    about["stages"] = s_.plan().cuts();
  }
  size_t events = 0;
  OASES_RETURN_IF_ERROR(write_trace_file(all, about, a_.trace, &events));
  if (!a_.quiet) std::fprintf(stderr, "wrote trace %s (%zu events; open in https://ui.perfetto.dev)\n", a_.trace.c_str(), events);
  return Status::ok();
}

// After the last step: the trace, the reports, the final checkpoint, the export and the log.
Status RankRun::finish() {
  if (!a_.trace.empty()) OASES_RETURN_IF_ERROR(write_trace());
  if (a_.profile && lead()) prof_.print(tr().executor(), "step", static_cast<size_t>(a_.profile_nodes));
  if (lead() && !a_.quiet && !tr().device_notes().empty()) {
    std::fprintf(stderr, "device: %s; peak device memory %.0f MiB\n", tr().device_notes().c_str(),
                 static_cast<double>(tr().peak_device_bytes()) / (1 << 20));
  }
  if (a_.overlap_report && lead()) overlap_.print(sched_.has_value() && sched_->interleave, a_.schedule);
  if (!a_.save.empty() && a_.steps > 0) {
    OASES_RETURN_IF_ERROR(save(std::max(end_, start_)));
    if (lead() && !a_.quiet) std::fprintf(stderr, "saved checkpoint %s\n", a_.save.c_str());
  }
  if (!a_.export_onnx.empty()) {
    auto full = rules_->pooled(gather_training_state(tr(), rt_, pspecs_, pshapes_, false));
    if (lead()) {
      OASES_RETURN_IF_ERROR(export_with_initializers(a_.model, full, a_.export_onnx));
      if (!a_.quiet) std::fprintf(stderr, "wrote %s\n", a_.export_onnx.c_str());
    }
  }
  if (lead() && !a_.quiet && std::isfinite(first_val_) && std::isfinite(last_val_)) {
    std::fprintf(stderr, "validation loss %.4f -> %.4f\n", first_val_, last_val_);
  }
  if (log_) OASES_RETURN_IF_ERROR(log_->commit());
  return Status::ok();
}

}  // namespace oases
