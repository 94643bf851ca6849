#include "tools/rank_run.h"

namespace oases {

// Under --pp, `rt_` is the rank's stage (its mesh, groups and rank in the stage) and `world` every
// rank of the run.
Status RankRun::start(RankRuntime* world) {
  const bool piped = s_.piped();
  StageProgramInfo stage;
  OASES_ASSIGN_OR_RETURN(trainer_, make_trainer(s_, rt_, &device_comms_, &sched_, piped ? &stage : nullptr));
  if (piped) {
    rules_.emplace(rt_, *world, std::move(stage), static_cast<int>(s_.plan().num_stages()));
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
  gp_ = piped ? &s_.stage_program(rules_->stage()) : &s_.gp();
  if (piped) OASES_RETURN_IF_ERROR(rules_->check_transfers(s_.plan()));
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
    micro.push_back(slice_feeds(feeds_for_batch(s_.gp().train.graph, s_.roles, b)));
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
    OASES_ASSIGN_OR_RETURN(double l, eval(slice_feeds(feeds_for_batch(s_.gp().train.graph, s_.roles, b))));
    sum += l;
  }
  return sum / static_cast<double>(a_.val_batches);
}

// What comes before the first step: the parameter report, --dump-grads with --steps 0, the banner
// and the first validation loss.
Status RankRun::before_training() {
  if (lead() && !a_.quiet) {
    // which initializers train, and why each buffer does not (graph/parameters.h)
    for (const std::string& line : describe_parameter_split(s_.gp().train.graph, s_.gp().train.roles)) std::fprintf(stderr, "%s\n", line.c_str());
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
  tr().executor().set_node_timing(a_.profile);
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

}  // namespace oases
