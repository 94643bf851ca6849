#include "tools/train_driver.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

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

// One rank's training loop. Under --pp, `rt` is the rank's stage (its mesh, groups and rank in
// the stage) and `world` every rank of the run: the loss comes from the last stage, the gradient
// norm sums the stages (a tied weight counted once), and checkpoints, gradient dumps and exports
// pool every stage's parameters on world rank 0.
Status run_rank(const TrainSetup& s, RankRuntime& rt, RankRuntime* world = nullptr) {
  const TrainArgs& a = s.a;
  const bool piped = s.pipe.has_value();
  if (piped && !world) return Status::error("internal: a pipeline rank needs the world's runtime");
  const int world_rank = piped ? world->rank() : rt.rank();
  bool lead = world_rank == 0;
  std::vector<std::unique_ptr<CommGroup>> nccl_groups;
  std::optional<ScheduleOptions> sched;
  StageProgramInfo stage;
  OASES_ASSIGN_OR_RETURN(auto trainer, make_trainer(s, rt, &nccl_groups, &sched, piped ? &stage : nullptr));
  Trainer& tr = *trainer;
  RankRuntime& everyone = piped ? *world : rt;
  const bool last_stage = !piped || stage.stage == s.pipe->stages - 1;
  // the loss (and anything only the last stage has) on every rank
  auto from_last_stage = [&](double x) { return piped ? world->sum(last_stage && rt.rank() == 0 ? x : 0.0) : x; };
  // each stage's full tensors pooled on every rank (one copy per stage sends)
  auto pooled = [&](const std::map<std::string, Tensor>& full) {
    return piped ? world->merge_tensors(rt.rank() == 0 ? full : std::map<std::string, Tensor>{}) : full;
  };
  tr.executor().state().seed = a.seed;
  // fp16: dynamic loss scaling (a step with non-finite gradients is skipped and the scale halves)
  LossScalerConfig lsc;
  lsc.dynamic = a.dtype == "fp16";
  LossScaler scaler(lsc);
  // never apply a non-finite update: fp16 then lowers its scale, otherwise --on-nonfinite decides
  tr.skip_nonfinite = true;
  bool tracing = !a.trace.empty() || a.overlap_report;
  tr.executor().set_tracing(tracing);
  // this rank's parameters: their layouts and global shapes
  // (a pipeline rank: its stage's program, whose mesh may not be the first stage's)
  const GlobalProgram& gp = piped ? s.stage_program(stage.stage) : s.gp;
  std::vector<ShardingSpec> pspecs = gp.param_specs;
  std::vector<Shape> pshapes = gp.param_shapes;
  if (piped) {
    // every rank of two stages must agree on the transfers between them (else both would wait forever)
    std::string mine;
    for (const std::string& t : stage.transfers) mine += t + "\n";
    std::vector<std::vector<std::string>> all;
    std::vector<int> stage_of;
    for (const std::string& text : world->gather_strings(mine)) {
      all.emplace_back();
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) all.back().push_back(line);
      stage_of.push_back(s.pipe->stage_of_rank(static_cast<int64_t>(stage_of.size())));
    }
    OASES_RETURN_IF_ERROR(check_stage_transfers(stage_of, all));
    pspecs.clear();
    pshapes.clear();
    for (size_t i : stage.param_index) {
      pspecs.push_back(gp.param_specs[i]);
      pshapes.push_back(gp.param_shapes[i]);
    }
    tr.global_norm = [&](const std::vector<double>& ss) {
      std::vector<double> counted = ss;
      for (size_t i = 0; i < counted.size(); ++i) {
        if (!stage.counts_in_norm[i]) counted[i] = 0;
      }
      double mine = rt.global_sum_squares(counted, pspecs);
      return std::sqrt(world->sum(rt.rank() == 0 ? mine : 0.0));
    };
  } else if (rt.distributed()) {
    tr.global_norm = [&rt, &pspecs](const std::vector<double>& ss) { return std::sqrt(rt.global_sum_squares(ss, pspecs)); };
  }
  OASES_RETURN_IF_ERROR(everyone.check_same("model or binary", s.model_hash));
  const Graph& lg = tr.training_graph().graph;
  const bool sharded = gp.world > 1;
  auto slice_feeds = [&](const std::map<std::string, Tensor>& global) {
    if (!sharded) return global;
    std::map<std::string, Tensor> local;
    for (const auto& [name, t] : global) {
      ValueId v = lg.find_value(name);
      if (v == kNoId) continue;
      local[name] = slice_for_rank(t, gp.partitioned->specs[static_cast<size_t>(v)], rt.mesh(), rt.rank());
    }
    return local;
  };
  auto gathered_params = [&]() { return pooled(gather_training_state(tr, rt, pspecs, pshapes, false)); };

  BatchSampler sampler(&s.data.tokens, 0, s.split, a.seed);
  BatchSampler val_sampler(&s.data.tokens, s.split, static_cast<int64_t>(s.data.tokens.size()), a.seed + 1);
  int64_t start = 0;
  if (!a.resume.empty()) {
    OASES_ASSIGN_OR_RETURN(Checkpoint ck, load_checkpoint(a.resume));
    if (lead && !ck.warning.empty()) std::fprintf(stderr, "warning: %s\n", ck.warning.c_str());
    if (ck.fingerprint != s.fingerprint) {
      return error("{}: the checkpoint was written for another model (its parameters differ from {}'s)", a.resume, a.model);
    }
    if (ck.optimizer_kind != a.optimizer) {
      return error("{}: the checkpoint holds {} state, this run uses --optimizer {}", a.resume, ck.optimizer_kind, a.optimizer);
    }
    OASES_RETURN_IF_ERROR(restore_training_state(ck, a.resume, tr, rt, pspecs, pshapes));
    if (!ck.sampler_state.empty()) OASES_RETURN_IF_ERROR(sampler.set_state(ck.sampler_state).with_context(a.resume));
    start = ck.step;
    tr.executor().state().step = static_cast<uint64_t>(start);
    if (lead && !a.quiet) std::fprintf(stderr, "resumed from %s at step %lld\n", a.resume.c_str(), static_cast<long long>(start));
  }
  // The step log grows in LOG.tmp (after LOG's old lines: resumed runs append) and replaces LOG
  // when the run ends, also when it stops with an error: a full disk is reported at the step it
  // fills and never leaves an empty or cut LOG.
  std::optional<AtomicFile> log;
  if (lead && !a.log_json.empty()) {
    OASES_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(a.log_json, /*append=*/true));
    log.emplace(std::move(f));
  }
  struct CommitOnExit {
    std::optional<AtomicFile>& log;
    ~CommitOnExit() {
      if (log && log->is_open()) (void)log->commit();
    }
  } commit_log_on_error{log};
  auto next_feeds = [&]() -> Expected<std::vector<std::map<std::string, Tensor>>> {
    std::vector<std::map<std::string, Tensor>> micro;
    for (int64_t i = 0; i < a.grad_accum; ++i) {
      if (!s.fixed_feeds.empty()) {
        micro.push_back(slice_feeds(s.fixed_feeds));
        continue;
      }
      OASES_ASSIGN_OR_RETURN(Batch b, sampler.next(s.batch, s.seq));
      micro.push_back(slice_feeds(feeds_for_batch(s.gp.train.graph, s.roles, b)));
    }
    return micro;
  };
  // a pipeline evaluates by running every stage's program without dropout or update
  auto eval = [&](const std::map<std::string, Tensor>& feeds) -> Expected<double> {
    if (!piped) return tr.eval_loss(feeds);
    OASES_ASSIGN_OR_RETURN(double l, tr.program_loss(feeds));
    return from_last_stage(l);
  };
  auto validate = [&]() -> Expected<double> {
    if (!s.fixed_feeds.empty()) return eval(slice_feeds(s.fixed_feeds));
    double sum = 0;
    for (int64_t i = 0; i < a.val_batches; ++i) {
      Batch b = val_sampler.at(i, s.batch, s.seq);
      OASES_ASSIGN_OR_RETURN(double l, eval(slice_feeds(feeds_for_batch(s.gp.train.graph, s.roles, b))));
      sum += l;
    }
    return sum / static_cast<double>(a.val_batches);
  };
  // never save a non-finite state (executor/training.h): every rank refuses alike, before the
  // save's collectives, and the file keeps what it held
  CheckpointGuard guard;
  const bool can_validate = s.have_val || !s.fixed_feeds.empty();
  auto save = [&](int64_t step) -> Status {
    if (!guard.validated() && can_validate) {
      OASES_ASSIGN_OR_RETURN(double v, validate());
      guard.after_validation(step, v);
    }
    OASES_RETURN_IF_ERROR(CheckpointGuard::refuse_save(everyone.gather_strings(guard.refusal()), a.save));
    Checkpoint ck;
    ck.fingerprint = s.fingerprint;
    ck.step = step;
    ck.optimizer_kind = a.optimizer;
    ck.optimizer_t = tr.optimizer().steps_taken();
    ck.sampler_state = sampler.state();
    ck.seed = a.seed;
    ck.tensors = gather_training_state(tr, rt, pspecs, pshapes, true);
    if (!piped) return lead ? save_checkpoint(ck, a.save) : Status::ok();
    // a pipeline saves per stage (executor/checkpoint.h): each stage's full tensors (a tied weight
    // by its first holder) in its own file, then the manifest once every stage file is written
    for (size_t i = 0; i < stage.counts_in_norm.size(); ++i) {
      if (stage.counts_in_norm[i]) continue;
      std::string name = tr.param_name(i);
      ck.tensors.erase(name);
      for (const char* suffix : kOptimizerStateSuffixes) ck.tensors.erase(name + suffix);
    }
    const int S = s.pipe->stages;
    // one id per save, in every stage file and the manifest: a stage file left from another save is refused
    const int64_t save_id = static_cast<int64_t>(world->sum(
        lead ? static_cast<double>(std::chrono::steady_clock::now().time_since_epoch().count() % (int64_t{1} << 50)) : 0.0));
    ck.extra_json = nlohmann::json{{"pipeline_save", save_id}, {"stage", stage.stage}, {"stages", S}}.dump();
    Status st = rt.rank() == 0 ? save_checkpoint(ck, stage_checkpoint_path(a.save, stage.stage, S)) : Status::ok();
    double failed = world->sum(st.is_ok() ? 0.0 : 1.0);
    if (!st.is_ok()) return st;
    if (failed > 0) return error("{}: not written: another stage could not write its file", a.save);
    return lead ? save_stage_manifest(a.save, S, step, s.fingerprint, save_id) : Status::ok();
  };
  auto dump = [&]() -> Status {
    if (lead) {
      std::error_code ec;
      fs::create_directories(a.dump_grads, ec);
    }
    std::map<std::string, Tensor> full;
    for (size_t i = 0; i < tr.training_graph().params.size(); ++i) full[tr.param_name(i)] = rt.gather(tr.gradient(i), pspecs[i], pshapes[i]);
    full = pooled(full);
    // numbered in the whole model's parameter order
    const TrainingGraph& whole = s.gp.train;
    for (size_t i = 0; lead && i < whole.params.size(); ++i) {
      std::string name = whole.graph.value(whole.params[i]).name;
      auto it = full.find(name);
      if (it == full.end()) return error("internal: no stage holds the gradient of '{}'", name);
      OASES_RETURN_IF_ERROR(write_tensor_file(it->second, name, fmt::format("{}/grad_{:04d}_{}.pb", a.dump_grads, i, sanitize(name))));
    }
    if (lead && !a.quiet) std::fprintf(stderr, "wrote %zu gradients to %s\n", whole.params.size(), a.dump_grads.c_str());
    return Status::ok();
  };

  if (lead && !a.quiet) {
    // which initializers train, and why each buffer does not (graph/parameters.h)
    for (const std::string& line : describe_parameter_split(s.gp.train.graph, s.gp.train.roles)) std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (a.steps == 0 && !a.dump_grads.empty()) {
    OASES_ASSIGN_OR_RETURN(auto micro, next_feeds());
    OASES_ASSIGN_OR_RETURN(double l, tr.compute_gradients(micro[0]));
    l = from_last_stage(l);
    if (lead) std::printf("loss %.6f\n", l);
    OASES_RETURN_IF_ERROR(dump());
  }
  int64_t tokens_per_step = s.batch * s.seq * a.grad_accum;
  int64_t log_every = a.log_every > 0 ? a.log_every : std::max<int64_t>(1, a.steps / 20);
  if (lead && !a.quiet && a.steps > start) {
    int64_t values = 0;
    for (const Shape& sh : s.gp.param_shapes) values += shape_numel(sh);
    std::fprintf(stderr, "training %s: %zu parameters (%lld values), batch %lld x %lld tokens%s, %lld steps%s\n", a.model.c_str(),
                 s.gp.param_shapes.size(), static_cast<long long>(values), static_cast<long long>(s.batch), static_cast<long long>(s.seq),
                 a.grad_accum > 1 ? fmt::format(" x {} micro-batches", a.grad_accum).c_str() : "", static_cast<long long>(a.steps),
                 piped ? fmt::format(", {} ranks (pp {} x {}, {}, {} micro-batches, stages {}, {})", everyone.size(), a.pp,
                                     a.stage_meshes.empty() ? fmt::format("tp {} x dp {}", a.tp, a.dp) : "meshes " + a.stage_meshes, a.pipeline, a.micro_batches, stages_string(s.pipe->cuts),
                                     rt.communicator() ? rt.communicator()->kind() : "local")
                             .c_str()
                 : rt.size() > 1 ? fmt::format(", {} ranks (tp {} x dp {}, {})", rt.size(), a.tp, a.dp,
                                               rt.communicator() ? rt.communicator()->kind() : "local")
                                       .c_str()
                                 : "");
    std::fprintf(stderr, "blas: %s\n", blas_core_report().c_str());
  }
  auto run_start = std::chrono::steady_clock::now();
  double first_val = NAN, last_val = NAN;
  if (s.have_val && !a.quiet && start < a.steps && s.fixed_feeds.empty()) {
    OASES_ASSIGN_OR_RETURN(double v, validate());
    first_val = v;
    guard.after_validation(start, v);
    if (lead) std::fprintf(stderr, "step %lld  val loss %.4f\n", static_cast<long long>(start), v);
  }
  int64_t end = a.stop_after > 0 ? std::min(a.steps, start + a.stop_after) : a.steps;
  OverlapStats overlap;
  nlohmann::json trace_json = nlohmann::json::array();
  const TestFault fault = TestFault::from_env();  // the tests of peer failures
  ProfileReport prof;
  tr.executor().set_profiling(a.profile);
  for (int64_t step = start; step < end; ++step) {
    OASES_RETURN_IF_ERROR(fault.at_step(world_rank, step));
    OASES_ASSIGN_OR_RETURN(auto micro, next_feeds());
    bool dump_now = !a.dump_grads.empty() && step == start;
    if (lsc.dynamic) tr.set_loss_scale(scaler.scale());
    OASES_ASSIGN_OR_RETURN(StepStats st, tr.step(micro, dump_now ? std::function<Status()>(dump) : std::function<Status()>()));
    st.loss = from_last_stage(st.loss);
    guard.after_step(step + 1, st.loss, !st.skipped);
    if (lsc.dynamic) {
      double used = scaler.scale();
      scaler.update(!st.skipped);
      if (st.skipped && lead && !a.quiet) {
        std::fprintf(stderr, "step %lld: non-finite gradients at loss scale %g; update skipped, scale now %g\n",
                     static_cast<long long>(step + 1), used, scaler.scale());
      }
    }
    if (tracing) {
      std::vector<TraceEvent> ev = tr.executor().take_events();
      int64_t done_steps = step - start;
      const Graph& run_graph = tr.executor().graph();  // the program's graph (with the executor's fused nodes)
      overlap.add(run_graph, ev, st.ms, done_steps >= 1);
      if (!a.trace.empty() && done_steps >= 1 && done_steps <= a.trace_steps) append_trace(run_graph, ev, world_rank, &trace_json, piped ? stage.stage : -1);
    }
    if (st.skipped && !lsc.dynamic) {
      if (a.on_nonfinite == "stop") {
        return error("step {}: the loss is {} and the gradient norm {}: stopped before the update, nothing saved (lower --lr?)", step + 1,
                     st.loss, st.grad_norm);
      }
      if (lead) {
        std::fprintf(stderr, "warning: step %lld: the loss is %g and the gradient norm %g: update skipped\n",
                     static_cast<long long>(step + 1), st.loss, st.grad_norm);
      }
    } else if (!std::isfinite(st.loss)) {
      return error("step {}: the loss is {} (lower --lr?)", step + 1, st.loss);
    }
    if (a.profile && step > start) prof.add(tr.executor(), st.ms, st.device ? &st : nullptr);
    double tps = static_cast<double>(tokens_per_step) / (st.ms / 1000.0);
    int64_t done = step + 1;
    std::optional<double> val;
    if (s.have_val && ((a.val_every > 0 && done % a.val_every == 0) || done == end)) {
      OASES_ASSIGN_OR_RETURN(double v, validate());
      val = v;
      last_val = v;
      guard.after_validation(done, v);
    }
    if (log) {
      nlohmann::json j{{"step", done}, {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"tokens_per_s", tps}, {"ms", st.ms},
                         {"run_ms", st.run_ms}, {"update_ms", st.update_ms}};
      if (val) j["val_loss"] = *val;
      if (st.device) {
        // run_ms and update_ms are then the device's time for the programs and for the update
        j["device"] = true;
        j["device_peak_mib"] = static_cast<double>(tr.peak_device_bytes()) / (1 << 20);
      }
      if (lsc.dynamic) {
        j["loss_scale"] = scaler.scale();
        j["skipped"] = st.skipped;
      }
      OASES_RETURN_IF_ERROR(log->write(j.dump() + "\n"));
      OASES_RETURN_IF_ERROR(log->flush());
    }
    if (lead && !a.quiet && (done % log_every == 0 || done == end || val)) {
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      double eta = elapsed / static_cast<double>(done - start) * static_cast<double>(a.steps - done);
      std::fprintf(stderr, "step %lld/%lld  loss %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  %.1f ms/step  ETA %s\n",
                   static_cast<long long>(done), static_cast<long long>(a.steps), st.loss,
                   val ? fmt::format("  val loss {:.4f}", *val).c_str() : "", st.lr, st.grad_norm, tps, st.ms, fmt_eta(eta).c_str());
    }
    if (!a.save.empty() && a.save_every > 0 && done % a.save_every == 0 && done != end) OASES_RETURN_IF_ERROR(save(done));
  }
  if (!a.trace.empty()) {
    std::vector<std::string> all = everyone.gather_strings(trace_json.dump());
    if (lead) {
      nlohmann::json about{{"model", a.model},   {"schedule", a.schedule.empty() ? "plain (in line)" : a.schedule},
                           {"chunks", a.chunks}, {"tp", a.tp},
                           {"dp", a.dp},         {"emulated_link", a.emulate_link}};
      if (piped) {
        about["pp"] = a.pp;
        about["pipeline"] = a.pipeline;
        about["micro_batches"] = a.micro_batches;
        about["stages"] = stages_string(s.pipe->cuts);
      }
      size_t events = 0;
      OASES_RETURN_IF_ERROR(write_trace_file(all, about, a.trace, &events));
      if (!a.quiet) std::fprintf(stderr, "wrote trace %s (%zu events; open in https://ui.perfetto.dev)\n", a.trace.c_str(), events);
    }
  }
  if (a.profile && lead) prof.print(tr.executor(), "step", static_cast<size_t>(a.profile_nodes));
  if (lead && !a.quiet && !tr.device_notes().empty()) {
    std::fprintf(stderr, "device: %s; peak device memory %.0f MiB\n", tr.device_notes().c_str(),
                 static_cast<double>(tr.peak_device_bytes()) / (1 << 20));
  }
  if (a.overlap_report && lead) overlap.print(sched.has_value() && sched->interleave, a.schedule);
  if (!a.save.empty() && a.steps > 0) {
    OASES_RETURN_IF_ERROR(save(std::max(end, start)));
    if (lead && !a.quiet) std::fprintf(stderr, "saved checkpoint %s\n", a.save.c_str());
  }
  if (!a.export_onnx.empty()) {
    auto full = gathered_params();
    if (lead) {
      OASES_RETURN_IF_ERROR(export_with_initializers(a.model, full, a.export_onnx));
      if (!a.quiet) std::fprintf(stderr, "wrote %s\n", a.export_onnx.c_str());
    }
  }
  if (lead && !a.quiet && std::isfinite(first_val) && std::isfinite(last_val)) {
    std::fprintf(stderr, "validation loss %.4f -> %.4f\n", first_val, last_val);
  }
  if (log) OASES_RETURN_IF_ERROR(log->commit());
  return Status::ok();
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
