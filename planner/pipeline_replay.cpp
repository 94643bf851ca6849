#include "planner/pipeline_replay.h"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "graph/blocks.h"
#include "graph/op_registry.h"
#include "planner/plan_report.h"
#include "planner/reshard_nodes.h"

namespace oases {

namespace {

bool backward_work(const Node& n) {
  return n.phase == Node::Phase::kBackward || n.phase == Node::Phase::kRecompute;
}

// What stage `s`'s program sends: the forward transfers to stage `to_stage` of one micro-batch (their
// sum over the micro-batches, divided by them) and, once a step, the transfers of values of no
// micro-batch (a tied table's gradient sum), in any direction.
struct Sends {
  double per_micro_batch_s = 0, per_step_s = 0;
};
Sends stage_sends(const RankProgram& rp, const StageProgramInfo& info, const Plan& plan, int s, int to_stage) {
  Sends out;
  const Graph& g = rp.program.graph;
  std::map<std::string, NodeId> by_name;
  for (NodeId id : g.nodes()) by_name.emplace(g.node(id).name, id);
  for (const std::string& name : info.transfer_nodes) {
    auto it = rp.program.reshards.find(name);
    auto node = by_name.find(name);
    if (it == rp.program.reshards.end() || node == by_name.end()) continue;
    const ReshardProblem& p = it->second->problem;
    if (p.src.placed.ranks.empty() || p.dst.placed.ranks.empty() || plan.stage_of_rank(p.src.placed.ranks.front()) != s) continue;
    // the value sent: made by a node of one micro-batch's chunk, or once a step
    const std::vector<ValueId>& in = g.node(node->second).inputs;
    const NodeId maker = in.empty() || in[0] == kNoId ? kNoId : g.producer(in[0]);
    if (maker == kNoId || g.node(maker).chunk < 0) {
      out.per_step_s += it->second->plan.predicted_s;
    } else if (plan.stage_of_rank(p.dst.placed.ranks.front()) == to_stage && !backward_work(g.node(node->second))) {
      out.per_micro_batch_s += it->second->plan.predicted_s;
    }
  }
  out.per_micro_batch_s /= static_cast<double>(std::max<int64_t>(1, plan.micro_batches));
  return out;
}

std::string virtual_text(const PipelinePlan& p) {
  return p.virtual_stages > 1 ? fmt::format(" x {} virtual", p.virtual_stages) : "";
}

}  // namespace

Expected<PipelineReplay> replay_pipeline(const StageGlobals& sg, const ClusterSpec& cluster, const OpTimeModel& ops, const Profile* local_floor) {
  const Plan& plan = sg.plan;
  const ReshardCluster machine = reshard_cluster(cluster, plan.world());
  OASES_ASSIGN_OR_RETURN(const PipelineSchedule schedule, parse_pipeline(plan.pipeline));
  const int S = static_cast<int>(plan.num_stages()), M = static_cast<int>(std::max<int64_t>(1, plan.micro_batches)),
            K = static_cast<int>(plan.mesh().chunk_count()), V = static_cast<int>(std::max<int64_t>(1, plan.virtual_stages)), C = S * V;
  // with virtual stages, a node's model stage: its block's range (nodes of no block: the embedding
  // on the first, the head and loss on the last, else the stage's first)
  std::vector<StageCut> cuts;
  if (V > 1) {
    OASES_ASSIGN_OR_RETURN(cuts, stage_cuts_of(plan));
  }
  auto model_stage = [&](const Node& n, int s) {
    const int b = block_of_scope(n.scope);
    for (int c = s; b >= 0 && c < C; c += S) {
      if (b >= cuts[static_cast<size_t>(c)].first && b <= cuts[static_cast<size_t>(c)].last) return c;
    }
    return s == S - 1 ? C - 1 : s;
  };
  std::vector<double> fwd_c(static_cast<size_t>(C), 0), bwd_c(static_cast<size_t>(C), 0), weight_c(static_cast<size_t>(C), 0);
  std::vector<double> fwd_link(static_cast<size_t>(C), 0), bwd_link(static_cast<size_t>(C), 0);  // of them, waits on the link
  std::vector<double> per_pair;  // per stage: one micro-batch's forward transfer to the next stage, per boundary
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
    o.param_bytes = rp->updated_bytes;
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
        const auto c = static_cast<size_t>(V > 1 ? model_stage(n, s) : s);
        const bool back = backward_work(n);
        (back ? bwd : fwd) += dt;
        (back ? bwd_c : fwd_c)[c] += dt;
        if (i < sim->instr_wait_s.size()) (back ? bwd_link : fwd_link)[c] += sim->instr_wait_s[i];
        if (info.weight_nodes.count(n.name)) weight_c[c] += dt;  // of the backward, what zb-h1 runs in W steps
      }
    }
    st.other_s += std::max(0.0, sim->step_s - sim->optimizer_s - prev);  // collectives still flying at the end
    st.forward_s = fwd / M;
    st.backward_s = bwd / M;
    st.optimizer_s = sim->optimizer_s;
    // parameters and AdamW's two moments (of the pieces a rank updates); gradients live in the arena
    st.memory_bytes = rp->param_bytes + 2.0 * rp->updated_bytes + static_cast<double>(prog.memory.arena_bytes);
    st.sim = std::move(*sim);
    // the forward transfers to the next stage, shared by the boundaries between the two (V of them,
    // the last stage's V - 1: back to the first)
    const Sends sends = stage_sends(*rp, info, plan, s, (s + 1) % S);
    per_pair.push_back(sends.per_micro_batch_s / std::max(1, s + 1 < S ? V : V - 1));
    out.exchange_s += sends.per_step_s;
    out.stages.push_back(std::move(st));
  }
  for (int c = 0; c < C; ++c) {
    const auto k = static_cast<size_t>(c);
    out.times.forward_s.push_back(fwd_c[k] / M);
    out.times.forward_link_s.push_back(fwd_link[k] / M);
    out.times.backward_link_s.push_back(bwd_link[k] / M);  // a split backward's: B's (the link's wait is the input gradient's)
    if (splits_backward(schedule)) {
      out.times.backward_s.push_back((bwd_c[k] - weight_c[k]) / M);  // B, and W apart
      out.times.weight_s.push_back(weight_c[k] / M);
    } else {
      out.times.backward_s.push_back(bwd_c[k] / M);
    }
    if (c + 1 < C) out.times.transfer_s.push_back(per_pair[static_cast<size_t>(c % S)]);
  }
  out.times.half_duplex = cluster.nodes > 1 && cluster.inter.kind == "emulated";
  out.times = share_cores(std::move(out.times), cluster, S, plan.world() / S);  // CPU ranks on one machine's cores
  OASES_ASSIGN_OR_RETURN(out.sim, simulate_pipeline(schedule, M, out.times, V));
  double other = 0, optimizer = 0;
  for (const StageReplay& st : out.stages) {
    other = std::max(other, st.other_s);
    optimizer = std::max(optimizer, st.optimizer_s);
  }
  out.step_s = out.sim.step_s + other + out.exchange_s + optimizer;
  return out;
}

Expected<PipelineReplay> replay_pipeline(const Graph& forward, const std::string& model_path, const Plan& plan, const ClusterSpec& cluster,
                                         const OpTimeModel& ops, const Profile* local_floor) {
  GlobalProgramOptions go;
  go.model_path = model_path;
  OASES_ASSIGN_OR_RETURN(StageGlobals sg, build_stage_globals(forward, TrainingSpec{}, plan, go));
  return replay_pipeline(sg, cluster, ops, local_floor);
}

Expected<PipelineRanking> rank_pipelines_by_replay(const Graph& forward, const std::string& model_path, const PipelinePlan& found,
                                                   double memory_limit, const ClusterSpec& cluster, const OpTimeModel& ops,
                                                   const Profile* local_floor) {
  PipelineRanking r;
  r.tried.push_back(found);
  r.tried.front().runners_up.clear();
  // a replay builds every stage's program of M x K chunks: a runner-up of more than twice the
  // search's choice's chunks is left unreplayed (GPT-3 on 1024 GPUs: one replay of 96 micro-batches
  // takes 90 s and 5 GB)
  const int64_t chunks = std::max<int64_t>(1, found.inner.chunks);
  for (const PipelinePlan& p : found.runners_up) {
    if (p.inner.chunks > 2 * chunks) {
      ++r.unreplayed;
      continue;
    }
    r.tried.push_back(p);
  }
  std::vector<std::string> each;
  bool any = false;
  // candidates that differ only in the pipeline schedule share their stages' global programs (the
  // schedule orders each rank's program, not the partition): built once, for the next in a row
  std::optional<StageGlobals> built;
  Plan built_for;
  auto same_but_schedule = [](Plan a, const Plan& b) {
    a.pipeline = b.pipeline;
    return a == b;
  };
  GlobalProgramOptions go;
  go.model_path = model_path;
  for (size_t i = 0; i < r.tried.size(); ++i) {
    const PipelinePlan& p = r.tried[i];
    const std::string what = fmt::format("replaying pipeline candidate {} ({})", i + 1, describe_pipeline(p));
    if (!built || !same_but_schedule(built_for, p.plan)) {
      built.reset();  // one candidate's programs in memory at a time
      auto sg = build_stage_globals(forward, TrainingSpec{}, p.plan, go);
      if (!sg) return sg.status().with_context(what);
      built = std::move(*sg);
      built_for = p.plan;
    }
    built->plan.pipeline = p.plan.pipeline;
    auto rep = replay_pipeline(*built, cluster, ops, local_floor);
    if (!rep) return rep.status().with_context(what);
    double mem = 0;
    for (const StageReplay& st : rep->stages) mem = std::max(mem, st.memory_bytes);
    const bool fits = memory_limit <= 0 || mem <= memory_limit;
    if (fits && (!any || rep->step_s < r.replays[r.best].step_s)) r.best = i;
    any |= fits;
    each.push_back(fmt::format("pp {} M={} {}{} {}{}: predicted {:.3f} ms, replayed {:.3f} ms, {}{}", p.stages, p.micro_batches,
                               pipeline_name(p.schedule), virtual_text(p), p.inner.schedule, p.per_stage ? " (own stage tp)" : "", p.step_s * 1e3,
                               rep->step_s * 1e3, describe_bytes(mem), fits ? "" : " (over the limit)"));
    r.memory_bytes.push_back(mem);
    r.replays.push_back(std::move(*rep));
  }
  r.none_fits = !any;
  const PipelinePlan& won = r.tried[r.best];
  std::string head;
  if (r.none_fits) {
    head = fmt::format("no pipeline candidate's programs fit {} a rank; the search's choice stays", describe_bytes(memory_limit));
  } else if (r.best == 0) {
    head = fmt::format("the search's choice is the fastest of {} replayed", r.tried.size());
  } else {
    const bool first_fits = memory_limit <= 0 || r.memory_bytes.front() <= memory_limit;
    head = fmt::format("pp {} M={} {}{} replayed {:.3f} ms is the fastest whose programs fit; the search's choice replayed {:.3f} ms{}",
                       won.stages, won.micro_batches, pipeline_name(won.schedule), virtual_text(won), r.replays[r.best].step_s * 1e3, r.replays.front().step_s * 1e3,
                       first_fits ? "" : fmt::format(", {} (over the limit)", describe_bytes(r.memory_bytes.front())));
  }
  if (r.unreplayed > 0)
    head += fmt::format(" ({} more not replayed: more than twice the {} chunks of the search's choice)", r.unreplayed, chunks);
  r.text = fmt::format("pipeline re-ranked by replay: {}\n    replayed: {}", head, fmt::join(each, "; "));
  return r;
}

}  // namespace oases
