#include "tools/plan_driver.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "planner/coverage.h"
#include "planner/plan_report.h"
#include "planner/strategy.h"

namespace oases {

Expected<std::vector<int64_t>> profiled_degrees(const ModelAnalysis& a, const std::vector<int64_t>& asked, const std::string& model,
                                               int64_t ranks) {
  if (asked.empty()) return a.tp_candidates;
  for (int64_t t : asked) {
    if (std::find(a.tp_candidates.begin(), a.tp_candidates.end(), t) == a.tp_candidates.end())
      return error("--degrees: tp {} does not divide {} on {} ranks (candidates {})", t, model, ranks, fmt::join(a.tp_candidates, ","));
  }
  return asked;
}

Expected<PlanningModel> load_planning_model(const std::string& path, ImportOptions opts, int64_t batch, int64_t seq) {
  PlanningModel m;
  m.path = path;
  ImportOptions probe_opts = opts;
  probe_opts.require_bound_dims = false;
  OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(path, probe_opts));
  for (ValueId v : probe.inputs()) {
    const Value& val = probe.value(v);
    if (!is_integer(val.dtype) || val.shape.size() != 2 || opts.input_shapes.count(val.name)) continue;
    Shape s = val.shape;
    for (int d = 0; d < 2; ++d) {
      int64_t want = d == 0 ? batch : seq;
      if (s[static_cast<size_t>(d)] >= 0) {
        if (want > 0 && want != s[static_cast<size_t>(d)]) {
          return error("{}: the model fixes input '{}' to {}; plan with --batch {} --seq {} or export it with dynamic axes", path, val.name,
                       shape_str(val.shape), val.shape[0], val.shape[1]);
        }
      } else {
        s[static_cast<size_t>(d)] = want > 0 ? want : (d == 0 ? 8 : 64);
      }
    }
    opts.input_shapes[val.name] = s;
  }
  m.opts = opts;
  OASES_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(path, opts));
  m.forward = std::move(loaded.graph);
  auto tg = build_training_graph(m.forward, TrainingSpec{});
  if (!tg) return tg.status().with_context(path);
  m.train = std::move(*tg);
  for (ValueId v : m.forward.inputs()) {
    const Value& val = m.forward.value(v);
    if (is_integer(val.dtype) && val.shape.size() == 2 && m.batch == 0) {
      m.batch = val.shape[0];
      m.seq = val.shape[1];
    }
  }
  return m;
}

Expected<RankProgram> planned_rank_program(const PlanningModel& m, const Plan& plan) {
  GlobalProgramOptions go;
  go.model_path = m.path;
  OASES_ASSIGN_OR_RETURN(GlobalProgram gp, build_global_program(m.forward, TrainingSpec{}, plan, plan.mesh().ranks, go));
  RankProgramOptions ro;
  ro.slice_constants = false;  // shapes only: the weights may be unread
  return build_rank_program(gp, 0, ro);
}

Expected<Simulated> simulate_plan(const PlanningModel& m, const Plan& plan, const ClusterSpec& cluster, const OpTimeModel& ops,
                                  const Profile* local_floor, bool trace) {
  Simulated s;
  OASES_ASSIGN_OR_RETURN(s.program, planned_rank_program(m, plan));
  SimOptions o;
  o.cluster = &cluster;
  o.ops = &ops;
  o.local_floor = local_floor;
  o.trace = trace;
  o.param_bytes = s.program.updated_bytes;
  OASES_ASSIGN_OR_RETURN(s.sim, simulate_rank(s.program.program.graph, s.program.program.order, s.program.mesh, o));
  // the trainer keeps parameters and AdamW's two moments; gradients and activations live in the arena
  s.memory_bytes = s.program.param_bytes + 2.0 * s.program.updated_bytes + static_cast<double>(s.program.program.memory.arena_bytes);
  return s;
}

namespace {

// The fastest of `tried` (distinct plans, the cost model's choice first) by simulated step among
// those whose programs need at most `memory_limit` bytes a rank (> 0); when none does, the first.
struct Fastest {
  size_t best = 0, over = 0;
  std::vector<double> step_s, memory_bytes;  // per plan tried
  bool none_fits = false;
  double first_s() const { return step_s.front(); }
  double best_s() const { return step_s[best]; }
  bool fits(size_t i, double limit) const { return limit <= 0 || memory_bytes[i] <= limit; }
};
Expected<Fastest> fastest_by_simulation(const PlanningModel& m, const ModelAnalysis& a, int64_t ranks, const ClusterSpec& cluster,
                                        const OpTimeModel& ops, const Profile* local_floor, const std::vector<PlanChoice>& tried,
                                        double memory_limit) {
  Fastest f;
  bool any = false;
  for (size_t i = 0; i < tried.size(); ++i) {
    OASES_ASSIGN_OR_RETURN(Simulated s, simulate_plan(m, plan_of_choice(a, tried[i], ranks), cluster, ops, local_floor, false));
    f.step_s.push_back(s.sim.step_s);
    f.memory_bytes.push_back(s.memory_bytes);
    if (!f.fits(i, memory_limit)) {
      ++f.over;
      continue;
    }
    if (!any || s.sim.step_s < f.best_s()) f.best = i;
    any = true;
  }
  f.none_fits = !any;
  if (!any) f.best = 0;
  return f;
}

void add_distinct(std::vector<PlanChoice>* tried, const PlanChoice& c) {
  if (std::find(tried->begin(), tried->end(), c) == tried->end()) tried->push_back(c);
}

}  // namespace

Expected<std::string> choose_collective_matmuls_by_simulation(const PlanningModel& m, const ModelAnalysis& a, int64_t ranks,
                                                              const ClusterSpec& cluster, const OpTimeModel& ops, const Profile* local_floor,
                                                              PlanChoice* choice) {
  auto so = schedule_by_name(choice->schedule);
  if (!so || !so->interleave || choice->chunks < 2) return std::string();
  std::vector<PlanChoice> tried{*choice};
  for (bool every : {true, false}) {  // every sequence-parallel part (but the embedding) decomposed, or none
    PlanChoice c = *choice;
    for (size_t i = 0; i < c.layouts.size(); ++i)
      c.layouts[i].collective_matmul = every && c.layouts[i].sequence_parallel && c.layouts[i].tp > 1 && a.parts[i] != "embedding";
    add_distinct(&tried, c);
  }
  if (tried.size() < 2) return std::string();
  OASES_ASSIGN_OR_RETURN(Fastest f, fastest_by_simulation(m, a, ranks, cluster, ops, local_floor, tried, 0));
  *choice = tried[f.best];
  int on = 0;
  for (const Layout& l : choice->layouts) on += l.collective_matmul;
  return fmt::format("collective matmuls (decided by simulation beside {} x {} chunks): {} of {} parts, simulated {:.3f} ms (the search's choice {:.3f} ms)",
                     choice->schedule, choice->chunks, on, choice->layouts.size(), f.best_s() * 1e3, f.first_s() * 1e3);
}

Expected<std::string> rerank_by_simulation(const PlanningModel& m, const ModelAnalysis& a, int64_t ranks, const ClusterSpec& cluster,
                                           const OpTimeModel& ops, const Profile* local_floor, const std::vector<PlanChoice>& candidates,
                                           size_t limit, double memory_limit, PlanChoice* choice, bool require_sp) {
  std::vector<PlanChoice> tried{*choice};  // the cost model's choice first
  // each candidate followed by itself without sequence parallelism: the chain model prices sp's
  // extra collectives and sharded norms by parts, the replay sees them in the program, and a space's
  // best by the chain model may be its sp variant where the replay finds the plain split faster
  // (bench/overlap h6144 tp 4, 2026-11-25: oases K=2 was no candidate, only oases K=2+sp)
  auto add_with_no_sp = [&](const PlanChoice& c) {
    if (require_sp && std::none_of(c.layouts.begin(), c.layouts.end(), [](const Layout& l) { return l.sequence_parallel; })) return;
    if (tried.size() < limit) add_distinct(&tried, c);
    if (require_sp) return;  // --sequence-parallel: no variant without it
    PlanChoice no_sp = c;
    for (Layout& l : no_sp.layouts) l.sequence_parallel = l.collective_matmul = false;
    if (tried.size() < limit) add_distinct(&tried, no_sp);
  };
  add_with_no_sp(*choice);
  for (size_t i = 0; i < candidates.size() && tried.size() < limit; ++i) add_with_no_sp(candidates[i]);
  if (tried.size() < 2) return std::string();
  OASES_ASSIGN_OR_RETURN(Fastest f, fastest_by_simulation(m, a, ranks, cluster, ops, local_floor, tried, memory_limit));
  const std::string cap = describe_bytes(memory_limit);
  std::string over = f.over ? fmt::format(" ({} left out: their programs need more than {} a rank)", f.over, cap) : "";
  std::string was = fmt::format("{} K={}", choice->schedule, choice->chunks);
  // every plan tried, in the order tried (the cost model's choice first)
  std::vector<std::string> each;
  for (size_t i = 0; i < tried.size(); ++i) {
    bool sp = false, cm = false;
    for (const Layout& l : tried[i].layouts) sp |= l.sequence_parallel, cm |= l.collective_matmul;
    each.push_back(fmt::format("{} K={}{}: {:.1f} ms{}", tried[i].schedule, tried[i].chunks, cm ? "+cm" : sp ? "+sp" : "", f.step_s[i] * 1e3,
                               f.fits(i, memory_limit) ? "" : fmt::format(" ({}, over the limit)", describe_bytes(f.memory_bytes[i]))));
  }
  over += fmt::format("\n    simulated: {}", fmt::join(each, "; "));
  *choice = tried[f.best];
  const size_t fitting = tried.size() - f.over;
  if (f.none_fits) {
    return fmt::format("re-ranked by simulation: no candidate's program fits {} a rank; the cost model's choice ({}) stays, simulated {:.3f} ms, {}{}",
                       cap, was, f.first_s() * 1e3, describe_bytes(f.memory_bytes.front()), over);
  }
  if (f.best == 0) {
    return fmt::format("re-ranked by simulation: the cost model's choice ({}, simulated {:.3f} ms) is the fastest of {} candidates{}", was,
                       f.first_s() * 1e3, fitting, over);
  }
  return fmt::format("re-ranked by simulation: {} K={} ({}) simulated {:.3f} ms is the fastest of {} candidates; the cost model's choice: {}, {:.3f} ms{}{}",
                     choice->schedule, choice->chunks, describe_layouts(a, choice->layouts), f.best_s() * 1e3, fitting, was, f.first_s() * 1e3,
                     f.fits(0, memory_limit) ? "" : fmt::format(" ({}, over the limit)", describe_bytes(f.memory_bytes.front())), over);
}

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

}  // namespace oases
