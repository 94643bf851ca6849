#include "tools/train_driver.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "executor/checkpoint.h"
#include "executor/cpu/blas_select.h"
#include "executor/device.h"
#include "executor/emulated_link.h"
#include "executor/reshard_runner.h"
#include "executor/launcher.h"
#include "executor/loss_scaler.h"
#include "executor/profile_report.h"
#include "executor/run_report.h"
#include "executor/stage_rules.h"
#include "executor/test_hooks.h"
#include "graph/atomic_file.h"
#include "importer/onnx_export.h"
#include "tools/train_setup.h"

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
  std::vector<std::unique_ptr<CommGroup>> nccl_groups_;
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
  ProfileReport prof_;
};

// Under --pp, `rt_` is the rank's stage (its mesh, groups and rank in the stage) and `world` every
// rank of the run.
Status RankRun::start(RankRuntime* world) {
  const bool piped = s_.pipe.has_value();
  StageProgramInfo stage;
  OASES_ASSIGN_OR_RETURN(trainer_, make_trainer(s_, rt_, &nccl_groups_, &sched_, piped ? &stage : nullptr));
  if (piped) {
    rules_.emplace(rt_, *world, std::move(stage), s_.pipe->stages);
  } else {
    rules_.emplace(rt_);
  }
  tr().executor().state().seed = a_.seed;
  // fp16: dynamic loss scaling (a step with non-finite gradients is skipped and the scale halves)
  lsc_.dynamic = a_.dtype == "fp16";
  scaler_ = LossScaler(lsc_);
  // never apply a non-finite update: fp16 then lowers its scale, otherwise --on-nonfinite decides
  tr().skip_nonfinite = true;
  tracing_ = !a_.trace.empty() || a_.overlap_report;
  tr().executor().set_tracing(tracing_);
  gp_ = piped ? &s_.stage_program(rules_->stage()) : &s_.gp;
  if (piped) OASES_RETURN_IF_ERROR(rules_->check_transfers(*s_.pipe));
  pspecs_ = rules_->of_stage(gp_->param_specs);
  pshapes_ = rules_->of_stage(gp_->param_shapes);
  rules_->use_global_norm(tr(), pspecs_);
  OASES_RETURN_IF_ERROR(rules_->everyone().check_same("model or binary", s_.model_hash));
  if (!a_.resume.empty()) OASES_RETURN_IF_ERROR(resume());
  if (lead() && !a_.log_json.empty()) {
    OASES_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(a_.log_json, /*append=*/true));
    log_.emplace(std::move(f));
  }
  end_ = a_.stop_after > 0 ? std::min(a_.steps, start_ + a_.stop_after) : a_.steps;
  tokens_per_step_ = s_.batch * s_.seq * a_.grad_accum;
  log_every_ = a_.log_every > 0 ? a_.log_every : std::max<int64_t>(1, a_.steps / 20);
  return Status::ok();
}

Status RankRun::resume() {
  OASES_ASSIGN_OR_RETURN(Checkpoint ck, load_checkpoint(a_.resume));
  if (lead() && !ck.warning.empty()) std::fprintf(stderr, "warning: %s\n", ck.warning.c_str());
  if (ck.fingerprint != s_.fingerprint) {
    return error("{}: the checkpoint was written for another model (its parameters differ from {}'s)", a_.resume, a_.model);
  }
  if (ck.optimizer_kind != a_.optimizer) {
    return error("{}: the checkpoint holds {} state, this run uses --optimizer {}", a_.resume, ck.optimizer_kind, a_.optimizer);
  }
  OASES_RETURN_IF_ERROR(restore_training_state(ck, a_.resume, tr(), rt_, pspecs_, pshapes_));
  if (!ck.sampler_state.empty()) OASES_RETURN_IF_ERROR(sampler_.set_state(ck.sampler_state).with_context(a_.resume));
  start_ = ck.step;
  tr().executor().state().step = static_cast<uint64_t>(start_);
  if (lead() && !a_.quiet) std::fprintf(stderr, "resumed from %s at step %lld\n", a_.resume.c_str(), static_cast<long long>(start_));
  return Status::ok();
}

std::map<std::string, Tensor> RankRun::slice_feeds(const std::map<std::string, Tensor>& global) const {
  if (gp_->world <= 1) return global;
  const Graph& lg = trainer_->training_graph().graph;
  std::map<std::string, Tensor> local;
  for (const auto& [name, t] : global) {
    ValueId v = lg.find_value(name);
    if (v == kNoId) continue;
    local[name] = slice_for_rank(t, gp_->partitioned->specs[static_cast<size_t>(v)], rt_.mesh(), rt_.rank());
  }
  return local;
}

Expected<std::vector<std::map<std::string, Tensor>>> RankRun::next_feeds() {
  std::vector<std::map<std::string, Tensor>> micro;
  for (int64_t i = 0; i < a_.grad_accum; ++i) {
    if (!s_.fixed_feeds.empty()) {
      micro.push_back(slice_feeds(s_.fixed_feeds));
      continue;
    }
    OASES_ASSIGN_OR_RETURN(Batch b, sampler_.next(s_.batch, s_.seq));
    micro.push_back(slice_feeds(feeds_for_batch(s_.gp.train.graph, s_.roles, b)));
  }
  return micro;
}

// a pipeline evaluates by running every stage's program without dropout or update
Expected<double> RankRun::eval(const std::map<std::string, Tensor>& feeds) {
  if (!rules_->piped()) return tr().eval_loss(feeds);
  OASES_ASSIGN_OR_RETURN(double l, tr().program_loss(feeds));
  return rules_->from_last_stage(l);
}

Expected<double> RankRun::validate() {
  if (!s_.fixed_feeds.empty()) return eval(slice_feeds(s_.fixed_feeds));
  double sum = 0;
  for (int64_t i = 0; i < a_.val_batches; ++i) {
    Batch b = val_sampler_.at(i, s_.batch, s_.seq);
    OASES_ASSIGN_OR_RETURN(double l, eval(slice_feeds(feeds_for_batch(s_.gp.train.graph, s_.roles, b))));
    sum += l;
  }
  return sum / static_cast<double>(a_.val_batches);
}

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
  const TrainingGraph& whole = s_.gp.train;
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
  for (const Shape& sh : s_.gp.param_shapes) values += shape_numel(sh);
  std::fprintf(stderr, "training %s: %zu parameters (%lld values), batch %lld x %lld tokens%s, %lld steps%s\n", a.model.c_str(),
               s_.gp.param_shapes.size(), static_cast<long long>(values), static_cast<long long>(s_.batch), static_cast<long long>(s_.seq),
               a.grad_accum > 1 ? fmt::format(" x {} micro-batches", a.grad_accum).c_str() : "", static_cast<long long>(a.steps),
               rules_->piped() ? fmt::format(", {} ranks (pp {} x {}, {}, {} micro-batches, stages {}, {})", rules_->everyone().size(), a.pp,
                                             a.stage_meshes.empty() ? fmt::format("tp {} x dp {}", a.tp, a.dp) : "meshes " + a.stage_meshes, a.pipeline,
                                             a.micro_batches, stages_string(s_.pipe->cuts), rt.communicator() ? rt.communicator()->kind() : "local")
                                     .c_str()
               : rt.size() > 1 ? fmt::format(", {} ranks (tp {} x dp {}, {})", rt.size(), a.tp, a.dp,
                                             rt.communicator() ? rt.communicator()->kind() : "local")
                                     .c_str()
                               : "");
  std::fprintf(stderr, "blas: %s\n", blas_core_report().c_str());
}

// What comes before the first step: the parameter report, --dump-grads with --steps 0, the banner
// and the first validation loss.
Status RankRun::before_training() {
  if (lead() && !a_.quiet) {
    // which initializers train, and why each buffer does not (graph/parameters.h)
    for (const std::string& line : describe_parameter_split(s_.gp.train.graph, s_.gp.train.roles)) std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (a_.steps == 0 && !a_.dump_grads.empty()) {
    OASES_ASSIGN_OR_RETURN(auto micro, next_feeds());
    OASES_ASSIGN_OR_RETURN(double l, tr().compute_gradients(micro[0]));
    l = rules_->from_last_stage(l);
    if (lead()) std::printf("loss %.6f\n", l);
    OASES_RETURN_IF_ERROR(dump());
  }
  if (lead() && !a_.quiet && a_.steps > start_) print_start();
  run_start_ = std::chrono::steady_clock::now();
  if (s_.have_val && !a_.quiet && start_ < a_.steps && s_.fixed_feeds.empty()) {
    OASES_ASSIGN_OR_RETURN(double v, validate());
    first_val_ = v;
    guard_.after_validation(start_, v);
    if (lead()) std::fprintf(stderr, "step %lld  val loss %.4f\n", static_cast<long long>(start_), v);
  }
  tr().executor().set_profiling(a_.profile);
  return Status::ok();
}

// The loss scale after a step, and the step's trace events.
void RankRun::after_update(const StepStats& st, int64_t step) {
  if (lsc_.dynamic) {
    double used = scaler_.scale();
    scaler_.update(!st.skipped);
    if (st.skipped && lead() && !a_.quiet) {
      std::fprintf(stderr, "step %lld: non-finite gradients at loss scale %g; update skipped, scale now %g\n",
                   static_cast<long long>(step + 1), used, scaler_.scale());
    }
  }
  if (tracing_) {
    std::vector<TraceEvent> ev = tr().executor().take_events();
    int64_t done_steps = step - start_;
    const Graph& run_graph = tr().executor().graph();  // the program's graph (with the executor's fused nodes)
    overlap_.add(run_graph, ev, st.ms, done_steps >= 1);
    if (!a_.trace.empty() && done_steps >= 1 && done_steps <= a_.trace_steps) {
      append_trace(run_graph, ev, rules_->world_rank(), &trace_json_, rules_->stage());
    }
  }
}

Status RankRun::check_nonfinite(const StepStats& st, int64_t step) const {
  if (st.skipped && !lsc_.dynamic) {
    if (a_.on_nonfinite == "stop") {
      return error("step {}: the loss is {} and the gradient norm {}: stopped before the update, nothing saved (lower --lr?)", step + 1,
                   st.loss, st.grad_norm);
    }
    if (lead()) {
      std::fprintf(stderr, "warning: step %lld: the loss is %g and the gradient norm %g: update skipped\n",
                   static_cast<long long>(step + 1), st.loss, st.grad_norm);
    }
  } else if (!std::isfinite(st.loss)) {
    return error("step {}: the loss is {} (lower --lr?)", step + 1, st.loss);
  }
  return Status::ok();
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

Status RankRun::step(int64_t step) {
  OASES_RETURN_IF_ERROR(fault_.at_step(rules_->world_rank(), step));
  OASES_ASSIGN_OR_RETURN(auto micro, next_feeds());
  bool dump_now = !a_.dump_grads.empty() && step == start_;
  if (lsc_.dynamic) tr().set_loss_scale(scaler_.scale());
  OASES_ASSIGN_OR_RETURN(StepStats st, tr().step(micro, dump_now ? std::function<Status()>([this] { return dump(); }) : std::function<Status()>()));
  st.loss = rules_->from_last_stage(st.loss);
  guard_.after_step(step + 1, st.loss, !st.skipped);
  after_update(st, step);
  OASES_RETURN_IF_ERROR(check_nonfinite(st, step));
  if (a_.profile && step > start_) prof_.add(tr().executor(), st.ms, st.device ? &st : nullptr);
  int64_t done = step + 1;
  std::optional<double> val;
  if (s_.have_val && ((a_.val_every > 0 && done % a_.val_every == 0) || done == end_)) {
    OASES_ASSIGN_OR_RETURN(double v, validate());
    val = v;
    last_val_ = v;
    guard_.after_validation(done, v);
  }
  OASES_RETURN_IF_ERROR(log_step(st, done, val));
  if (!a_.save.empty() && a_.save_every > 0 && done % a_.save_every == 0 && done != end_) OASES_RETURN_IF_ERROR(save(done));
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
    about["stages"] = stages_string(s_.pipe->cuts);
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

// One rank's training loop. Under --pp, `rt` is the rank's stage (its mesh, groups and rank in
// the stage) and `world` every rank of the run: the loss comes from the last stage, the gradient
// norm sums the stages (a tied weight counted once), and checkpoints, gradient dumps and exports
// pool every stage's parameters on world rank 0 (executor/stage_rules.h).
Status run_rank(const TrainSetup& s, RankRuntime& rt, RankRuntime* world = nullptr) {
  if (s.pipe.has_value() && !world) return Status::error("internal: a pipeline rank needs the world's runtime");
  RankRun run(s, rt);
  OASES_RETURN_IF_ERROR(run.start(world));
  OASES_RETURN_IF_ERROR(run.before_training());
  for (int64_t step = run.first_step(); step < run.end_step(); ++step) OASES_RETURN_IF_ERROR(run.step(step));
  return run.finish();
}


}  // namespace

int run_training(TrainArgs& a, int argc, char** argv) {
  if (a.device == "cuda") {
    if (Status st = cuda_usable(); !st.is_ok()) return fail_with(st);
    if (!a.trace.empty() || a.overlap_report) {
      return fail_with(
          Status::error("--trace and --overlap-report time the CPU executor's threads; with --device cuda use Nsight Systems"));
    }
  }
  // one rank, N threads, or MPI processes
  LaunchOptions lo;
  lo.local_ranks = a.local_ranks;
  lo.threads = a.threads;
  lo.comm_timeout = a.comm_timeout;
  auto launcher = RankLauncher::start(&argc, &argv, lo);
  if (!launcher) return fail_with(launcher.status());
  RankLauncher& l = **launcher;
  auto setup = prepare_training(a, l.world());
  if (!setup) return l.fail_before_run(setup.status());
  LinkModel link;
  if (!a.emulate_link.empty()) {
    auto lm = parse_link_model(a.emulate_link);
    if (!lm) return fail_with(lm.status());
    link = *lm;
  }
  // groups inside one emulated host are not slowed; the link emulated is the one between hosts
  if (!setup->host_of.empty()) set_emulated_hosts(setup->host_of);
  if (!setup->pipe) return l.run(setup->gp.mesh(), link, [&](RankRuntime& rt) { return run_rank(*setup, rt); });
  // a pipeline: the world's ranks, each running its stage on the stage's own mesh
  const PipelineLayout& pl = *setup->pipe;
  Mesh everyone{{"world"}, {pl.world()}, {}};
  const bool cards = a.hosts > 1 && link.enabled();
  int rc = l.run(everyone, link, [&](RankRuntime& world) -> Status {
    if (cards) {
      // the emulated hosts' network cards: lock files in a folder world rank 0 makes
      std::string dir = world.gather_strings(world.rank() == 0 ? make_cards_folder() : "")[0];
      if (dir.empty()) return error("cannot make a folder for the emulated hosts' cards in {}", fs::temp_directory_path().string());
      set_emulated_cards_dir(dir);
    }
    const int st = pl.stage_of_rank(world.rank());
    PlacedMesh placed = PlacedMesh::contiguous(setup->stage_program(st).mesh(), pl.first_rank(st));
    OASES_ASSIGN_OR_RETURN(auto stage_rt, RankRuntime::create(world.communicator(), placed, link));
    return run_rank(*setup, *stage_rt, &world);
  });
  if (cards && l.process_rank() == 0 && !emulated_cards_dir().empty()) {
    std::error_code ec;
    fs::remove_all(emulated_cards_dir(), ec);
  }
  return rc;
}

}  // namespace oases
