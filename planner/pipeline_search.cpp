#include "planner/pipeline_search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "planner/analysis.h"
#include "planner/pipeline_program.h"
#include "planner/plan_report.h"
#include "planner/reshard.h"
#include "planner/reshard_nodes.h"
#include "planner/schedule.h"

namespace oases {

namespace {

// The cluster one stage's mesh of n GPUs sees: whole hosts, or n GPUs of one host.
ClusterSpec stage_cluster(const ClusterSpec& c, int64_t n) {
  ClusterSpec s = c;
  if (n >= c.gpus_per_node) {
    s.nodes = n / c.gpus_per_node;
  } else {
    s.gpus_per_node = n;
    s.nodes = 1;
  }
  s.nvlink_island = std::min(s.nvlink_island, s.gpus_per_node);
  return s;
}

// -1: the embedding, -2: the head, else the block of "layer.N.attn" / "layer.N.mlp".
int block_of_part(const std::string& name) {
  if (name.rfind("layer.", 0) == 0) return std::atoi(name.c_str() + 6);
  return name == "embedding" ? -1 : -2;
}

// Per part of the chain under one inner choice: time of one micro-batch, bytes.
struct PartFigures {
  std::vector<double> fwd, bwd, static_bytes, saved_all, transient;
  std::vector<double> wgt;  // of bwd: the weight-gradient nodes' time (a zero-bubble schedule's W)
  std::vector<double> fwd_link, bwd_link;  // of fwd and bwd: the exposed communication (the ranks wait on the link)
  std::vector<double> updated_bytes;  // the weights one rank updates (the distributed optimizer: 1/dp)
  // per micro-batch, what its weight gradients read (PartCost::weight_grads_chunk,
  // weight_acts_chunk): held from its B to its W under a zero-bubble schedule
  std::vector<double> weight_held;
  std::vector<double> grad_bytes;  // the part's weight gradients (in static_bytes)
  // per micro-batch, the [B, T, C] value entering the part (a block's first part's: what crosses a
  // stage boundary, forward as the activation, backward as its gradient)
  std::vector<double> entry;
  std::vector<int> block;  // -1 embedding, -2 head
  // A head tied to the embedding on a stage without it holds its own copy of the table (with its
  // gradient and moments): the embedding part's static bytes under the head's layout.
  double tied_copy_bytes = 0, tied_copy_updated = 0;
};

PartFigures part_figures(CostModel& cm, const PlanChoice& p, int micro_batches) {
  PartFigures f;
  auto so = schedule_by_name(p.schedule);
  ScheduleOptions s = so ? *so : ScheduleOptions{};
  const ModelAnalysis& a = cm.analysis();
  for (int i = 0; i < cm.num_parts(); ++i) {
    const Layout& cur = p.layouts[static_cast<size_t>(i)];
    const Layout& prev = i > 0 ? p.layouts[static_cast<size_t>(i - 1)] : cur;
    PartTime pt = cm.part_time(i, prev, cur, s, p.chunks);
    const PartCost& pc = cm.part(i, cur, p.chunks);
    double fw = pc.fwd_chunk * static_cast<double>(p.chunks) + pc.fwd_once;
    double bw = pc.bwd_chunk * static_cast<double>(p.chunks) + pc.bwd_once;
    double share = fw + bw > 0 ? fw / (fw + bw) : 1.0 / 3.0;
    f.fwd.push_back(pt.total() * share / micro_batches);
    f.bwd.push_back(pt.total() * (1 - share) / micro_batches);
    f.fwd_link.push_back(pt.exposed * share / micro_batches);
    f.bwd_link.push_back(pt.exposed * (1 - share) / micro_batches);
    const double wg = pc.wgt_chunk * static_cast<double>(p.chunks) + pc.wgt_once;
    f.wgt.push_back(fw + bw > 0 ? pt.total() * wg / (fw + bw) / micro_batches : 0.0);
    double st = cm.state_bytes(pc);
    f.static_bytes.push_back(st);
    f.grad_bytes.push_back(pc.param_bytes);
    f.updated_bytes.push_back(cm.updated_bytes(pc));
    f.saved_all.push_back(cm.part_saved(i, cur, s, p.chunks));
    // one micro-batch's chunks interleaved at a time; the loss part's saved activations are in saved_all
    const int64_t per_micro = std::max<int64_t>(1, p.chunks / micro_batches);
    f.transient.push_back(cm.part_working(i, cur, s, p.chunks, per_micro));
    f.block.push_back(block_of_part(a.parts[static_cast<size_t>(i)]));
    f.entry.push_back(static_cast<double>(per_micro) * pc.saved_entry_chunk);
    f.weight_held.push_back(static_cast<double>(per_micro) * (pc.weight_grads_chunk + pc.weight_acts_chunk));
  }
  if (a.tied_head) {
    const auto emb = std::find(f.block.begin(), f.block.end(), -1), head = std::find(f.block.begin(), f.block.end(), -2);
    if (emb != f.block.end() && head != f.block.end()) {
      // the table alone (not the embedding's other weights: its positions), rows over the head's
      // tp as the vocabulary-parallel head keeps them
      const Layout& head_layout = p.layouts[static_cast<size_t>(head - f.block.begin())];
      PartCost table = cm.part(static_cast<int>(emb - f.block.begin()), head_layout, p.chunks);
      const int64_t t = std::max<int64_t>(1, head_layout.tp);
      const bool rows_split = t > 1 && a.vocab > 0 && a.vocab % t == 0;
      table.param_bytes = 4.0 * a.tied_table_elements / static_cast<double>(rows_split ? t : 1);
      f.tied_copy_bytes = cm.state_bytes(table);
      f.tied_copy_updated = cm.updated_bytes(table);
    }
  }
  return f;
}

// Blocks cut into S contiguous ranges so the costliest stage (stage 0 also pays `first`, the last
// `last`) is as cheap as it can be.
std::vector<StageCut> balanced_cut(const std::vector<double>& block_cost, int S, double first, double last) {
  const int L = static_cast<int>(block_cost.size());
  std::vector<double> pre(static_cast<size_t>(L) + 1, 0);
  for (int b = 0; b < L; ++b) pre[static_cast<size_t>(b) + 1] = pre[static_cast<size_t>(b)] + block_cost[static_cast<size_t>(b)];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][j]: stages 0..s-1 over blocks [0, j)
  std::vector<std::vector<double>> best(static_cast<size_t>(S) + 1, std::vector<double>(static_cast<size_t>(L) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(static_cast<size_t>(L) + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= S; ++s) {
    for (int j = s; j <= L - (S - s); ++j) {
      for (int i = s - 1; i < j; ++i) {
        if (best[static_cast<size_t>(s) - 1][static_cast<size_t>(i)] == inf) continue;
        double c = pre[static_cast<size_t>(j)] - pre[static_cast<size_t>(i)] + (s == 1 ? first : 0) + (s == S ? last : 0);
        double v = std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(i)], c);
        if (v < best[static_cast<size_t>(s)][static_cast<size_t>(j)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(j)] = v;
          from[static_cast<size_t>(s)][static_cast<size_t>(j)] = i;
        }
      }
    }
  }
  std::vector<StageCut> cuts(static_cast<size_t>(S));
  int j = L;
  for (int s = S; s >= 1; --s) {
    int i = from[static_cast<size_t>(s)][static_cast<size_t>(j)];
    cuts[static_cast<size_t>(s) - 1] = {i, j - 1};
    j = i;
  }
  return cuts;
}

// A stage's mesh of n GPUs (dp x tp, placed from world rank `first`) holding a value as `spec`.
PlacedLayout stage_side(const Layout& l, int64_t n, int64_t first, ShardingSpec spec) {
  const int64_t tp = std::max<int64_t>(1, l.tp);
  Mesh mesh{{"dp", "tp"}, {n / tp, tp}, {}};
  return PlacedLayout{PlacedMesh::contiguous(mesh, first), std::move(spec)};
}

// The time the resharding planner predicts for moving `shape` (fp32) from `src` to `dst` on the
// machine as the stage programs' transfers are planned for it (planner/reshard_nodes.h: the hosts'
// ranks in order, NVLink inside a host where it has it).
double reshard_seconds(const ClusterSpec& cluster, int64_t world, const Shape& shape, PlacedLayout src, PlacedLayout dst) {
  ReshardProblem p;
  p.shape = shape;
  p.element_bytes = 4;
  p.src = std::move(src);
  p.dst = std::move(dst);
  // as the program's transfers are planned (the order searched for a few tasks, else the greedy)
  auto plan = plan_reshard(p, reshard_cluster(cluster, world), ReshardOptions{});
  return plan ? plan->predicted_s : std::numeric_limits<double>::infinity();
}

// One micro-batch's activation [B/M, T, H] crossing from stage s's mesh (n GPUs from rank s·n) to
// the next, laid out as the inner plan leaves it (batch over dp, sequence over tp with sequence
// parallelism, else replicated over tp).
double boundary_seconds(const ClusterSpec& cluster, int64_t gpus, int64_t from_first, int64_t to_first, int64_t n, const Layout& from,
                        const Layout& to, int64_t batch, int64_t seq, int64_t hidden, int micro_batches) {
  Shape shape{batch / micro_batches, seq, hidden};
  auto spec = [&](const Layout& l) {
    const int64_t tp = std::max<int64_t>(1, l.tp), dp = n / tp;
    ShardingSpec sp = ShardingSpec::replicated(3);
    if (dp > 1 && shape[0] % dp == 0) sp.dims[0] = DimSpec{0, 1};
    if (l.sequence_parallel && tp > 1 && seq % tp == 0) sp.dims[1] = DimSpec{1, 1};
    return sp;
  };
  return reshard_seconds(cluster, std::max<int64_t>(gpus, std::max(from_first, to_first) + n), shape, stage_side(from, n, from_first, spec(from)),
                         stage_side(to, n, to_first, spec(to)));
}

// A tied table's gradient [V, H] once a step: the last stage's (rows over its tp, as the
// vocabulary-parallel head keeps it) to the first stage, and the sum back.
double exchange_seconds(const ClusterSpec& cluster, int64_t gpus, int S, int64_t n, const Layout& first, const Layout& last, int64_t vocab,
                        int64_t hidden) {
  const Shape shape{vocab, hidden};
  auto side = [&](const Layout& l, int64_t at) {
    ShardingSpec sp = ShardingSpec::replicated(2);
    if (l.tp > 1 && vocab % l.tp == 0) sp.dims[0] = DimSpec{1, 1};
    return stage_side(l, n, at, sp);
  };
  const int64_t world = std::max<int64_t>(gpus, S * n);
  const int64_t last_first = static_cast<int64_t>(S - 1) * n;
  return reshard_seconds(cluster, world, shape, side(last, last_first), side(first, 0)) +
         reshard_seconds(cluster, world, shape, side(first, 0), side(last, last_first));
}

// Transfers already priced for one stage count (its meshes): the same for every pipeline schedule
// and inner choice, so each is priced once. Boundaries by the two stages' layouts, the micro-batch
// count and where the boundary lies among the hosts (its first rank's place in a host, whether it
// crosses hosts); tied-table exchanges by the first and last stages' layouts.
struct BoundaryCache {
  std::map<std::tuple<Layout, Layout, int, int64_t, int64_t, bool>, double> boundary;
  std::map<std::pair<Layout, Layout>, double> exchange;
};

// The layout a stage's activations leave and enter it in: its first block's (one layout a stage).
Layout stage_layout(const ModelAnalysis& a, const PlanChoice& p, const StageCut& cut) {
  Layout l = p.layouts.front();
  auto it = a.part_index.find(fmt::format("layer.{}.attn", cut.first));
  if (it != a.part_index.end()) l = p.layouts[static_cast<size_t>(it->second)];
  return l;
}

// Whether parts of block `b` (-1 the embedding, -2 the head) are in the range `cut`, the embedding
// and the head where their flags say so.
bool holds_part(int b, const StageCut& cut, bool embedding, bool head) {
  return (b == -1 && embedding) || (b == -2 && head) || (b >= cut.first && b <= cut.last);
}

// Fills `st`'s forward and backward time and memory from the parts it holds (its blocks, the
// embedding on the first stage, the head on the last) under one inner choice's figures; returns the
// bytes of its parameters' static state (the optimizer step's size).
// Returns the bytes of weights the stage's ranks update (the optimizer's work).
double add_stage_parts(const PartFigures& f, int M, PipelineStagePlan* st) {
  double statics = 0, updated = 0;
  // A zero-bubble schedule splits each backward into B (the input gradient's chain, sent on) and W
  // (the weight gradients); the first stage sends no gradient: its B steps are empty, its W runs the
  // whole backward.
  const bool split = std::any_of(st->flight.begin(), st->flight.end(), [](const InFlight& x) { return x.kind == 2; });
  const bool w_only = split && st->embedding;
  const size_t V = st->ranges.size();
  // Per range of the stage (a virtual stage; the embedding on the first, the head on the last), its
  // parts' times and state, one micro-batch's saved activations (`sv`) and what its W reads (`wh`),
  // and one micro-batch's backward of it, part by part from the last: while part p's runs, the
  // parts before it still hold their saved activations, the parts after it what their W will read
  // (a zero-bubble schedule's B; nothing otherwise), and p its working set (the head's beside its
  // own activations, which its backward reads). `first`: the range's first backward, which makes
  // its weight gradients as it goes (those of the parts after p).
  std::vector<double> sv(V, 0), wh(V, 0), own(V, 0), first(V, 0), made_by(V, 0), boundary(V, 0);
  for (size_t r = 0; r < V; ++r) {
    const StageCut& cut = st->ranges[r];
    const bool with_embedding = r == 0 && st->embedding, with_head = r + 1 == V && st->head;
    auto held = [&](size_t i) { return holds_part(f.block[i], cut, with_embedding, with_head); };
    for (size_t i = 0; i < f.block.size(); ++i) {
      if (!held(i)) continue;
      st->forward_s += f.fwd[i];
      st->backward_s += f.bwd[i];
      if (split) st->weight_s += w_only ? f.bwd[i] : f.wgt[i];
      statics += f.static_bytes[i] - f.grad_bytes[i];
      updated += f.updated_bytes[i];
      sv[r] += f.saved_all[i] / M;
      wh[r] += f.weight_held[i];
      made_by[r] += f.grad_bytes[i];
      if (boundary[r] == 0 && f.block[i] >= 0) boundary[r] = f.entry[i];
    }
    double upto = sv[r];         // saved activations of the parts up to p
    double after = 0, made = 0;  // what the parts after p hold for their W; their weight gradients
    for (size_t i = f.block.size(); i-- > 0;) {
      if (!held(i)) continue;
      own[r] = std::max(own[r], upto + after + f.transient[i]);
      first[r] = std::max(first[r], upto + after + made + f.transient[i]);
      upto -= f.saved_all[i] / M;
      if (split && !w_only) after += f.weight_held[i];
      made += f.grad_bytes[i];
    }
    if (w_only) wh[r] = sv[r];  // the first stage's W runs the whole backward: it reads them all
  }
  if (st->head && !st->embedding) statics += f.tied_copy_bytes, updated += f.tied_copy_updated;
  // Step by step over the stage's schedule (pipeline.h in_flight_profile), range by range: a
  // micro-batch from its forward to its backward (B) holds the range's saved activations (on the
  // last stage the head's too); from its B to its W (a zero-bubble schedule's deferred weight
  // gradients) only what its W reads (on the first stage, whose W runs the whole backward, still
  // its saved activations); a backward step of range r holds its own micro-batch's figure above in
  // place of that micro-batch's saved activations. A range's weight gradients exist from the first
  // step that makes them (B, or W where the backward is split) to the optimizer step.
  // (bench/plan/memory_table.py --pipelines; GPT-3 on 8 x 128 A100s: every stage's replayed memory
  // beside this in docs/PLANNER.md.) `held`: what the micro-batches in flight hold, kept up to
  // date step by step (a step changes only its own range's counts).
  //
  // Beside them the transfers' buffers: what the next forward and the next backward receive, which
  // the other stage has mostly sent by then (the value crossing the boundary: the range's entry,
  // forward as the activation and backward as its gradient; the first range of the first stage
  // receives no activation, the last range of the last stage no gradient). A send's buffer is the
  // value sent, mostly freed before a step's busiest node (bench/plan/memory_table.py --pipelines:
  // counting the previous step's sends too put stage 0 of llama_4l pp 2 tp 2 V 2 at 1.17x).
  const std::vector<InFlight>& steps = st->flight;
  const size_t n = steps.size();
  auto range_of = [&](const InFlight& x) { return std::min(static_cast<size_t>(x.chunk), V - 1); };
  auto takes_activation = [&](size_t r) { return !(st->embedding && r == 0); };
  auto takes_gradient = [&](size_t r) { return !(st->head && r + 1 == V); };
  std::vector<double> ahead(n, 0);  // received for the next forward and backward after step i
  double next_f = 0, next_b = 0;
  for (size_t i = n; i-- > 0;) {
    ahead[i] = next_f + next_b;
    const size_t r = range_of(steps[i]);
    if (steps[i].kind == 0) next_f = takes_activation(r) ? boundary[r] : 0.0;
    if (steps[i].kind == 1) next_b = takes_gradient(r) ? boundary[r] : 0.0;
  }
  std::vector<int> fb(V, 0), bw(V, 0);
  double held = 0;
  std::vector<char> have(V, 0);
  double have_grads = 0, kept = 0;  // the weight gradients made so far
  for (size_t i = 0; i < n; ++i) {
    const InFlight& x = steps[i];
    const size_t c = range_of(x);
    const double held_before = held;
    held += (x.chunk_forward_backward - fb[c]) * sv[c] + (x.chunk_backward_weight - bw[c]) * wh[c];
    fb[c] = x.chunk_forward_backward, bw[c] = x.chunk_backward_weight;
    const bool makes_grads = split ? x.kind == 2 : x.kind == 1;
    const bool backward = w_only ? x.kind == 2 : x.kind == 1;
    double m = 0;
    if (backward) {
      // one micro-batch's backward of range c (on the first stage under zb-h1: its W) beside the
      // others' (the micro-batch itself held its range's saved activations until now)
      m = std::max(0.0, held_before - sv[c]) + (makes_grads && !have[c] ? first[c] : own[c]) + have_grads + ahead[i];
    } else {
      // what stays in flight, and the gradients once made (a W: the ones it made)
      m = held + have_grads + (makes_grads && !have[c] ? made_by[c] : 0) + ahead[i];
    }
    kept = std::max(kept, m);
    if (makes_grads && !have[c]) have[c] = 1, have_grads += made_by[c];
  }
  st->memory_bytes = statics + kept;
  return updated;
}

// One model stage's forward and backward of a micro-batch (and of them, the waits on the link): the
// parts in `cut`, the embedding on the first model stage, the head on the last.
struct RangeTimes {
  double fw = 0, bw = 0, fw_link = 0, bw_link = 0;
};
RangeTimes range_times(const PartFigures& f, const StageCut& cut, bool embedding, bool head) {
  RangeTimes r;
  for (size_t i = 0; i < f.block.size(); ++i) {
    if (holds_part(f.block[i], cut, embedding, head)) r.fw += f.fwd[i], r.bw += f.bwd[i], r.fw_link += f.fwd_link[i], r.bw_link += f.bwd_link[i];
  }
  return r;
}

// Prices S stages holding the model stages cut at `cuts` (S x V of them, model stage c on stage
// c mod S), stage s running the parts it holds as `fig[s]` (one inner choice's figures) says, with
// `layout[s]` at its boundaries.
PipelinePlan price_stages(CostModel& cm, const ClusterSpec& cluster, const OpTimeModel& ops, int64_t gpus, int M, const PlanChoice& inner,
                          PipelineSchedule sched, const std::vector<StageCut>& cuts, const std::vector<const PartFigures*>& fig,
                          const std::vector<Layout>& layout, BoundaryCache* priced, int V = 1) {
  const int C = static_cast<int>(cuts.size()), S = C / V;
  PipelinePlan pp;
  pp.stages = S;
  pp.stage_ranks = gpus / S;
  pp.micro_batches = M;
  pp.schedule = sched;
  pp.virtual_stages = V;
  pp.inner = inner;
  pp.zero = cm.zero();
  PipelineTimes t;
  for (int s = 0; s < S; ++s) {
    const PartFigures& f = *fig[static_cast<size_t>(s)];
    PipelineStagePlan st;
    for (int c = s; c < C; c += S) st.ranges.push_back(cuts[static_cast<size_t>(c)]);
    st.embedding = s == 0;
    st.head = s == S - 1;
    st.first_rank = s * pp.stage_ranks;
    st.ranks = pp.stage_ranks;
    st.layout = layout[static_cast<size_t>(s)];
    const std::vector<PipeStep> steps = stage_steps(sched, s, S, M, V);
    st.peak_in_flight = peak_in_flight(steps);
    st.flight = in_flight_profile(steps);
    const double updated = add_stage_parts(f, M, &st);
    pp.optimizer_s = std::max(pp.optimizer_s, ops.optimizer_seconds(updated));
    pp.memory_bytes = std::max(pp.memory_bytes, st.memory_bytes);
    if (s > 0 && !(layout[static_cast<size_t>(s)] == layout[0])) pp.per_stage = true;
    pp.stage.push_back(st);
  }
  // per model stage (with V = 1, each stage's own)
  for (int c = 0; c < C; ++c) {
    const RangeTimes rt = range_times(*fig[static_cast<size_t>(c % S)], cuts[static_cast<size_t>(c)], c == 0, c == C - 1);
    t.forward_s.push_back(rt.fw);
    t.forward_link_s.push_back(rt.fw_link);
    t.backward_link_s.push_back(rt.bw_link);  // a split backward's: B's (as the replay takes it)
    if (splits_backward(sched)) {
      // B: the input gradient's chain; W: the stage's weight gradients (add_stage_parts: the first
      // stage's whole backward). A split backward has no virtual stages: model stage c is stage c.
      const double wg = pp.stage[static_cast<size_t>(c)].weight_s;
      t.backward_s.push_back(rt.bw - wg);
      t.weight_s.push_back(wg);
    } else {
      t.backward_s.push_back(rt.bw);
    }
  }
  // each boundary between the two stages' layouts, where it lies among the hosts (alike
  // boundaries priced once)
  const ModelAnalysis& a = cm.analysis();
  const int64_t n = pp.stage_ranks, per_host = std::max<int64_t>(1, cluster.gpus_per_node);
  for (int c = 0; c + 1 < C; ++c) {
    const int s = c % S, r = (c + 1) % S;
    const Layout& from = layout[static_cast<size_t>(s)];
    const Layout& to = layout[static_cast<size_t>(r)];
    const int64_t first = s * n, to_first = r * n;
    const bool same_host = first / per_host == (to_first + n - 1) / per_host && to_first / per_host == (first + n - 1) / per_host;
    auto key = std::make_tuple(from, to, M, first % per_host, to_first % per_host, same_host);
    auto it = priced->boundary.find(key);
    if (it == priced->boundary.end())
      it = priced->boundary.emplace(key, boundary_seconds(cluster, gpus, first, to_first, n, from, to, a.batch, a.seq, a.hidden, M)).first;
    pp.transfer_s.push_back(it->second);
  }
  if (a.tied_head && S > 1) {
    auto key = std::make_pair(layout.front(), layout.back());
    auto it = priced->exchange.find(key);
    if (it == priced->exchange.end())
      it = priced->exchange.emplace(key, exchange_seconds(cluster, gpus, S, n, key.first, key.second, a.vocab, a.hidden)).first;
    pp.exchange_s = it->second;
  }
  t.transfer_s = pp.transfer_s;
  // emulated hosts (oases-train --hosts): a card carries one transfer at a time, either way
  t.half_duplex = cluster.nodes > 1 && cluster.inter.kind == "emulated";
  t = share_cores(std::move(t), cluster, S, pp.stage_ranks);  // CPU ranks on one machine's cores
  auto sim = simulate_pipeline(sched, M, t, V);
  if (!sim) {
    pp.why = sim.status().message();
    return pp;
  }
  pp.sim = *sim;
  pp.step_s = sim->step_s + pp.exchange_s + pp.optimizer_s;
  pp.bubble = sim->bubble;
  pp.found = true;
  return pp;
}

// Prices one pipeline of S stages on n GPUs each under the inner choice `inner`.
PipelinePlan price(CostModel& cm, const ClusterSpec& cluster, const OpTimeModel& ops, int64_t gpus, int S, int M, const PlanChoice& inner,
                   PipelineSchedule sched, int blocks, BoundaryCache* priced, int V = 1) {
  PartFigures f = part_figures(cm, inner, M);
  std::vector<double> block_cost(static_cast<size_t>(blocks), 0);
  double first = 0, last = 0;
  for (size_t i = 0; i < f.block.size(); ++i) {
    double c = f.fwd[i] + f.bwd[i];
    if (f.block[i] == -1) {
      first += c;
    } else if (f.block[i] == -2) {
      last += c;
    } else if (f.block[i] < blocks) {
      block_cost[static_cast<size_t>(f.block[i])] += c;
    }
  }
  // with virtual stages each of the S x V ranges balanced (so each stage's V of them are)
  std::vector<StageCut> cuts = balanced_cut(block_cost, S * V, first, last);
  std::vector<Layout> layouts;
  for (int s = 0; s < S; ++s) layouts.push_back(stage_layout(cm.analysis(), inner, cuts[static_cast<size_t>(s)]));
  return price_stages(cm, cluster, ops, gpus, M, inner, sched, cuts, std::vector<const PartFigures*>(static_cast<size_t>(S), &f), layouts,
                      priced, V);
}

// The pipeline `uniform` with each stage on its own tp (the sequence parallelism, schedule and
// chunks of `uniform`'s inner plan, its cuts): every stage takes the tp its parts run fastest
// under within the memory limit. Not found when no stage would change.
PipelinePlan price_own_meshes(CostModel& cm, const ClusterSpec& cluster, const OpTimeModel& ops, int64_t gpus, const PipelinePlan& uniform,
                              const PipelinePlanOptions& o, BoundaryCache* priced) {
  PipelinePlan none;
  const int S = uniform.stages, M = uniform.micro_batches;
  const int64_t n = uniform.stage_ranks;
  const PlanChoice& inner = uniform.inner;
  if (inner.layouts.empty()) return none;
  const bool sp = inner.layouts.front().sequence_parallel;
  for (const Layout& l : inner.layouts) {
    if (!(l == inner.layouts.front())) return none;  // per-part layouts: not cut into stages
  }
  // the alternatives: every tp the model divides by (heads, widths, vocabulary) that divides the
  // stage mesh and the inner search allows, all parts feasible
  std::vector<Layout> alts;
  std::vector<PartFigures> figs;
  for (int64_t tp : cm.analysis().tp_candidates) {
    if (tp < 1 || n % tp != 0 ||
        (!o.inner.degrees.empty() && std::find(o.inner.degrees.begin(), o.inner.degrees.end(), tp) == o.inner.degrees.end()))
      continue;
    PlanChoice c = inner;
    c.layouts.assign(inner.layouts.size(), Layout{tp, sp && tp > 1});
    bool ok = true;
    for (int i = 0; i < cm.num_parts() && ok; ++i) ok = cm.part(i, c.layouts[static_cast<size_t>(i)], c.chunks).feasible;
    if (!ok) continue;
    figs.push_back(part_figures(cm, c, M));
    alts.push_back(c.layouts.front());
  }
  if (alts.size() < 2) return none;
  const int V = uniform.virtual_stages;
  std::vector<StageCut> cuts;  // the model stages' ranges, in model order
  for (int c = 0; c < S * V; ++c) cuts.push_back(uniform.stage[static_cast<size_t>(c % S)].ranges.at(static_cast<size_t>(c / S)));
  std::vector<const PartFigures*> fig;
  std::vector<Layout> layouts;
  for (int s = 0; s < S; ++s) {
    const PipelineStagePlan& u = uniform.stage[static_cast<size_t>(s)];
    size_t pick = alts.size();
    double best = 0;
    for (size_t k = 0; k < alts.size(); ++k) {
      // this stage's parts under the alternative, counted as price_stages counts them
      PipelineStagePlan st;
      st.ranges = u.ranges;
      st.embedding = u.embedding;
      st.head = u.head;
      st.peak_in_flight = u.peak_in_flight;
      st.flight = u.flight;
      add_stage_parts(figs[k], M, &st);
      const double time = st.forward_s + st.backward_s;
      if (o.memory_limit > 0 && st.memory_bytes > o.memory_limit) continue;
      if (pick == alts.size() || time < best) {
        pick = k;
        best = time;
      }
    }
    if (pick == alts.size()) return none;
    fig.push_back(&figs[pick]);
    layouts.push_back(alts[pick]);
  }
  PipelinePlan p = price_stages(cm, cluster, ops, gpus, M, inner, uniform.schedule, cuts, fig, layouts, priced, V);
  if (!p.per_stage) return none;
  return p;
}

bool aligned(const ClusterSpec& c, int64_t n) {
  return n % c.gpus_per_node == 0 || c.gpus_per_node % n == 0;
}

}  // namespace

namespace {

// The best pipeline of S stages (every micro-batch count and schedule), with what was priced.
struct StageCountResult {
  std::vector<PipelinePlan> best;  // fastest first, at most PipelinePlanOptions::keep
  int64_t candidates = 0;
  std::string why;
  Status status;
};

// The plan of a found pipeline and its inner layouts in words (`stage_a`: the model on one
// stage's GPUs).
void with_plan(const ModelAnalysis& stage_a, PipelinePlan& p) {
  p.plan = plan_of_pipeline(stage_a, p);
  p.inner_layouts = describe_layouts(stage_a, p.inner.layouts);
}

// Keeps `c` among the `keep` fastest of `best` (fastest first).
void keep_fastest(std::vector<PipelinePlan>* best, PipelinePlan c, int keep) {
  auto at = std::upper_bound(best->begin(), best->end(), c.step_s, [](double t, const PipelinePlan& p) { return t < p.step_s; });
  if (at - best->begin() >= std::max(1, keep)) return;
  best->insert(at, std::move(c));
  if (static_cast<int>(best->size()) > std::max(1, keep)) best->pop_back();
}

StageCountResult search_stage_count(ModelAnalyzer& analyzer, const ClusterSpec& cluster, const OpTimeModel& ops, int64_t gpus, int64_t S,
                                    int blocks, const PipelinePlanOptions& o) {
  StageCountResult out;
  const int64_t n = gpus / S;
  auto an = analyzer.analyze(n);
  if (!an) {
    out.status = an.status();
    return out;
  }
  CostModel cm(*an, stage_cluster(cluster, n), ops);
  BoundaryCache priced;
  for (bool zero : o.zero) {
    cm.set_zero(zero);
    for (int64_t M : pipeline_micro_batches(S, an->batch, o)) {
      SearchOptions so = o.inner;
      // one tp x dp layout for every part: what oases-train's stages run (per-part layouts inside
      // stages are not cut into stage programs yet)
      so.allow_mixed = false;
      so.chunks.clear();
      for (int64_t k : o.inner_chunks) so.chunks.push_back(M * k);
      // The inner search prices the whole model on one stage's GPUs with every micro-batch's
      // activations kept; a stage keeps only its blocks and the micro-batches in flight. So the
      // fastest inner plan is priced first with no limit, and, when a stage of it does not fit,
      // the fastest whose whole-model memory fits the stages' memory together.
      std::vector<double> limits{0.0};
      if (o.memory_limit > 0) limits.push_back(o.memory_limit * static_cast<double>(S));
      for (double lim : limits) {
        so.memory_limit = lim;
        SearchResult r = search_plan(cm, so);
        if (!r.found) {
          out.why = fmt::format("{} stages of {} GPUs, {} micro-batches: no inner plan", S, n, M);
          continue;
        }
        bool fits_somewhere = false;
        // each schedule; 1F1B also with every number of virtual stages the blocks allow
        std::vector<std::pair<PipelineSchedule, int>> orders;
        for (PipelineSchedule sched : o.schedules) {
          orders.push_back({sched, 1});
          if (sched != PipelineSchedule::k1F1B) continue;
          for (int V : o.virtual_stages) {
            if (V > 1 && check_virtual_stages(sched, static_cast<int>(S), static_cast<int>(M), V, blocks).is_ok()) orders.push_back({sched, V});
          }
        }
        for (const auto& [sched, V] : orders) {
          PipelinePlan c = price(cm, cluster, ops, gpus, static_cast<int>(S), static_cast<int>(M), r.best, sched, blocks, &priced, V);
          ++out.candidates;
          if (!c.found) continue;
          // each stage on the tp its own parts prefer (which may also fit where one tp for all does not)
          PipelinePlan own = price_own_meshes(cm, cluster, ops, gpus, c, o, &priced);
          if (own.found) {
            ++out.candidates;
            if (o.memory_limit <= 0 || own.memory_bytes <= o.memory_limit) {
              fits_somewhere = true;
              keep_fastest(&out.best, own, o.keep);
            }
          }
          if (o.memory_limit > 0 && c.memory_bytes > o.memory_limit) {
            out.why = fmt::format("{} stages{} of {} GPUs, {} micro-batches, {}: {} per GPU", S, V > 1 ? fmt::format(" x {} virtual", V) : "", n,
                                  M, pipeline_name(sched), describe_bytes(c.memory_bytes));
            continue;
          }
          fits_somewhere = true;
          keep_fastest(&out.best, std::move(c), o.keep);
        }
        if (fits_somewhere) break;
      }
    }
  }
  for (PipelinePlan& p : out.best) with_plan(*an, p);
  return out;
}

}  // namespace

std::vector<int64_t> pipeline_stage_counts(const ClusterSpec& cluster, int64_t gpus, int blocks, const PipelinePlanOptions& o) {
  std::vector<int64_t> counts;
  for (int64_t S : o.stage_counts) {
    if (S >= 2 && S <= blocks && gpus % S == 0) counts.push_back(S);
  }
  if (o.stage_counts.empty()) {
    for (int64_t S = 2; S <= std::min<int64_t>(gpus, blocks); ++S) {
      if (gpus % S == 0 && aligned(cluster, gpus / S)) counts.push_back(S);
    }
  }
  return counts;
}

std::vector<int64_t> pipeline_micro_batches(int64_t S, int64_t batch, const PipelinePlanOptions& o) {
  std::vector<int64_t> out;
  for (int64_t f : o.micro_factors) {
    int64_t M = f * S;
    if (M <= batch && batch % M == 0) out.push_back(M);
  }
  return out;
}

Expected<PipelinePlan> search_pipeline(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, const ClusterSpec& cluster,
                                       const OpTimeModel& ops, int64_t gpus, const PipelinePlanOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  PipelinePlan best;
  const int blocks = count_blocks(train);
  if (blocks < 2) {
    best.why = "the model has fewer than 2 blocks";
    return best;
  }
  std::vector<int64_t> counts = pipeline_stage_counts(cluster, gpus, blocks, o);
  // each stage count on a thread of its own (its own analysis and cost model), merged in order
  // (the model read once for all of them: its structure, degrees and records)
  std::vector<StageCountResult> results(counts.size());
  ModelAnalyzer analyzer(forward, train, params);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < counts.size(); i = next++) results[i] = search_stage_count(analyzer, cluster, ops, gpus, counts[i], blocks, o);
  };
  size_t threads = std::min<size_t>(counts.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  std::string why = "no stage count divides the GPUs into host-aligned meshes";
  int64_t candidates = 0;
  std::vector<PipelinePlan> fastest;
  for (StageCountResult& r : results) {
    if (!r.status.is_ok()) return r.status;
    candidates += r.candidates;
    if (!r.why.empty()) why = r.why;
    for (PipelinePlan& p : r.best) keep_fastest(&fastest, std::move(p), o.keep);
  }
  if (!fastest.empty()) {
    best = std::move(fastest.front());
    best.runners_up.assign(std::make_move_iterator(fastest.begin() + 1), std::make_move_iterator(fastest.end()));
  }
  if (!best.found) best.why = why;
  best.candidates = candidates;
  best.search_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return best;
}

Expected<PipelinePlan> price_pipeline(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, const ClusterSpec& cluster,
                                      const OpTimeModel& ops, int64_t gpus, int stages, int64_t tp, int micro_batches,
                                      PipelineSchedule schedule, const std::string& inner_schedule, bool zero, int virtual_stages) {
  const int blocks = count_blocks(train);
  if (stages < 1 || gpus % stages != 0 || stages > blocks) return error("{} stages of {} blocks on {} GPUs", stages, blocks, gpus);
  OASES_RETURN_IF_ERROR(check_virtual_stages(schedule, stages, micro_batches, virtual_stages, blocks));
  int64_t n = gpus / stages;
  if (tp < 1 || n % tp != 0) return error("tp {} does not divide a stage of {} GPUs", tp, n);
  ClusterSpec sc = stage_cluster(cluster, n);
  OASES_ASSIGN_OR_RETURN(ModelAnalysis a, analyze_model(forward, train, params, n));
  CostModel cm(a, sc, ops);
  cm.set_zero(zero);
  PlanChoice p;
  p.schedule = inner_schedule;
  p.chunks = micro_batches;
  p.layouts.assign(a.parts.size(), Layout{tp, false});
  for (int i = 0; i < cm.num_parts(); ++i) {
    const PartCost& pc = cm.part(i, p.layouts[static_cast<size_t>(i)], p.chunks);
    if (!pc.feasible) return error("tp {} with {} micro-batches: {}: {}", tp, micro_batches, a.parts[static_cast<size_t>(i)], pc.why);
  }
  BoundaryCache priced;
  PipelinePlan pp = price(cm, cluster, ops, gpus, stages, micro_batches, p, schedule, blocks, &priced, virtual_stages);
  if (!pp.found) return Status::error(pp.why);
  with_plan(a, pp);
  return pp;
}

std::vector<StageCut> model_cuts(const PipelinePlan& p) {
  std::vector<StageCut> cuts;
  const int S = static_cast<int>(p.stage.size()), V = std::max(1, p.virtual_stages);
  for (int c = 0; c < S * V; ++c) {
    cuts.push_back(p.stage[static_cast<size_t>(c % S)].ranges.at(static_cast<size_t>(c / S)));
  }
  return cuts;
}

nlohmann::json pipeline_plan_json(const PipelinePlan& p) {
  nlohmann::json j;
  j["stages"] = p.stages;
  j["stage_ranks"] = p.stage_ranks;
  j["micro_batches"] = p.micro_batches;
  j["schedule"] = pipeline_name(p.schedule);
  if (p.virtual_stages > 1) j["virtual_stages"] = p.virtual_stages;
  j["cuts"] = stages_string(model_cuts(p));
  j["inner"] = {{"schedule", p.inner.schedule}, {"chunks_per_micro_batch", p.micro_batches > 0 ? p.inner.chunks / p.micro_batches : 0}};
  if (!p.inner_layouts.empty()) j["inner"]["layouts"] = p.inner_layouts;
  if (p.per_stage) {
    // each stage's mesh (the plan's "pipeline" object lists them as its stages)
    nlohmann::json meshes = nlohmann::json::array();
    for (const auto& s : p.stage) meshes.push_back({{"tp", s.layout.tp}, {"dp", s.ranks / std::max<int64_t>(1, s.layout.tp)}});
    j["meshes"] = meshes;
  }
  j["step_s"] = p.step_s;
  j["bubble"] = p.bubble;
  j["optimizer_s"] = p.optimizer_s;
  j["memory_bytes"] = p.memory_bytes;
  j["transfer_s"] = p.transfer_s;
  j["exchange_s"] = p.exchange_s;
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stage) {
    stages.push_back({{"blocks", stages_string(s.ranges)},
                      {"embedding", s.embedding},
                      {"head", s.head},
                      {"ranks", fmt::format("{}-{}", s.first_rank, s.first_rank + s.ranks - 1)},
                      {"tp", s.layout.tp},
                      {"sequence_parallel", s.layout.sequence_parallel},
                      {"forward_s", s.forward_s},
                      {"backward_s", s.backward_s},
                      {"weight_s", s.weight_s},
                      {"memory_bytes", s.memory_bytes},
                      {"peak_in_flight", s.peak_in_flight}});
  }
  j["stage"] = stages;
  nlohmann::json ev = nlohmann::json::array();
  for (const PipelineEvent& e : p.sim.events) {
    ev.push_back({{"stage", e.stage}, {"forward", e.forward}, {"micro", e.micro}, {"transfer", e.transfer}, {"start_s", e.start_s}, {"end_s", e.end_s}});
    if (e.weight) ev.back()["weight"] = true;
  }
  j["timeline"] = ev;
  return j;
}

std::string describe_pipeline(const PipelinePlan& p) {
  if (!p.found) return "no pipeline plan: " + p.why;
  const std::vector<StageCut> cuts = model_cuts(p);
  double xfer = p.transfer_s.empty() ? 0 : *std::max_element(p.transfer_s.begin(), p.transfer_s.end());
  std::string tps;
  if (p.per_stage) {
    for (const auto& s : p.stage) tps += fmt::format("{}{}", tps.empty() ? " ; stage tp " : ",", s.layout.tp);
  }
  return fmt::format(
      "pp {} x {} GPUs, {} micro-batches, {}{}{}, blocks {} ; inner {} K={}{} ; bubble {:.0f}%, transfer {:.3f} ms per micro-batch{}",
      p.stages, p.stage_ranks, p.micro_batches, pipeline_name(p.schedule),
      p.virtual_stages > 1 ? fmt::format(" x {} virtual stages", p.virtual_stages) : "", p.zero ? ", ZeRO-1" : "", stages_string(cuts), p.inner.schedule,
      p.micro_batches > 0 ? p.inner.chunks / p.micro_batches : 0, tps, p.bubble * 100, xfer * 1e3,
      p.exchange_s > 0 ? fmt::format(", tied-table exchange {:.3f} ms a step", p.exchange_s * 1e3) : "");
}

Plan plan_of_pipeline(const ModelAnalysis& stage_a, const PipelinePlan& p) {
  // the first stage's inner plan on its mesh; with stages of their own tp, each stage every part
  // in the layout it was priced in (its tp, and sequence parallelism where the inner plan has it)
  auto mesh_of = [&](const Layout* every) {
    PlanChoice c = p.inner;
    if (every) c.layouts.assign(c.layouts.size(), *every);
    Plan one = plan_of_choice(stage_a, c, p.stage_ranks);
    one.mesh().chunks = p.micro_batches > 0 ? p.inner.chunks / p.micro_batches : 1;
    return one;
  };
  Plan plan = mesh_of(p.per_stage ? &p.stage.front().layout : nullptr);
  plan.micro_batches = p.micro_batches;
  plan.pipeline = pipeline_name(p.schedule);
  plan.virtual_stages = p.virtual_stages;
  plan.zero = p.zero ? 1 : 0;
  const MeshPlan m0 = plan.mesh();
  plan.stages.clear();
  for (const auto& st : p.stage) {
    MeshPlan m = p.per_stage && !(st.layout == p.stage.front().layout) ? mesh_of(&st.layout).mesh() : m0;
    m.blocks = stages_string(st.ranges);
    plan.stages.push_back(std::move(m));
  }
  return plan;
}

}  // namespace oases
