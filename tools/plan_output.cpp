// What oases-plan --gpus N prints (the plan beside Megatron's split, data parallelism and the
// pipeline; a reference pipeline; the replayed programs) and the plan file it writes. The lines are
// read by scripts and tests: change them only with those.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "graph/atomic_file.h"
#include "planner/pipeline_replay.h"
#include "planner/pipeline_search.h"
#include "planner/plan_report.h"
#include "tools/plan_command.h"

namespace oases {

namespace {

void print_estimate(const char* label, const SearchResult& r, PlanSearch& s) {
  if (!r.found) {
    if (r.least_memory > 0) {
      std::printf("  %-15s no plan fits (it needs at least %s)\n", label, describe_bytes(r.least_memory).c_str());
    } else {
      std::printf("  %-15s impossible here (its data-parallel degree does not divide the batch of %lld)\n", label,
                  static_cast<long long>(s.a.batch));
    }
    return;
  }
  PlanEstimate e = s.cm->estimate(r.best);
  std::printf("  %-15s step %9.3f ms  (compute %.3f, comm %.3f: hidden %.3f, exposed %.3f; optimizer %.3f)  memory %s  %s K=%lld\n", label,
              e.step_s * 1e3, e.compute_s * 1e3, e.comm_s * 1e3, e.hidden_s() * 1e3, e.exposed_s * 1e3, e.optimizer_s * 1e3,
              describe_bytes(e.memory_bytes).c_str(), r.best.schedule.c_str(), static_cast<long long>(r.best.chunks));
  std::printf("  %-15s %s\n", "", describe_layouts(s.a, r.best.layouts).c_str());
}

void print_pipeline(PlanSearch& s) {
  const PipelinePlan& pipe = s.pipe;
  if (pipe.found) {
    auto slowest = [&](double PipelineStagePlan::*field) {
      return (*std::max_element(pipe.stage.begin(), pipe.stage.end(), [&](auto& x, auto& y) { return x.*field < y.*field; })).*field;
    };
    std::printf(
        "  %-15s step %9.3f ms  (stages: forward %.3f, backward %.3f per micro-batch at the slowest; bubble %.0f%%; optimizer %.3f)  "
        "memory %s\n",
        "pipeline", pipe.step_s * 1e3, slowest(&PipelineStagePlan::forward_s) * 1e3, slowest(&PipelineStagePlan::backward_s) * 1e3,
        pipe.bubble * 100, pipe.optimizer_s * 1e3, describe_bytes(pipe.memory_bytes).c_str());
    std::printf("  %-15s %s\n", "", describe_pipeline(pipe).c_str());
    if (s.best.found) std::printf("  pipeline vs the best one-mesh plan: %.2fx\n", s.cm->estimate(s.best.best).step_s / pipe.step_s);
  } else {
    std::printf("  %-15s %s\n", "pipeline", describe_pipeline(pipe).c_str());
  }
  std::printf("  pipeline search: %lld candidates priced in %.1f ms\n", static_cast<long long>(pipe.candidates), pipe.search_ms);
}

// The plan file's "prediction": the chosen plan's, and the one-mesh plan's and the baselines' with
// their choices.
nlohmann::json predictions(PlanSearch& s, bool pipeline_wins, int64_t gpus) {
  nlohmann::json preds = nlohmann::json::object();
  if (s.best.found) preds["plan"] = estimate_json(s.cm->estimate(s.best.best));
  if (pipeline_wins) {
    preds["plan"] = {{"step_s", s.pipe.step_s}, {"memory_bytes", s.pipe.memory_bytes}, {"bubble", s.pipe.bubble}};
    if (s.best.found) {
      preds["one_mesh"] = estimate_json(s.cm->estimate(s.best.best));
      preds["one_mesh"]["choice"] = choice_json(s.a, s.best.best, gpus);
    }
  }
  if (s.megatron.found) {
    preds["megatron"] = estimate_json(s.cm->estimate(s.megatron.best));
    preds["megatron"]["choice"] = choice_json(s.a, s.megatron.best, gpus);
  }
  if (s.dp.found) {
    preds["data_parallel"] = estimate_json(s.cm->estimate(s.dp.best));
    preds["data_parallel"]["choice"] = choice_json(s.a, s.dp.best, gpus);
  }
  return preds;
}

}  // namespace

void print_plan_estimates(const PlanOptions& o, PlanSearch& s) {
  const ModelAnalysis& a = s.a;
  std::printf("%s: %zu parts (%s), batch %lld x %lld tokens, %lld GPUs: %s\n", o.model.c_str(), a.parts.size(),
              a.mixed_ok ? "layouts may differ per part" : ("one layout for all: " + a.mixed_why).c_str(), static_cast<long long>(a.batch),
              static_cast<long long>(a.seq), static_cast<long long>(o.gpus), s.cluster.name.c_str());
  std::printf("  precision: %s (%s)\n", s.dtype.c_str(), s.dtype_why.c_str());
  std::printf("  op times: %s; memory limit %s per GPU\n",
              s.profile ? fmt::format("profile {}", o.profile_file).c_str()
                        : fmt::format("roofline of {}, {}", s.cluster.device.name, s.dtype).c_str(),
              describe_bytes(s.limit).c_str());
  print_estimate("plan", s.best, s);
  print_estimate("Megatron", s.megatron, s);
  print_estimate("data parallel", s.dp, s);
  if (s.megatron.found && s.best.found)
    std::printf("  predicted speed-up over Megatron: %.2fx\n", s.cm->estimate(s.megatron.best).step_s / s.cm->estimate(s.best.best).step_s);
  if (!o.no_pipeline && o.gpus >= 2) print_pipeline(s);
}

Status print_reference_pipeline(const PlanOptions& o, const PlanSearch& s) {
  if (o.reference_pipeline.empty()) return Status::ok();
  // a hand-made pipeline (e.g. Megatron-LM's published configuration), priced the same way
  std::vector<std::string> f = split_list(o.reference_pipeline);
  // last fields "vN": N virtual stages a stage (Megatron-LM's interleaved schedule) and "zero": with
  // the distributed optimizer (Megatron-LM's --use-distributed-optimizer), in either order
  bool zero = false;
  int64_t virtual_stages = 1;
  while (f.size() > 3) {
    if (f.back() == "zero" && !zero) {
      zero = true;
    } else if (f.back().size() > 1 && f.back()[0] == 'v' && virtual_stages == 1) {
      OASES_ASSIGN_OR_RETURN(std::vector<int64_t> v, int_list(f.back().substr(1), "--reference-pipeline's virtual stages", 1, "vN"));
      if (v.size() != 1 || v[0] < 2 || v[0] > 1024) return error("--reference-pipeline '{}': '{}' is not v2 to v1024", o.reference_pipeline, f.back());
      virtual_stages = v[0];
    } else {
      break;
    }
    f.pop_back();
  }
  if (f.size() < 3 || f.size() > 5)
    return error("--reference-pipeline '{}': give PP,TP,MICRO[,SCHEDULE[,INNER]][,vN][,zero]", o.reference_pipeline);
  OASES_ASSIGN_OR_RETURN(std::vector<int64_t> nums,
                         int_list(fmt::format("{},{},{}", f[0], f[1], f[2]), "--reference-pipeline", 1, "PP, TP and MICRO"));
  const int64_t rpp = nums[0], rtp = nums[1], rm = nums[2];
  auto sched = parse_pipeline(f.size() > 3 ? f[3] : "1f1b");
  if (!sched) return sched.status().with_context("--reference-pipeline");
  auto ref = price_pipeline(s.pm.forward, s.pm.train.graph, s.pm.train.params, s.cluster, s.ops, o.gpus, static_cast<int>(rpp), rtp,
                            static_cast<int>(rm), *sched, f.size() > 4 ? f[4] : "default_checkpoint", zero, static_cast<int>(virtual_stages));
  if (!ref) return ref.status().with_context("--reference-pipeline " + o.reference_pipeline);
  std::printf("  %-15s step %9.3f ms  (bubble %.0f%%)  memory %s%s\n", "reference", ref->step_s * 1e3, ref->bubble * 100,
              describe_bytes(ref->memory_bytes).c_str(), s.limit > 0 && ref->memory_bytes > s.limit ? " (over the limit)" : "");
  std::printf("  %-15s %s\n", "", describe_pipeline(*ref).c_str());
  if (!o.simulate) return Status::ok();
  // --simulate: its stage programs built as oases-train builds them and replayed, beside what the
  // pricing predicted per stage (bench/plan/memory_table.py --pipelines reads these lines)
  GlobalProgramOptions go;
  go.model_path = o.model;
  auto sg = build_stage_globals(s.pm.forward, TrainingSpec{}, ref->plan, go);
  if (!sg) return sg.status().with_context("--reference-pipeline " + o.reference_pipeline + ": building its stage programs");
  const Profile* floor = s.at_hand && s.profile ? &*s.profile : nullptr;
  auto rep = replay_pipeline(*sg, s.cluster, s.ops, floor);
  if (!rep) return rep.status().with_context("--reference-pipeline " + o.reference_pipeline + ": replaying its stage programs");
  std::printf("  %-15s step %9.3f ms replayed (bubble %.0f%%)\n", "reference", rep->step_s * 1e3, rep->sim.bubble * 100);
  for (const StageReplay& st : rep->stages) {
    const auto k = static_cast<size_t>(st.stage);
    if (k >= ref->stage.size()) continue;
    std::printf("  %-15s stage %d (rank %lld): forward %.3f ms, backward %.3f ms per micro-batch (predicted %.3f, %.3f); memory %s (predicted %s)\n",
                "", st.stage, static_cast<long long>(st.world_rank), st.forward_s * 1e3, st.backward_s * 1e3, ref->stage[k].forward_s * 1e3,
                ref->stage[k].backward_s * 1e3, describe_bytes(st.memory_bytes).c_str(), describe_bytes(ref->stage[k].memory_bytes).c_str());
  }
  return Status::ok();
}

// --simulate with a pipeline: every stage's program built as oases-train builds it and replayed
// (planner/pipeline_replay.h), beside what the pipeline search predicted; run_searches ranked the
// candidates by replay (s.pipe_ranking).
static Expected<nlohmann::json> replay_pipeline_plan(const PlanSearch& s) {
  if (!s.pipe_ranking) return Status::error("the pipeline's candidates were not replayed");
  const PipelineReplay& r = s.pipe_ranking->replays[s.pipe_ranking->best];
  if (s.pipe_ranking->tried.size() > 1 || s.pipe_ranking->none_fits || s.pipe_ranking->unreplayed > 0) std::printf("  %s\n", s.pipe_ranking->text.c_str());
  const PipelinePlan& p = s.pipe;
  std::printf("  %-15s step %9.3f ms  (stage programs replayed; the search predicted %.3f ms; bubble %.0f%%%s)\n", "pipeline", r.step_s * 1e3,
              p.step_s * 1e3, r.sim.bubble * 100,
              r.exchange_s > 0 || p.exchange_s > 0
                  ? fmt::format("; tied-table exchange {:.3f} ms a step (predicted {:.3f})", r.exchange_s * 1e3, p.exchange_s * 1e3).c_str()
                  : "");
  nlohmann::json stages = nlohmann::json::array();
  for (const StageReplay& st : r.stages) {
    const auto k = static_cast<size_t>(st.stage);
    const bool boundary = k < r.times.transfer_s.size() && k < p.transfer_s.size();
    std::printf("  %-15s stage %d (rank %lld): forward %.3f ms, backward %.3f ms per micro-batch (predicted %.3f, %.3f); other %.3f ms; "
                "memory %s (predicted %s)%s\n", "",
                st.stage, static_cast<long long>(st.world_rank), st.forward_s * 1e3, st.backward_s * 1e3, p.stage[k].forward_s * 1e3,
                p.stage[k].backward_s * 1e3, st.other_s * 1e3, describe_bytes(st.memory_bytes).c_str(),
                describe_bytes(p.stage[k].memory_bytes).c_str(),
                boundary ? fmt::format("; transfer to {} {:.3f} ms (predicted {:.3f})", (st.stage + 1) % static_cast<int>(r.stages.size()),
                                       r.times.transfer_s[k] * 1e3,
                                       p.transfer_s[k] * 1e3)
                               .c_str()
                         : "");
    stages.push_back({{"stage", st.stage},
                      {"forward_ms", st.forward_s * 1e3},
                      {"backward_ms", st.backward_s * 1e3},
                      {"other_ms", st.other_s * 1e3},
                      {"memory_bytes", st.memory_bytes},
                      {"predicted_memory_bytes", p.stage[k].memory_bytes},
                      {"predicted_forward_ms", p.stage[k].forward_s * 1e3},
                      {"predicted_backward_ms", p.stage[k].backward_s * 1e3}});
  }
  return nlohmann::json{{"step_ms", r.step_s * 1e3},         {"predicted_step_ms", p.step_s * 1e3},
                        {"exchange_ms", r.exchange_s * 1e3}, {"predicted_exchange_ms", p.exchange_s * 1e3},
                        {"bubble", r.sim.bubble},            {"stages", stages}};
}

Expected<nlohmann::json> simulate_plans(const PlanOptions& o, PlanSearch& s) {
  nlohmann::json sims = nlohmann::json::object();
  if (!o.simulate && o.trace.empty()) return sims;
  std::printf("simulated (each rank's program replayed on %s):\n", s.cluster.name.c_str());
  const Profile* floor = s.at_hand && s.profile ? &*s.profile : nullptr;
  if (!s.reranked.empty()) std::printf("  %s\n", s.reranked.c_str());
  if (s.best.found && !o.no_cm) {
    OASES_ASSIGN_OR_RETURN(std::string pick,
                           choose_collective_matmuls_by_simulation(s.pm, s.a, o.gpus, s.cluster, s.ops, floor, &s.best.best));
    if (!pick.empty()) std::printf("  %s\n", pick.c_str());
  }
  for (auto [label, r] :
       {std::pair<const char*, const SearchResult*>{"plan", &s.best}, {"Megatron", &s.megatron}, {"data parallel", &s.dp}}) {
    if (!r->found) continue;
    bool want_trace = !o.trace.empty() && std::string(label) == "plan";
    OASES_ASSIGN_OR_RETURN(Simulated sim, simulate_plan(s.pm, plan_of_choice(s.a, r->best, o.gpus), s.cluster, s.ops, floor, want_trace));
    const SimResult& x = sim.sim;
    std::printf(
        "  %-15s step %9.3f ms  (compute %.3f, comm %.3f: hidden %.3f (%.0f%%), exposed %.3f; executor %.3f; optimizer %.3f)  memory "
        "%s\n",
        label, x.step_s * 1e3, x.compute_s * 1e3, x.comm_s * 1e3, x.hidden_s() * 1e3, x.comm_s > 0 ? 100.0 * x.hidden_s() / x.comm_s : 0.0,
        x.exposed_s * 1e3, x.overhead_s * 1e3, x.optimizer_s * 1e3, describe_bytes(sim.memory_bytes).c_str());
    sims[label] = simulation_json(x, sim.memory_bytes);
    if (want_trace) {
      nlohmann::json doc =
          predicted_trace(x, {{"model", o.model}, {"cluster", s.cluster.name}, {"schedule", r->best.schedule}, {"chunks", r->best.chunks}});
      if (Status st = write_text_file(o.trace, doc.dump() + "\n"); !st.is_ok()) return st;
      std::printf("  wrote predicted trace %s\n", o.trace.c_str());
    }
  }
  if (s.pipe.found) {
    OASES_ASSIGN_OR_RETURN(sims["pipeline"], replay_pipeline_plan(s));
  }
  return sims;
}

Status write_chosen_plan(const PlanOptions& o, PlanSearch& s, const nlohmann::json& sims, bool pipeline_wins) {
  // a pipeline's file: its stages, each with its mesh and blocks (plan version 4)
  Plan chosen = pipeline_wins ? s.pipe.plan : plan_of_choice(s.a, s.best.best, o.gpus);
  chosen.batch = s.pm.batch;
  chosen.seq = s.pm.seq;
  chosen.dtype = s.dtype;  // oases-train --plan trains in it unless --dtype says otherwise
  if (!pipeline_wins) chosen.zero = o.zero == "1" ? 1 : 0;  // a pipeline's: what its search chose
  OASES_ASSIGN_OR_RETURN(nlohmann::json j, plan_report(s.pm.forward, chosen, s.pm.path));
  j["prediction"] = predictions(s, pipeline_wins, o.gpus);
  if (!sims.empty()) j["simulation"] = sims;
  if (pipeline_wins) {
    // the plan's stages (what oases-train reads), then what the search found out about them
    nlohmann::json pj = chosen.pipeline_json();
    const nlohmann::json found = pipeline_plan_json(s.pipe);
    for (const auto& [key, value] : found.items()) {
      if (!pj.contains(key) && key != "meshes") pj[key] = value;
    }
    j["pipeline"] = pj;
    j["version"] = kPlanVersionStages;
  } else if (s.pipe.found) {
    j["pipeline_candidate"] = pipeline_plan_json(s.pipe);
  }
  j["cluster"] = s.cluster.to_json();
  j["search"] = {{"transitions", s.best.transitions},
                 {"labels", s.best.labels},
                 {"dominated", s.best.dominated},
                 {"bound_transitions", s.best.bound_transitions},
                 {"pipeline_candidates", s.pipe.candidates},
                 {"pipeline_ms", s.pipe.search_ms},
                 {"ms", s.search_ms},
                 {"memory_limit_bytes", s.limit},
                 {"op_times", s.profile ? "profile " + o.profile_file : "roofline"},
                 {"restriction", s.best.restriction}};
  return write_plan_files(j, o.out, o.html, o.dot);
}

}  // namespace oases
