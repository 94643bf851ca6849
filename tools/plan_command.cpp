// oases-plan MODEL --gpus N: the cluster and op times the plan is costed on, the model at the plan's
// shapes, the one-mesh and pipeline searches and the baselines beside them; what it prints and
// writes is tools/plan_output.cpp's.
#include "tools/plan_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "planner/link_model.h"
#include "planner/plan_report.h"

namespace oases {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

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

namespace {

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

// The profile, the cluster (a --cluster file cut to --gpus, or the machine at hand, maybe behind an
// emulated link between emulated hosts), the compute type and the op times.
Status load_cluster(const PlanOptions& o, PlanSearch& s) {
  const int64_t gpus = o.gpus;
  if (!o.profile_file.empty()) {
    OASES_ASSIGN_OR_RETURN(Profile p, load_profile(o.profile_file));
    s.profile = std::move(p);
  }
  const Profile* profile = s.profile ? &*s.profile : nullptr;
  s.at_hand = o.cluster_file.empty();
  if (profile && profile->backend == "cuda" && s.at_hand) {
    return error("{}: a GPU profile times the ops of one GPU; give --cluster FILE for the GPUs and the links between them", o.profile_file);
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = std::max(1, cores / static_cast<int>(gpus));
  if (!s.at_hand) {
    OASES_ASSIGN_OR_RETURN(s.cluster, load_cluster_file(o.cluster_file));
    ClusterSpec& cluster = s.cluster;
    if (gpus > cluster.ranks()) return error("{}: --gpus {} but the cluster has {} GPUs", o.cluster_file, gpus, cluster.ranks());
    if (gpus > cluster.gpus_per_node && gpus % cluster.gpus_per_node != 0) {
      return error("{}: --gpus {} is not whole nodes of {} GPUs", o.cluster_file, gpus, cluster.gpus_per_node);
    }
    cluster.nodes = std::max<int64_t>(1, gpus / cluster.gpus_per_node);
    if (gpus < cluster.gpus_per_node) cluster.gpus_per_node = gpus;
    if (!o.emulate_link.empty()) return Status::error("--emulate-link describes the machine at hand; it cannot go with --cluster");
  } else {
    if (!o.emulate_link.empty()) {
      if (auto lm = parse_link_model(o.emulate_link); !lm) return lm.status();
    }
    s.cluster = this_machine(gpus, profile, o.emulate_link, threads);
    if (o.hosts > 1) {
      // emulated hosts (as oases-train --hosts): the machine's own speed inside one, the emulated link between
      if (gpus % o.hosts != 0) return error("--hosts {} does not divide --gpus {}", o.hosts, gpus);
      ClusterSpec shm = this_machine(gpus, profile, "", threads);
      s.cluster.nodes = o.hosts;
      s.cluster.gpus_per_node = gpus / o.hosts;
      s.cluster.intra = shm.intra;
      s.cluster.name += fmt::format(" between {} emulated hosts", o.hosts);
    }
  }
  if (!s.at_hand && o.hosts > 0) return Status::error("--hosts describes the machine at hand; a --cluster file names its own nodes");
  s.dtype = plan_dtype(o.dtype, s.cluster, s.at_hand, profile, &s.dtype_why);
  s.ops = op_time_model(s.cluster, profile);
  return Status::ok();
}

// The model at the plan's shapes, its analysis on --gpus ranks, the memory limit and the cost model.
Status load_model_and_costs(const PlanOptions& o, PlanSearch& s, const ImportOptions& opts) {
  // planning reads shapes only, the plan file's partitioned program and the simulation's rank
  // programs too: global activations bigger than this machine (GPT-3's embedding output [1536,
  // 2048, 12288], 155 GB) are fine; what this process allocates keeps the --max-memory cap
  set_shapes_only(true);
  s.ops.set_half_precision(s.dtype != "fp32");
  auto t0 = std::chrono::steady_clock::now();
  OASES_ASSIGN_OR_RETURN(s.pm, load_planning_model(o.model, opts, o.batch, o.seq));
  auto t1 = std::chrono::steady_clock::now();
  s.phases.import_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  auto an = analyze_model(s.pm.forward, s.pm.train.graph, s.pm.train.params, o.gpus);
  if (!an) return an.status().with_context(o.model);
  s.a = std::move(*an);
  s.limit = o.memory_gib > 0 ? o.memory_gib * 1024.0 * 1024 * 1024 : s.cluster.device.memory_gib * 1024.0 * 1024 * 1024;
  if (o.memory_gib < 0) return error("--memory must be positive, not {}", o.memory_gib);
  s.cm.emplace(s.a, s.cluster, s.ops);
  s.cm->set_zero(o.zero == "1");
  s.phases.analysis_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  return Status::ok();
}

// The searches' spaces from --schedules, --chunks, --degrees, --uniform, --no-* and --pp; a profile
// must time every op shape they price.
Status make_search_options(const PlanOptions& o, PlanSearch& s) {
  SearchOptions& so = s.so;
  if (!o.schedules.empty()) so.schedules = split_list(o.schedules);
  for (const std::string& name : so.schedules) {
    if (!schedule_by_name(name)) return schedule_by_name(name).status();
  }
  if (!o.chunks.empty()) {
    OASES_ASSIGN_OR_RETURN(so.chunks, int_list(o.chunks, "--chunks", 1, "counts"));
  }
  for (const std::string& d : split_list(o.degrees)) {
    try {
      so.degrees.push_back(std::stoll(d));
    } catch (const std::exception&) {
      return error("--degrees '{}': '{}' is not a number", o.degrees, d);
    }
  }
  so.allow_mixed = !o.uniform;
  if (o.seq_par && o.no_sp) return error("--sequence-parallel and --no-sequence-parallel contradict each other");
  so.allow_sequence_parallel = !o.no_sp;
  so.require_sequence_parallel = o.seq_par;
  so.allow_collective_matmul = !o.no_cm;
  so.memory_limit = s.limit;
  so.keep_spaces = (o.simulate || !o.trace.empty()) && o.sim_candidates > 1;
  s.pipelined = !o.no_pipeline && o.gpus >= 2;
  s.po.memory_limit = s.limit;
  s.po.zero = o.zero == "1" ? std::vector<bool>{true} : o.zero == "0" ? std::vector<bool>{false} : std::vector<bool>{false, true};
  s.po.inner = so;
  s.po.keep = o.simulate || !o.trace.empty() ? static_cast<int>(o.sim_pipelines) : 1;
  if (s.pipelined) {
    OASES_ASSIGN_OR_RETURN(s.po.stage_counts, int_list(o.pp_list, "--pp", 2, "stage counts"));
  }
  if (!s.profile) return Status::ok();
  PricingSpace space;
  space.gpus = o.gpus;
  space.search = so;
  space.pipeline = s.pipelined;
  space.pipe = s.po;
  space.gpus_per_node = s.cluster.gpus_per_node;
  return check_profile_covers(*s.profile, o.profile_file, s.pm, s.a, space, o.bind);
}

// The one-mesh search, the pipeline search, the baselines on the same cluster under the same limit,
// and with --simulate the replayed programs' pick among the best of each space.
Status run_searches(const PlanOptions& o, PlanSearch& s) {
  auto t_search = std::chrono::steady_clock::now();
  s.best = search_plan(*s.cm, s.so);
  s.search_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_search).count();
  s.phases.search_ms = s.search_ms;
  // pipeline stages: S meshes of N/S GPUs, each with the inner search's layout
  if (s.pipelined) {
    auto pr = search_pipeline(s.pm.forward, s.pm.train.graph, s.pm.train.params, s.cluster, s.ops, o.gpus, s.po);
    if (!pr) return pr.status().with_context(o.model);
    s.pipe = std::move(*pr);
    s.phases.pipeline_ms = s.pipe.search_ms;
    if (s.pipe.found && (o.simulate || !o.trace.empty())) {
      // the candidates' stage programs replayed: the fastest that fits is the pipeline
      auto t_rank = std::chrono::steady_clock::now();
      const Profile* floor = s.at_hand && s.profile ? &*s.profile : nullptr;
      OASES_ASSIGN_OR_RETURN(s.pipe_ranking, rank_pipelines_by_replay(s.pm.forward, s.pm.path, s.pipe, s.limit, s.cluster, s.ops, floor));
      const size_t candidates = static_cast<size_t>(s.pipe.candidates);
      const double ms = s.pipe.search_ms;
      s.pipe = s.pipe_ranking->tried[s.pipe_ranking->best];
      s.pipe.candidates = static_cast<int64_t>(candidates);
      s.pipe.search_ms = ms;
      s.phases.simulate_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_rank).count();
    }
  }
  if (!s.best.found && !s.pipe.found) {
    if (s.best.least_memory > s.limit) {
      double gib = s.best.least_memory / (1024.0 * 1024 * 1024);
      double step = gib < 0.01 ? 1e-4 : 1e-2;  // round up to a --memory that fits
      return error("no plan fits {:.4g} GiB per GPU: the least memory any plan of {} on {} GPUs needs is {} (give --memory {:.4g} or more)",
                   s.limit / (1024.0 * 1024 * 1024), o.model, o.gpus, describe_bytes(s.best.least_memory), std::ceil(gib / step) * step);
    }
    return error("no plan for {} on {} GPUs: no tp degree, chunk count and schedule divide the model (batch {}, degrees {})", o.model,
                 o.gpus, s.a.batch, fmt::join(s.a.tp_candidates, ","));
  }
  auto t_base = std::chrono::steady_clock::now();
  SearchOptions mo = megatron_search_options(s.so);
  s.megatron = search_plan(*s.cm, mo);
  mo.degrees = {1};
  s.dp = search_plan(*s.cm, mo);
  s.phases.baselines_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_base).count();
  // with --simulate the replayed programs pick among the best of each schedule and chunk count
  // (and Megatron's split), the cost model's first choice included
  if (s.so.keep_spaces && s.best.found) {
    std::vector<PlanChoice> cands = simulation_candidates(s.best, s.megatron, s.so);
    OASES_ASSIGN_OR_RETURN(s.reranked,
                           rerank_by_simulation(s.pm, s.a, o.gpus, s.cluster, s.ops, s.at_hand && s.profile ? &*s.profile : nullptr, cands,
                                                static_cast<size_t>(o.sim_candidates), s.limit, &s.best.best, s.so.require_sequence_parallel));
    s.best.objective = plan_objective(*s.cm, s.best.best);
    s.best.memory = plan_memory(*s.cm, s.best.best);
  }
  return Status::ok();
}

}  // namespace

int plan_search_command(const PlanOptions& o) {
  auto t_start = std::chrono::steady_clock::now();
  ImportOptions opts;
  if (Status st = o.bind.apply(&opts); !st.is_ok()) return fail_with(st);
  if (o.gpus < 1) return fail_with(error("--gpus must be at least 1, not {}", o.gpus));
  PlanSearch s;
  if (Status st = load_cluster(o, s); !st.is_ok()) return fail_with(st);
  if (Status st = load_model_and_costs(o, s, opts); !st.is_ok()) return fail_with(st);
  if (Status st = make_search_options(o, s); !st.is_ok()) return fail_with(st);
  if (Status st = run_searches(o, s); !st.is_ok()) return fail_with(st);
  print_plan_estimates(o, s);
  if (Status st = print_reference_pipeline(o, s); !st.is_ok()) return fail_with(st);
  std::printf("  search: %lld transitions priced in %.1f ms (%lld labels, %lld layouts dominated, %lld bounding)%s\n",
              static_cast<long long>(s.best.transitions), s.search_ms, static_cast<long long>(s.best.labels),
              static_cast<long long>(s.best.dominated), static_cast<long long>(s.best.bound_transitions),
              s.best.restriction.empty() ? "" : ("; " + s.best.restriction).c_str());
  auto t_sim = std::chrono::steady_clock::now();
  auto sims = simulate_plans(o, s);
  s.phases.simulate_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_sim).count();
  if (!sims) return fail_with(sims.status());
  // asked for stages (--pp): the pipeline, when one fits; else the faster
  const PipelinePlan& pipe = s.pipe;
  // with --simulate by the replayed programs (the one whose programs fit the limit, else the
  // faster), else by the predictions
  const bool replayed = sims->contains("pipeline") && sims->contains("plan");
  bool pipeline_faster = false;
  if (replayed) {
    const nlohmann::json &rp = (*sims)["pipeline"], &rm = (*sims)["plan"];
    const bool pipe_fits = !s.pipe_ranking->none_fits, mesh_fits = s.limit <= 0 || rm["memory_bytes"].get<double>() <= s.limit;
    pipeline_faster = pipe_fits != mesh_fits ? pipe_fits : rp["step_ms"].get<double>() < rm["step_ms"].get<double>();
  } else if (s.best.found) {
    pipeline_faster = pipe.step_s < s.cm->estimate(s.best.best).step_s;
  }
  const bool pipeline_wins = pipe.found && (!o.pp_list.empty() || !s.best.found || pipeline_faster);
  if (pipe.found) std::printf("  chosen: %s%s\n", pipeline_wins ? "the pipeline" : "one mesh", replayed ? " (by the replayed steps)" : "");
  if (!o.out.empty() || !o.html.empty() || !o.dot.empty()) {
    auto t_file = std::chrono::steady_clock::now();
    if (Status st = write_chosen_plan(o, s, *sims, pipeline_wins); !st.is_ok()) return fail_with(st);
    s.phases.plan_file_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_file).count();
  }
  const PlanSearch::Phases& ph = s.phases;
  std::printf(
      "  phases: import %.0f ms, analysis %.0f ms, search %.0f ms, baselines %.0f ms, pipeline search %.0f ms, simulation %.0f ms, "
      "plan file %.0f ms\n",
      ph.import_ms, ph.analysis_ms, ph.search_ms, ph.baselines_ms, ph.pipeline_ms, ph.simulate_ms, ph.plan_file_ms);
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("  oases-plan took %.0f ms in all\n", total_ms);
  return 0;
}

}  // namespace oases
