#include "tools/plan_driver.h"

#include <algorithm>

#include <fmt/format.h>

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

Expected<RankProgram> planned_rank_program(const PlanningModel& m, const Plan& plan) {
  GlobalProgramOptions go;
  go.model_path = m.path;
  OASES_ASSIGN_OR_RETURN(GlobalProgram gp, build_global_program(m.forward, TrainingSpec{}, plan, plan.mesh.ranks, go));
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
  o.param_bytes = s.program.param_bytes;
  OASES_ASSIGN_OR_RETURN(s.sim, simulate_rank(s.program.program.graph, s.program.program.order, s.program.mesh, o));
  // the trainer keeps parameters and AdamW's two moments; gradients and activations live in the arena
  s.memory_bytes = 3.0 * s.program.param_bytes + static_cast<double>(s.program.program.memory.arena_bytes);
  return s;
}

}  // namespace oases
