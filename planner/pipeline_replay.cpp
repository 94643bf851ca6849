#include "planner/pipeline_replay.h"

#include <algorithm>

#include <fmt/format.h>

#include "graph/op_registry.h"
#include "planner/reshard_nodes.h"

namespace oases {

namespace {

bool backward_work(const Node& n) {
  return n.phase == Node::Phase::kBackward || n.phase == Node::Phase::kRecompute;
}

// Time of the forward transfers of stage `s`'s program to stage s + 1 (per micro-batch: their sum
// over `micro_batches`).
double boundary_seconds(const RankProgram& rp, const StageProgramInfo& info, const Plan& plan, int s) {
  double sum = 0;
  for (const std::string& name : info.transfer_nodes) {
    auto it = rp.program.reshards.find(name);
    if (it == rp.program.reshards.end()) continue;
    const ReshardProblem& p = it->second->problem;
    if (p.src.placed.ranks.empty() || p.dst.placed.ranks.empty()) continue;
    if (plan.stage_of_rank(p.src.placed.ranks.front()) == s && plan.stage_of_rank(p.dst.placed.ranks.front()) == s + 1)
      sum += it->second->plan.predicted_s;
  }
  return sum / static_cast<double>(std::max<int64_t>(1, plan.micro_batches));
}

}  // namespace

Expected<PipelineReplay> replay_pipeline(const StageGlobals& sg, const ClusterSpec& cluster, const OpTimeModel& ops, const Profile* local_floor) {
  const Plan& plan = sg.plan;
  const ReshardCluster machine = reshard_cluster(cluster, plan.world());
  OASES_ASSIGN_OR_RETURN(const PipelineSchedule schedule, parse_pipeline(plan.pipeline));
  const int S = static_cast<int>(plan.num_stages()), M = static_cast<int>(std::max<int64_t>(1, plan.micro_batches)),
            K = static_cast<int>(plan.mesh().chunk_count());
  PipelineReplay out;
  RankProgramOptions ro;
  ro.slice_constants = false;  // shapes only: the weights may be unread
  const std::vector<const GlobalProgram*> globals = sg.programs();
  for (int s = 0; s < S; ++s) {
    StageReplay st;
    st.stage = s;
    st.world_rank = plan.first_rank(s);
    StageProgramInfo info;
    auto rp = build_stage_program(globals, plan, machine, st.world_rank, ro, &info);
    if (!rp) return rp.status().with_context(fmt::format("stage {}", s));
    const ProgramLayout& prog = rp->program;
    SimOptions o;
    o.cluster = &cluster;
    o.ops = &ops;
    o.local_floor = local_floor;
    o.param_bytes = rp->param_bytes;
    auto sim = simulate_rank(prog.graph, prog.order, rp->mesh, o);
    if (!sim) return sim.status().with_context(fmt::format("stage {}'s program", s));
    double fwd = 0, bwd = 0, prev = 0;
    for (size_t i = 0; i < prog.order.size() && i < sim->instr_end_s.size(); ++i) {
      const double dt = sim->instr_end_s[i] - prev;
      prev = sim->instr_end_s[i];
      const Node& n = prog.graph.node(prog.order[i].node);
      const int micro = n.chunk < 0 ? -1 : n.chunk / K;
      if (micro < 0 || micro >= M) {
        st.other_s += dt;
      } else {
        (backward_work(n) ? bwd : fwd) += dt;
      }
    }
    st.other_s += std::max(0.0, sim->step_s - sim->optimizer_s - prev);  // collectives still flying at the end
    st.forward_s = fwd / M;
    st.backward_s = bwd / M;
    st.optimizer_s = sim->optimizer_s;
    st.memory_bytes = 3.0 * rp->param_bytes + static_cast<double>(prog.memory.arena_bytes);
    st.sim = std::move(*sim);
    out.times.forward_s.push_back(st.forward_s);
    out.times.backward_s.push_back(st.backward_s);
    if (s + 1 < S) out.times.transfer_s.push_back(boundary_seconds(*rp, info, plan, s));
    out.stages.push_back(std::move(st));
  }
  out.times.half_duplex = cluster.nodes > 1 && cluster.inter.kind == "emulated";
  OASES_ASSIGN_OR_RETURN(out.sim, simulate_pipeline(schedule, M, out.times));
  double other = 0, optimizer = 0;
  for (const StageReplay& st : out.stages) {
    other = std::max(other, st.other_s);
    optimizer = std::max(optimizer, st.optimizer_s);
  }
  out.step_s = out.sim.step_s + other + optimizer;
  return out;
}

}  // namespace oases
