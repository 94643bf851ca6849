#include "tools/plan_driver.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "executor/emulated_link.h"
#include "executor/executor.h"
#include "planner/chunking.h"
#include "planner/schedule.h"
#include "planner/strategy.h"

namespace oases {

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

std::vector<PartLayout> part_layouts_of(const ModelAnalysis& a, const std::vector<Layout>& layouts) {
  std::vector<PartLayout> out;
  for (size_t i = 0; i < a.parts.size() && i < layouts.size(); ++i) out.push_back(PartLayout{a.parts[i], layouts[i].tp, layouts[i].sp});
  return out;
}

Expected<RankProgram> build_rank_program(const PlanningModel& m, const ModelAnalysis& a, const PlanChoice& plan, int64_t ranks) {
  RankProgram rp;
  Graph fwd = m.forward;
  StrategyOptions so;
  auto st = apply_part_layouts(fwd, part_layouts_of(a, plan.layouts), ranks, so);
  if (!st) return st.status().with_context(m.path);
  rp.strategy = std::move(*st);
  TrainingSpec spec;
  if (plan.chunks > 1) {
    int k = static_cast<int>(plan.chunks);
    spec.before_autodiff = [k](Graph g) { return chunk_batch(g, k); };
  }
  auto tg = build_training_graph(std::move(fwd), spec);
  if (!tg) return tg.status().with_context(m.path);
  OASES_RETURN_IF_ERROR(split_batch_inputs(tg->graph, &rp.strategy).with_context(m.path));
  rp.mesh = rp.strategy.mesh;
  if (ranks > 1) {
    auto pg = partition_training(tg->graph, tg->params, rp.strategy);
    if (!pg) return pg.status().with_context(m.path);
    rp.graph = std::move(pg->local);
    rp.collectives = pg->collectives;
  } else {
    rp.graph = std::move(tg->graph);
  }
  for (ValueId p : tg->params) rp.param_bytes += static_cast<double>(rp.graph.value(p).nbytes());
  OASES_ASSIGN_OR_RETURN(ScheduleOptions so2, schedule_by_name(plan.schedule));
  OASES_RETURN_IF_ERROR(apply_recompute(rp.graph, so2.checkpoint).status());
  OASES_ASSIGN_OR_RETURN(rp.order, schedule_program(rp.graph, so2));
  ExecOptions eo;
  eo.order = rp.order;
  OASES_ASSIGN_OR_RETURN(Program prog, compile_program(rp.graph, eo));
  rp.arena_bytes = static_cast<double>(prog.memory.arena_bytes);
  rp.exec_order = program_order(prog);
  rp.exec_graph = std::move(prog.graph);
  return rp;
}

Expected<Simulated> simulate_plan(const PlanningModel& m, const ModelAnalysis& a, const PlanChoice& plan, const ClusterSpec& cluster,
                                  const OpTimeModel& ops, const Profile* local_floor, bool trace) {
  Simulated s;
  OASES_ASSIGN_OR_RETURN(s.program, build_rank_program(m, a, plan, cluster.ranks()));
  SimOptions o;
  o.cluster = &cluster;
  o.ops = &ops;
  o.local_floor = local_floor;
  o.trace = trace;
  o.param_bytes = s.program.param_bytes;
  OASES_ASSIGN_OR_RETURN(s.sim, simulate_rank(s.program.exec_graph, s.program.exec_order, s.program.mesh, o));
  // the trainer keeps parameters and AdamW's two moments; gradients and activations live in the arena
  s.memory_bytes = 3.0 * s.program.param_bytes + s.program.arena_bytes;
  return s;
}

ClusterSpec this_machine(int64_t ranks, const Profile* profile, const std::string& emulate_link, int threads_per_rank) {
  DeviceSpec cpu = profile && profile->has_device ? profile->device : *find_device("CPU");
  LinkSpec shm{"shared-memory", 10, 2};
  if (profile) {
    // alpha-beta of the local communicator from the profile's all-reduces
    double big_b = 0, big_t = 0, small_b = 1e300, small_t = 0;
    int64_t p = 2;
    for (const CollectiveSample& c : profile->collectives) {
      if (c.kind != CollectiveKind::kAllReduce || c.link != "shared-memory") continue;
      if (c.bytes > big_b) {
        big_b = c.bytes;
        big_t = c.us;
        p = c.group;
      }
      if (c.bytes < small_b) {
        small_b = c.bytes;
        small_t = c.us;
      }
    }
    if (big_t > 0) {
      double f = 2.0 * static_cast<double>(p - 1) / static_cast<double>(p);
      shm.bandwidth_gbps = f * big_b / (big_t * 1e-6) / 1e9;
      shm.latency_us = std::max(0.1, small_t / (2.0 * static_cast<double>(p - 1)));
    }
  }
  std::optional<LinkSpec> emu;
  if (!emulate_link.empty()) {
    auto lm = parse_link_model(emulate_link);
    if (lm) emu = LinkSpec{"emulated", lm->bandwidth_gbps, lm->latency_us};
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return local_cluster(ranks, cpu, shm, emu ? &*emu : nullptr, cores, threads_per_rank);
}

OpTimeModel op_time_model(const ClusterSpec& cluster, const Profile* profile, int64_t ranks, int threads_per_rank) {
  if (!profile) return OpTimeModel(nullptr, cluster.device, 1.0);
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (profile->machine.contains("cores")) cores = profile->machine.value("cores", cores);
  double now = std::max(1.0, static_cast<double>(ranks * threads_per_rank) / cores);
  double then = std::max(1.0, static_cast<double>(profile->ranks * profile->threads_per_rank) / cores);
  return OpTimeModel(profile, profile->has_device ? profile->device : cluster.device, now / then);
}

}  // namespace oases
