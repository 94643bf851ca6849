// oases-plan MODEL --gpus N [--cluster FILE] [--profile FILE] [--memory GiB] --out plan.json [--html plan.html]
//   Searches, per part of the model (embedding, each attention and MLP, head), the tp degree (the
//   other ranks data-parallel) and sequence parallelism, with the schedule and the number of
//   micro-batch chunks, for the least predicted step time under a per-GPU memory limit; prints it
//   beside the Megatron strategy and pure data parallelism on the same cluster; --simulate replays
//   each rank's program on the cluster (step time, hidden and exposed communication, memory,
//   --trace writes the predicted timeline). Without --cluster the plan is for the machine at hand.
// oases-plan MODEL --tp T [--dp D] --strategy megatron --out plan.json    one given tp x dp split
// oases-plan --render plan.json --html plan.html                          draw an existing plan
// Planning reads shapes only: weights kept as external data are never loaded.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "executor/cpu/blas_select.h"
#include "graph/atomic_file.h"
#include "planner/coverage.h"
#include "planner/link_model.h"
#include "planner/plan.h"
#include "planner/pipeline_search.h"
#include "planner/plan_report.h"
#include "planner/rank_program.h"
#include "planner/search.h"
#include "planner/strategy.h"
#include "tools/plan_driver.h"

using namespace oases;

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A comma list of numbers of at least `least` (--chunks 1,2,4; --pp 2,4).
Expected<std::vector<int64_t>> int_list(const std::string& text, const char* flag, int64_t least, const char* what) {
  std::vector<int64_t> out;
  for (const std::string& x : split_list(text)) {
    try {
      out.push_back(std::stoll(x));
    } catch (const std::exception&) {
      return error("{} '{}': '{}' is not a number", flag, text, x);
    }
    if (out.back() < least) return error("{} '{}': {} must be at least {}", flag, text, what, least);
  }
  return out;
}

// A profile must hold a sample of every op shape the planner prices (planner/coverage.h; a GPU
// profile: of every op). The error names the first one missing, where it is priced, and the
// oases-profile command that measures them all.
Status check_profile_covers(const Profile& profile, const std::string& profile_file, const PlanningModel& pm, const ModelAnalysis& a,
                            const PricingSpace& space, const BindingFlags& bind) {
  OASES_ASSIGN_OR_RETURN(std::vector<PricedSample> priced, priced_ops(pm.forward, pm.train.graph, pm.train.params, a, space));
  std::vector<const PricedSample*> missing = uncovered(priced, profile);
  if (missing.empty()) return Status::ok();
  std::map<std::string, int> by_op;
  for (const PricedSample* m : missing) ++by_op[m->op.op];
  std::vector<std::string> ops, names;
  for (const auto& [op, n] : by_op) {
    ops.push_back(fmt::format("{} {}", op, n));
    names.push_back(op);
  }
  const PricedSample& first = *missing.front();
  if (profile.backend != "cpu") {
    return error(
        "{}: the profile does not cover {} of the model's ops: {} (first priced at {}; measure them: oases-profile --backend {} "
        "--model {} --ranks {} --out {})",
        profile_file, names.size(), fmt::join(names, ", "), first.where(), profile.backend, pm.path, space.gpus, profile_file);
  }
  // the command that measures them: oases-profile times every op shape of oases-plan's default
  // space on --ranks ranks, its chunk counts widened by --chunks
  std::string cmd =
      fmt::format("oases-profile --backend cpu --model {} --ranks {} --batch {} --seq {}", pm.path, space.gpus, pm.batch, pm.seq);
  PricingSpace def = default_pricing_space(space.gpus);
  for (int64_t k : space.search.chunks) {
    if (std::find(def.search.chunks.begin(), def.search.chunks.end(), k) == def.search.chunks.end()) {
      cmd += fmt::format(" --chunks {}", fmt::join(space.search.chunks, ","));
      break;
    }
  }
  for (const std::string& d : bind.dims) cmd += " --dim " + d;
  for (const std::string& sh : bind.shapes) cmd += " --shape " + sh;
  cmd += " --out " + profile_file;
  std::string made;
  if (profile.model.is_object() && profile.model.contains("ranks")) {
    made = fmt::format("; it measured {} on {} ranks at batch {} x {}", profile.model.value("path", std::string("a model")),
                       profile.model.value("ranks", int64_t{0}), profile.model.value("batch", int64_t{0}),
                       profile.model.value("seq", int64_t{0}));
  } else {
    made = "; it measured no model (oases-profile without --model)";
  }
  return error("{}: the profile does not cover {} of the {} op shapes the planner prices ({}); the first: {} in {}{} (measure them: {})",
               profile_file, missing.size(), priced.size(), fmt::join(ops, ", "), first.op.key, first.where(), made, cmd);
}

int legacy(const std::string& model, const std::string& out, const std::string& html, const std::string& dot, int64_t tp, int64_t dp,
           int64_t batch, int64_t seq, bool no_vocab, bool seq_par, const BindingFlags& bind) {
  ImportOptions opts;
  if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
  ImportOptions probe_opts = opts;
  probe_opts.require_bound_dims = false;
  auto probe = import_onnx_file(model, probe_opts);
  if (!probe) return fail_with(probe.status());
  for (ValueId v : probe->inputs()) {
    const Value& val = probe->value(v);
    if (!is_integer(val.dtype) || val.shape.size() != 2 || opts.input_shapes.count(val.name)) continue;
    Shape s = val.shape;
    if (s[0] < 0) s[0] = batch > 0 ? batch : std::max<int64_t>(8, dp);
    if (s[1] < 0) s[1] = seq > 0 ? seq : 64;
    opts.input_shapes[val.name] = s;
  }
  auto loaded = load_model(model, opts);
  if (!loaded) return fail_with(loaded.status());
  Plan p = Plan::megatron(tp, dp);
  p.vocab_parallel = !no_vocab;
  p.sequence_parallel = seq_par;
  auto report = plan_report(loaded->graph, p, model);
  if (!report) return fail_with(report.status());
  const nlohmann::json& plan = *report;
  Mesh mesh{plan["mesh"]["axes"].get<std::vector<std::string>>(), plan["mesh"]["sizes"].get<std::vector<int64_t>>()};
  std::printf("%s: mesh %s, %lld collectives per step, %.3g MiB sent per rank per step, %.3g MiB of parameters per rank\n", model.c_str(),
              mesh.to_string().c_str(), static_cast<long long>(plan["summary"]["collectives_per_step"].get<int64_t>()),
              plan["summary"]["ring_bytes_per_rank_per_step"].get<double>() / (1 << 20),
              plan["memory"]["parameter_bytes_per_rank"].get<double>() / (1 << 20));
  if (Status s = write_plan_files(plan, out, html, dot); !s.is_ok()) return fail_with(s);
  return 0;
}

// The compute type a plan is made for: --dtype when given; else the type a GPU profile was
// measured in; else bf16 on a cluster of GPUs with bf16 tensor cores (nobody trains a large model
// in fp32 there: on 64 A100s GPT-3's step is priced 12x slower in fp32); else fp32 (CPU ranks).
std::string plan_dtype(const std::string& asked, const ClusterSpec& c, bool at_hand, const Profile* p, std::string* why) {
  if (!asked.empty()) {
    *why = "--dtype";
    return asked;
  }
  if (p) {
    std::string d = p->model.is_object() ? p->model.value("dtype", std::string()) : std::string();
    if (d == "fp32" || d == "bf16" || d == "fp16") {
      *why = "the type the profile was measured in; --dtype to change";
      return d;
    }
    *why = "a " + p->backend + " profile's ops run in fp32; --dtype to change";
    return "fp32";
  }
  if (!at_hand && c.cores_per_node == 0 && c.device.fp16_tflops > 0) {
    *why = c.device.name + " has bf16 tensor cores; --dtype fp32 plans fp32";
    return "bf16";
  }
  *why = at_hand ? "the machine at hand's CPU ranks; --dtype to change" : c.device.name + " has no 16-bit tensor cores";
  return "fp32";
}

int plan_main(const std::string& model, int64_t gpus, const std::string& cluster_file, const std::string& profile_file, double memory_gib,
              int64_t batch, int64_t seq, const std::string& out, const std::string& html, const std::string& dot, bool simulate,
              const std::string& trace, const std::string& schedules, const std::string& chunks, bool uniform, bool no_sp, bool no_cm,
              const std::string& emulate_link, const std::string& degrees, const BindingFlags& bind, bool no_pipeline,
              const std::string& reference_pipeline, const std::string& asked_dtype, const std::string& pp_list, int64_t hosts,
              int64_t sim_candidates) {
  auto t_start = std::chrono::steady_clock::now();
  ImportOptions opts;
  if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
  if (gpus < 1) return fail_with(error("--gpus must be at least 1, not {}", gpus));
  std::optional<Profile> profile;
  if (!profile_file.empty()) {
    auto p = load_profile(profile_file);
    if (!p) return fail_with(p.status());
    profile = std::move(*p);
  }
  ClusterSpec cluster;
  bool at_hand = cluster_file.empty();
  if (profile && profile->backend == "cuda" && at_hand) {
    return fail_with(error("{}: a GPU profile times the ops of one GPU; give --cluster FILE for the GPUs and the links between them",
                           profile_file));
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = std::max(1, cores / static_cast<int>(gpus));
  if (!at_hand) {
    auto c = load_cluster_file(cluster_file);
    if (!c) return fail_with(c.status());
    cluster = *c;
    if (gpus > cluster.ranks()) return fail_with(error("{}: --gpus {} but the cluster has {} GPUs", cluster_file, gpus, cluster.ranks()));
    if (gpus > cluster.gpus_per_node && gpus % cluster.gpus_per_node != 0) {
      return fail_with(error("{}: --gpus {} is not whole nodes of {} GPUs", cluster_file, gpus, cluster.gpus_per_node));
    }
    cluster.nodes = std::max<int64_t>(1, gpus / cluster.gpus_per_node);
    if (gpus < cluster.gpus_per_node) cluster.gpus_per_node = gpus;
    if (!emulate_link.empty()) return fail_with(Status::error("--emulate-link describes the machine at hand; it cannot go with --cluster"));
  } else {
    if (!emulate_link.empty()) {
      if (auto lm = parse_link_model(emulate_link); !lm) return fail_with(lm.status());
    }
    cluster = this_machine(gpus, profile ? &*profile : nullptr, emulate_link, threads);
    if (hosts > 1) {
      // emulated hosts (as oases-train --hosts): the machine's own speed inside one, the emulated link between
      if (gpus % hosts != 0) return fail_with(error("--hosts {} does not divide --gpus {}", hosts, gpus));
      ClusterSpec shm = this_machine(gpus, profile ? &*profile : nullptr, "", threads);
      cluster.nodes = hosts;
      cluster.gpus_per_node = gpus / hosts;
      cluster.intra = shm.intra;
      cluster.name += fmt::format(" between {} emulated hosts", hosts);
    }
  }
  if (!at_hand && hosts > 0) return fail_with(Status::error("--hosts describes the machine at hand; a --cluster file names its own nodes"));
  std::string dtype_why;
  const std::string dtype = plan_dtype(asked_dtype, cluster, at_hand, profile ? &*profile : nullptr, &dtype_why);
  OpTimeModel ops = op_time_model(cluster, profile ? &*profile : nullptr);
  // planning reads shapes only, the plan file's partitioned program and the simulation's rank
  // programs too: global activations bigger than this machine (GPT-3's embedding output [1536,
  // 2048, 12288], 155 GB) are fine; what this process allocates keeps the --max-memory cap
  set_shapes_only(true);
  ops.set_half_precision(dtype != "fp32");
  auto pm = load_planning_model(model, opts, batch, seq);
  if (!pm) return fail_with(pm.status());
  auto an = analyze_model(pm->forward, pm->train.graph, pm->train.params, gpus);
  if (!an) return fail_with(an.status().with_context(model));
  const ModelAnalysis& a = *an;
  double limit = memory_gib > 0 ? memory_gib * 1024.0 * 1024 * 1024 : cluster.device.memory_gib * 1024.0 * 1024 * 1024;
  if (memory_gib < 0) return fail_with(error("--memory must be positive, not {}", memory_gib));
  CostModel cm(a, cluster, ops);
  SearchOptions so;
  if (!schedules.empty()) so.schedules = split_list(schedules);
  for (const std::string& s : so.schedules) {
    if (!schedule_by_name(s)) return fail_with(schedule_by_name(s).status());
  }
  if (!chunks.empty()) {
    auto c = int_list(chunks, "--chunks", 1, "counts");
    if (!c) return fail_with(c.status());
    so.chunks = *c;
  }
  for (const std::string& d : split_list(degrees)) {
    try {
      so.degrees.push_back(std::stoll(d));
    } catch (const std::exception&) {
      return fail_with(error("--degrees '{}': '{}' is not a number", degrees, d));
    }
  }
  so.allow_mixed = !uniform;
  so.allow_sequence_parallel = !no_sp;
  so.allow_collective_matmul = !no_cm;
  so.memory_limit = limit;
  so.keep_spaces = (simulate || !trace.empty()) && sim_candidates > 1;
  const bool pipelined = !no_pipeline && gpus >= 2;
  PipelinePlanOptions po;
  po.memory_limit = limit;
  po.inner = so;
  if (pipelined) {
    auto counts = int_list(pp_list, "--pp", 2, "stage counts");
    if (!counts) return fail_with(counts.status());
    po.stage_counts = *counts;
  }
  if (profile) {
    PricingSpace space;
    space.gpus = gpus;
    space.search = so;
    space.pipeline = pipelined;
    space.pipe = po;
    space.gpus_per_node = cluster.gpus_per_node;
    if (Status s = check_profile_covers(*profile, profile_file, *pm, a, space, bind); !s.is_ok()) return fail_with(s);
  }
  auto t_search = std::chrono::steady_clock::now();
  SearchResult best = search_plan(cm, so);
  double search_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_search).count();
  // pipeline stages: S meshes of N/S GPUs, each with the inner search's layout
  PipelinePlan pipe;
  if (pipelined) {
    auto pr = search_pipeline(pm->forward, pm->train.graph, pm->train.params, cluster, ops, gpus, po);
    if (!pr) return fail_with(pr.status().with_context(model));
    pipe = std::move(*pr);
  }
  if (!best.found && !pipe.found) {
    if (best.least_memory > limit) {
      double gib = best.least_memory / (1024.0 * 1024 * 1024);
      double step = gib < 0.01 ? 1e-4 : 1e-2;  // round up to a --memory that fits
      return fail_with(
          error("no plan fits {:.4g} GiB per GPU: the least memory any plan of {} on {} GPUs needs is {} (give --memory {:.4g} or more)",
                limit / (1024.0 * 1024 * 1024), model, gpus, describe_bytes(best.least_memory), std::ceil(gib / step) * step));
    }
    return fail_with(error("no plan for {} on {} GPUs: no tp degree, chunk count and schedule divide the model (batch {}, degrees {})",
                           model, gpus, a.batch, fmt::join(a.tp_candidates, ",")));
  }
  // the baselines on the same cluster, under the same limit
  SearchOptions mo = so;
  mo.keep_spaces = false;
  mo.allow_mixed = false;
  mo.allow_sequence_parallel = false;
  mo.allow_collective_matmul = false;
  mo.schedules = {"plain", "default_checkpoint"};
  mo.chunks = {1};
  SearchResult megatron = search_plan(cm, mo);
  SearchOptions dpo = mo;
  dpo.degrees = {1};
  SearchResult dp = search_plan(cm, dpo);
  // with --simulate the replayed programs pick among the best of each schedule and chunk count
  // (and Megatron's split), the cost model's first choice included
  std::string reranked;
  if (so.keep_spaces && best.found) {
    std::vector<PlanChoice> cands;
    // Megatron's split where it lies in the space asked for (--schedules, --chunks)
    auto asked = [&](const PlanChoice& c) {
      return std::find(so.schedules.begin(), so.schedules.end(), c.schedule) != so.schedules.end() &&
             std::find(so.chunks.begin(), so.chunks.end(), c.chunks) != so.chunks.end();
    };
    if (megatron.found && asked(megatron.best)) cands.push_back(megatron.best);
    for (const SpaceBest& sb : best.spaces) cands.push_back(sb.choice);
    auto r = rerank_by_simulation(*pm, a, gpus, cluster, ops, at_hand && profile ? &*profile : nullptr, cands,
                                  static_cast<size_t>(sim_candidates), limit, &best.best);
    if (!r) return fail_with(r.status());
    reranked = *r;
    best.objective = plan_objective(cm, best.best);
    best.memory = plan_memory(cm, best.best);
  }
  std::printf("%s: %zu parts (%s), batch %lld x %lld tokens, %lld GPUs: %s\n", model.c_str(), a.parts.size(),
              a.mixed_ok ? "layouts may differ per part" : ("one layout for all: " + a.mixed_why).c_str(), static_cast<long long>(a.batch),
              static_cast<long long>(a.seq), static_cast<long long>(gpus), cluster.name.c_str());
  std::printf("  precision: %s (%s)\n", dtype.c_str(), dtype_why.c_str());
  std::printf("  op times: %s; memory limit %s per GPU\n",
              profile ? fmt::format("profile {}", profile_file).c_str() : fmt::format("roofline of {}, {}", cluster.device.name, dtype).c_str(),
              describe_bytes(limit).c_str());
  auto line = [&](const char* label, const SearchResult& r) {
    if (!r.found) {
      if (r.least_memory > 0) {
        std::printf("  %-15s no plan fits (it needs at least %s)\n", label, describe_bytes(r.least_memory).c_str());
      } else {
        std::printf("  %-15s impossible here (its data-parallel degree does not divide the batch of %lld)\n", label,
                    static_cast<long long>(a.batch));
      }
      return;
    }
    PlanEstimate e = cm.estimate(r.best);
    std::printf("  %-15s step %9.3f ms  (compute %.3f, comm %.3f: hidden %.3f, exposed %.3f; optimizer %.3f)  memory %s  %s K=%lld\n",
                label, e.step_s * 1e3, e.compute_s * 1e3, e.comm_s * 1e3, e.hidden_s() * 1e3, e.exposed_s * 1e3, e.optimizer_s * 1e3,
                describe_bytes(e.memory_bytes).c_str(), r.best.schedule.c_str(), static_cast<long long>(r.best.chunks));
    std::printf("  %-15s %s\n", "", describe_layouts(a, r.best.layouts).c_str());
  };
  line("plan", best);
  line("Megatron", megatron);
  line("data parallel", dp);
  if (megatron.found && best.found)
    std::printf("  predicted speed-up over Megatron: %.2fx\n", cm.estimate(megatron.best).step_s / cm.estimate(best.best).step_s);
  if (!no_pipeline && gpus >= 2) {
    if (pipe.found) {
      std::printf("  %-15s step %9.3f ms  (stages: forward %.3f, backward %.3f per micro-batch at the slowest; bubble %.0f%%; optimizer %.3f)  memory %s\n",
                  "pipeline", pipe.step_s * 1e3,
                  std::max_element(pipe.stage.begin(), pipe.stage.end(), [](auto& x, auto& y) { return x.forward_s < y.forward_s; })->forward_s * 1e3,
                  std::max_element(pipe.stage.begin(), pipe.stage.end(), [](auto& x, auto& y) { return x.backward_s < y.backward_s; })->backward_s * 1e3,
                  pipe.bubble * 100, pipe.optimizer_s * 1e3, describe_bytes(pipe.memory_bytes).c_str());
      std::printf("  %-15s %s\n", "", describe_pipeline(pipe).c_str());
      if (best.found) std::printf("  pipeline vs the best one-mesh plan: %.2fx\n", cm.estimate(best.best).step_s / pipe.step_s);
    } else {
      std::printf("  %-15s %s\n", "pipeline", describe_pipeline(pipe).c_str());
    }
    std::printf("  pipeline search: %lld candidates priced in %.1f ms\n", static_cast<long long>(pipe.candidates), pipe.search_ms);
  }
  if (!reference_pipeline.empty()) {
    // a hand-made pipeline (e.g. Megatron-LM's published configuration), priced the same way
    std::vector<std::string> f = split_list(reference_pipeline);
    if (f.size() < 3 || f.size() > 5)
      return fail_with(error("--reference-pipeline '{}': give PP,TP,MICRO[,SCHEDULE[,INNER]]", reference_pipeline));
    auto nums = int_list(fmt::format("{},{},{}", f[0], f[1], f[2]), "--reference-pipeline", 1, "PP, TP and MICRO");
    if (!nums) return fail_with(nums.status());
    const int64_t rpp = (*nums)[0], rtp = (*nums)[1], rm = (*nums)[2];
    auto sched = parse_pipeline(f.size() > 3 ? f[3] : "1f1b");
    if (!sched) return fail_with(sched.status().with_context("--reference-pipeline"));
    auto ref = price_pipeline(pm->forward, pm->train.graph, pm->train.params, cluster, ops, gpus, static_cast<int>(rpp), rtp,
                              static_cast<int>(rm), *sched, f.size() > 4 ? f[4] : "default_checkpoint");
    if (!ref) return fail_with(ref.status().with_context("--reference-pipeline " + reference_pipeline));
    std::printf("  %-15s step %9.3f ms  (bubble %.0f%%)  memory %s%s\n", "reference", ref->step_s * 1e3, ref->bubble * 100,
                describe_bytes(ref->memory_bytes).c_str(), limit > 0 && ref->memory_bytes > limit ? " (over the limit)" : "");
    std::printf("  %-15s %s\n", "", describe_pipeline(*ref).c_str());
  }
  std::printf("  search: %lld transitions priced in %.1f ms (%lld labels, %lld layouts dominated)%s\n",
              static_cast<long long>(best.transitions), search_ms, static_cast<long long>(best.labels),
              static_cast<long long>(best.dominated), best.restriction.empty() ? "" : ("; " + best.restriction).c_str());
  nlohmann::json sims = nlohmann::json::object();
  if (simulate || !trace.empty()) {
    std::printf("simulated (each rank's program replayed on %s):\n", cluster.name.c_str());
    const Profile* floor = at_hand && profile ? &*profile : nullptr;
    if (!reranked.empty()) std::printf("  %s\n", reranked.c_str());
    if (best.found && !no_cm) {
      auto pick = choose_collective_matmuls_by_simulation(*pm, a, gpus, cluster, ops, floor, &best.best);
      if (!pick) return fail_with(pick.status());
      if (!pick->empty()) std::printf("  %s\n", pick->c_str());
    }
    for (auto [label, r] : {std::pair<const char*, const SearchResult*>{"plan", &best}, {"Megatron", &megatron}, {"data parallel", &dp}}) {
      if (!r->found) continue;
      bool want_trace = !trace.empty() && std::string(label) == "plan";
      auto s = simulate_plan(*pm, plan_of_choice(a, r->best, gpus), cluster, ops, floor, want_trace);
      if (!s) return fail_with(s.status());
      std::printf(
          "  %-15s step %9.3f ms  (compute %.3f, comm %.3f: hidden %.3f (%.0f%%), exposed %.3f; executor %.3f; optimizer %.3f)  memory "
          "%s\n",
          label, s->sim.step_s * 1e3, s->sim.compute_s * 1e3, s->sim.comm_s * 1e3, s->sim.hidden_s() * 1e3,
          s->sim.comm_s > 0 ? 100.0 * s->sim.hidden_s() / s->sim.comm_s : 0.0, s->sim.exposed_s * 1e3, s->sim.overhead_s * 1e3,
          s->sim.optimizer_s * 1e3, describe_bytes(s->memory_bytes).c_str());
      sims[label] = simulation_json(s->sim, s->memory_bytes);
      if (want_trace) {
        nlohmann::json doc = predicted_trace(
            s->sim, {{"model", model}, {"cluster", cluster.name}, {"schedule", r->best.schedule}, {"chunks", r->best.chunks}});
        if (Status st = write_text_file(trace, doc.dump() + "\n"); !st.is_ok()) return fail_with(st);
        std::printf("  wrote predicted trace %s\n", trace.c_str());
      }
    }
  }
  // asked for stages (--pp): the pipeline, when one fits; else the faster
  const bool pipeline_wins = pipe.found && (!pp_list.empty() || !best.found || pipe.step_s < cm.estimate(best.best).step_s);
  if (pipe.found) std::printf("  chosen: %s\n", pipeline_wins ? "the pipeline" : "one mesh");
  if (!out.empty() || !html.empty() || !dot.empty()) {
    // a pipeline's file: its stages' inner plan (one stage's mesh) and the stages (plan version 3)
    std::optional<ModelAnalysis> stage_a;
    Plan chosen;
    if (pipeline_wins) {
      auto sa = analyze_model(pm->forward, pm->train.graph, pm->train.params, pipe.stage_ranks);
      if (!sa) return fail_with(sa.status().with_context(model));
      stage_a = std::move(*sa);
      // (stages on their own tp: the file's mesh is the first stage's, "meshes" lists them all)
      PlanChoice first = pipe.inner;
      if (pipe.per_stage) first.layouts.assign(first.layouts.size(), pipe.stage.front().layout);
      chosen = plan_of_choice(*stage_a, first, pipe.stage_ranks);
      chosen.pipeline.stages = pipe.stages;
      chosen.pipeline.micro_batches = pipe.micro_batches;
      std::vector<StageCut> cuts;
      for (const auto& st : pipe.stage) cuts.push_back(st.blocks);
      chosen.pipeline.cuts = stages_string(cuts);
      chosen.pipeline.schedule = pipeline_name(pipe.schedule);
      chosen.mesh.chunks = pipe.micro_batches > 0 ? pipe.inner.chunks / pipe.micro_batches : 1;
    } else {
      chosen = plan_of_choice(a, best.best, gpus);
    }
    chosen.batch = pm->batch;
    chosen.seq = pm->seq;
    chosen.dtype = dtype;  // oases-train --plan trains in it unless --dtype says otherwise
    auto j = plan_report(pm->forward, chosen, pm->path);
    if (!j) return fail_with(j.status());
    nlohmann::json preds = nlohmann::json::object();
    if (best.found) preds["plan"] = estimate_json(cm.estimate(best.best));
    if (pipeline_wins) {
      preds["plan"] = {{"step_s", pipe.step_s}, {"memory_bytes", pipe.memory_bytes}, {"bubble", pipe.bubble}};
      if (best.found) {
        preds["one_mesh"] = estimate_json(cm.estimate(best.best));
        preds["one_mesh"]["choice"] = choice_json(a, best.best, gpus);
      }
    }
    if (megatron.found) {
      preds["megatron"] = estimate_json(cm.estimate(megatron.best));
      preds["megatron"]["choice"] = choice_json(a, megatron.best, gpus);
    }
    if (dp.found) {
      preds["data_parallel"] = estimate_json(cm.estimate(dp.best));
      preds["data_parallel"]["choice"] = choice_json(a, dp.best, gpus);
    }
    (*j)["prediction"] = preds;
    if (!sims.empty()) (*j)["simulation"] = sims;
    if (pipeline_wins) {
      (*j)["pipeline"] = pipeline_plan_json(pipe, &*stage_a);
      (*j)["version"] = kPlanVersionPipeline;
    } else if (pipe.found) {
      (*j)["pipeline_candidate"] = pipeline_plan_json(pipe);
    }
    (*j)["cluster"] = cluster.to_json();
    (*j)["search"] = {{"transitions", best.transitions},
                      {"labels", best.labels},
                      {"dominated", best.dominated},
                      {"pipeline_candidates", pipe.candidates},
                      {"pipeline_ms", pipe.search_ms},
                      {"ms", search_ms},
                      {"memory_limit_bytes", limit},
                      {"op_times", profile ? "profile " + profile_file : "roofline"},
                      {"restriction", best.restriction}};
    if (Status s = write_plan_files(*j, out, html, dot); !s.is_ok()) return fail_with(s);
  }
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("  oases-plan took %.0f ms in all\n", total_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-plan: choose how to split a model's training over a cluster, or describe a given split"};
    std::string model, out, html, dot, strategy, render, cluster, profile, trace, schedules, chunks, emulate, degrees;
    int64_t tp = 0, dp = 0, batch = 0, seq = 0, gpus = 0, hosts = 0, sim_candidates = 24;
    double memory = 0;
    bool no_vocab = false, seq_par = false, simulate = false, uniform = false, no_sp = false, no_pipeline = false, no_cm = false;
    std::string reference_pipeline, dtype, pp_list;
    BindingFlags bind;
    app.add_option("model", model, "ONNX model file");
    CLI::Option* gpus_opt = app.add_option("--gpus", gpus, "Plan for this many GPUs (ranks): per-part tp x dp, schedule and chunks");
    app.add_option("--cluster", cluster, "Cluster file (JSON: device, nodes, links); default: the machine at hand");
    app.add_option("--profile", profile, "Op and collective times measured by oases-profile (default: roofline from the device table)");
    app.add_option("--memory", memory, "Memory per GPU in GiB (default: the device's)");
    app.add_flag("--simulate", simulate, "Replay each rank's program: step time, hidden and exposed communication, memory");
    app.add_option("--simulate-candidates", sim_candidates,
                   "With --simulate: replay the best plan of each schedule and chunk count, each also without sequence parallelism, and "
                   "Megatron's, up to N in all (the cost model's order), and choose the fastest (1: keep the cost model's choice)")
        ->check(CLI::Range(int64_t{1}, int64_t{64}));
    app.add_option("--trace", trace, "Write the chosen plan's predicted timeline as a Chrome trace (implies --simulate)");
    app.add_option("--schedules", schedules, "Schedules to consider (comma list; default all five)");
    app.add_option("--chunks", chunks, "Micro-batch chunk counts to consider (comma list; default 1,2,4,8)");
    app.add_flag("--uniform", uniform, "One layout for every part");
    app.add_option("--degrees", degrees, "tp degrees to consider (comma list; default every one dividing the model)");
    app.add_flag("--no-sequence-parallel", no_sp, "Never split norms and residuals over the sequence");
    app.add_flag("--no-collective-matmul", no_cm, "Never decompose sequence-parallel collectives into ring steps beside the products");
    app.add_option("--dtype", dtype,
                   "fp32 | bf16 | fp16: compute type the plan is for (default: bf16 on a cluster whose GPUs have bf16 tensor cores, "
                   "a GPU profile's own type, else fp32); written into the plan file")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--pp", pp_list, "Pipeline stage counts to consider (comma list); the plan is then a pipeline when one fits");
    app.add_flag("--no-pipeline", no_pipeline, "Plan one mesh only (no pipeline stages)");
    app.add_option("--reference-pipeline", reference_pipeline,
                   "Also price a given pipeline PP,TP,MICRO[,gpipe|1f1b|eager-1f1b[,INNER_SCHEDULE]] (e.g. Megatron-LM's published one)");
    app.add_option("--emulate-link", emulate, "The machine at hand behind an emulated link bw=GBPS,latency=US (as oases-train)");
    app.add_option("--hosts", hosts, "The machine at hand as N emulated hosts (with --emulate-link: the link between them; as oases-train --hosts)");
    app.add_option("--tp", tp, "Tensor-parallel degree (a given Megatron split instead of a search)");
    app.add_option("--dp", dp, "Data-parallel degree (with --tp)");
    app.add_option("--strategy", strategy, "megatron (with --tp/--dp)")->check(CLI::IsMember({"megatron"}));
    app.add_option("--out", out, "Write the plan as JSON");
    app.add_option("--html", html, "Write a self-contained HTML page of the plan");
    app.add_option("--dot", dot, "Write a Graphviz DOT of the plan");
    app.add_option("--render", render, "Render an existing plan JSON (with --html/--dot) instead of planning");
    app.add_option("--batch", batch, "Global batch (sequences) the plan is made for");
    app.add_option("--seq", seq, "Sequence length the plan is made for");
    app.add_flag("--no-vocab-parallel", no_vocab, "Replicate the embedding and LM head (with --tp)");
    app.add_flag("--sequence-parallel", seq_par, "Split norms and residuals over the sequence (with --tp)");
    bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    // refused before the search (minutes on a large cluster): a path that cannot be written
    for (const auto& [flag, path] :
         {std::pair<const char*, const std::string*>{"--out", &out}, {"--html", &html}, {"--dot", &dot}, {"--trace", &trace}}) {
      if (path->empty()) continue;
      if (Status s = check_output_file(*path, fmt::format("{} {}", flag, *path)); !s.is_ok()) return fail_with(s);
    }
    if (!render.empty()) {
      std::ifstream f(render);
      if (!f) return fail_with(error("{}: no such plan file", render));
      nlohmann::json plan = nlohmann::json::parse(f, nullptr, false);
      if (plan.is_discarded() || !plan.is_object() || plan.value("format", "") != "oases-plan")
        return fail_with(error("{}: not an Oases plan", render));
      if (Status s = write_plan_files(plan, out, html, dot); !s.is_ok()) return fail_with(s);
      return 0;
    }
    if (model.empty()) return fail_with(Status::error("give a MODEL to plan (or --render PLAN.json)"));
    if (gpus_opt->count() > 0) {
      if (tp > 0 || dp > 0 || !strategy.empty())
        return fail_with(Status::error("--gpus searches the split; leave out --tp, --dp and --strategy"));
      return plan_main(model, gpus, cluster, profile, memory, batch, seq, out, html, dot, simulate, trace, schedules, chunks, uniform,
                       no_sp, no_cm, emulate, degrees, bind, no_pipeline, reference_pipeline, dtype, pp_list, hosts, sim_candidates);
    }
    if (tp <= 0 && dp <= 0)
      return fail_with(Status::error("give --gpus N to search a plan, or --tp T [--dp D] for a given Megatron split"));
    return legacy(model, out, html, dot, std::max<int64_t>(tp, 1), std::max<int64_t>(dp, 1), batch, seq, no_vocab, seq_par, bind);
  });
}
