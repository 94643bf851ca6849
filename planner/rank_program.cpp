#include "planner/rank_program.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>

#include "graph/passes/mixed_precision.h"
#include "graph/op_registry.h"
#include "graph/tiles.h"
#include "planner/chunking.h"
#include "planner/hybrid.h"
#include "planner/pipeline_program.h"

namespace oases {

namespace {

// The executor fusion `fusion` names (not kNone) over `order`.
FusionStats fuse(Fusion fusion, Graph& g, std::vector<NodeId>& order, const std::set<ValueId>& keep, std::vector<size_t>* slots) {
  return fusion == Fusion::kDevice ? fuse_for_device(g, order, keep, slots) : fuse_for_cpu(g, order, keep, slots);
}

// Fusion under a scheduler's order: the compute nodes and collective starts go through the fuser
// as one order (a fused node takes the place of its chain's last node); each collective wait goes
// back before the first surviving step that followed it, or before a fused node standing in for
// steps that followed it, so no wait moves after a reader of its result.
Expected<std::vector<ScheduledOp>> fuse_scheduled(Graph& g, const std::vector<ScheduledOp>& schedule, const std::set<ValueId>& keep,
                                                  Fusion fusion, FusionStats* stats) {
  std::vector<NodeId> order;
  std::map<NodeId, size_t> index;                // node -> its position in `order` before fusion
  std::vector<std::pair<size_t, NodeId>> waits;  // (position of the step it preceded, node)
  std::map<NodeId, ScheduledOp::Kind> kind;
  for (const ScheduledOp& op : schedule) {
    if (op.kind == ScheduledOp::Kind::kCommWait) {
      waits.push_back({order.size(), op.node});
      continue;
    }
    index[op.node] = order.size();
    kind[op.node] = op.kind;
    order.push_back(op.node);
  }
  // the collectives waited for, described for the error below should fusion take one (a compute
  // step it removes leaves `order`, a wait would stay behind)
  std::map<NodeId, std::string> described;
  for (const auto& [at, node] : waits) described.emplace(node, g.node(node).describe());
  std::vector<size_t> slots;
  *stats = fuse(fusion, g, order, keep, &slots);
  // position of every step after fusion, in the old numbering (a fused node: its chain's last node's)
  std::vector<double> pos(order.size());
  for (size_t i = 0; i < order.size(); ++i) pos[i] = static_cast<double>(slots[i]);
  std::vector<ScheduledOp> out;
  size_t w = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    while (w < waits.size() && static_cast<double>(waits[w].first) <= pos[i] + 0.25)
      out.push_back({ScheduledOp::Kind::kCommWait, waits[w++].second});
    auto k = kind.find(order[i]);
    out.push_back({k == kind.end() ? ScheduledOp::Kind::kCompute : k->second, order[i]});
  }
  while (w < waits.size()) out.push_back({ScheduledOp::Kind::kCommWait, waits[w++].second});
  for (const ScheduledOp& op : out) {
    if (!g.alive(op.node)) {
      auto d = described.find(op.node);
      return error("fusion removed {}, which the schedule still waits for", d != described.end() ? d->second : fmt::format("node {}", op.node));
    }
  }
  return out;
}

}  // namespace

Fusion fusion_for(bool fuse, const std::string& device) {
  if (!fuse || std::getenv("OASES_NO_FUSION") != nullptr) return Fusion::kNone;
  return device == "cpu" ? Fusion::kCpu : Fusion::kDevice;
}

// Nodes none of whose outputs anything reads (not a graph output, input, constant or kept value),
// until none is left, and their steps: e.g. a chunk's forward all-gather whose reader recomputation
// replaced under a checkpointing schedule. Every rank of a group prunes the same collectives (their
// programs have one structure), so none waits for a peer that skipped it; and what no one reads
// needs no transfer.
Status prune_dead_nodes(Graph& g, std::vector<ScheduledOp>* schedule, const std::set<ValueId>& keep) {
  auto unread = [&](ValueId v) {
    if (v == kNoId) return true;
    const Value& val = g.value(v);
    return val.uses.empty() && !val.is_input && !val.is_constant() && !g.is_output(v) && !keep.count(v);
  };
  // readers before what they read (the run order backwards), so a dead chain goes in one pass
  std::vector<NodeId> order;
  if (schedule->empty()) {
    OASES_ASSIGN_OR_RETURN(order, g.topo_order());
  } else {
    for (const ScheduledOp& op : *schedule) {
      if (op.kind != ScheduledOp::Kind::kCommWait) order.push_back(op.node);
    }
  }
  std::set<NodeId> removed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& n = g.node(*it);
    if (n.outputs.empty() || !std::all_of(n.outputs.begin(), n.outputs.end(), unread)) continue;
    g.remove_node(*it);
    removed.insert(*it);
  }
  if (!removed.empty()) {
    schedule->erase(std::remove_if(schedule->begin(), schedule->end(), [&](const ScheduledOp& op) { return removed.count(op.node) > 0; }),
                    schedule->end());
  }
  return Status::ok();
}

Expected<ProgramLayout> lay_out_program(Graph g, std::vector<ScheduledOp> schedule, const std::set<ValueId>& keep, Fusion fusion) {
  ProgramLayout p;
  OASES_RETURN_IF_ERROR(prune_dead_nodes(g, &schedule, keep));
  if (fusion != Fusion::kNone) {
    if (schedule.empty()) {
      OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
      p.fusion = fuse(fusion, g, order, keep, nullptr);
      for (NodeId id : order) schedule.push_back(ScheduledOp{ScheduledOp::Kind::kCompute, id});
    } else {
      OASES_ASSIGN_OR_RETURN(schedule, fuse_scheduled(g, schedule, keep, fusion, &p.fusion));
    }
  }
  std::vector<PlanStep> steps;
  auto add = [&](ScheduledOp::Kind kind, NodeId id) -> Status {
    const Node& n = g.node(id);
    for (ValueId o : n.outputs) {
      if (o != kNoId && !g.value(o).has_shape) return error("{}: output '{}' has no shape", n.describe(), g.value(o).name);
    }
    p.order.push_back(ScheduledOp{kind, id});
    steps.push_back(PlanStep{id, kind != ScheduledOp::Kind::kCommWait, kind != ScheduledOp::Kind::kCommStart});
    return Status::ok();
  };
  if (schedule.empty()) {
    OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
    for (NodeId id : order) OASES_RETURN_IF_ERROR(add(ScheduledOp::Kind::kCompute, id));
  } else {
    // the scheduler's order: every live node once (collectives as a start and a wait)
    std::vector<int> seen(static_cast<size_t>(g.max_node_id()), 0);
    for (const ScheduledOp& op : schedule) {
      if (!g.alive(op.node)) return error("the schedule names node {}, which the graph does not have", op.node);
      OASES_RETURN_IF_ERROR(add(op.kind, op.node));
      if (op.kind != ScheduledOp::Kind::kCommWait) seen[static_cast<size_t>(op.node)]++;
    }
    for (NodeId id : g.nodes()) {
      if (seen[static_cast<size_t>(id)] != 1)
        return error("the schedule runs {} {} times", g.node(id).describe(), seen[static_cast<size_t>(id)]);
    }
  }
  // in-place outputs are the CPU kernels' contract only
  p.memory = MemoryPlan::build(g, steps, keep, fusion == Fusion::kCpu ? MemoryPlan::InplaceFn(inplace_outputs) : MemoryPlan::InplaceFn());
  p.graph = std::move(g);
  return p;
}

Expected<GlobalProgram> build_global_program(Graph forward, const TrainingSpec& spec_in, const Plan& plan, int64_t world,
                                             const GlobalProgramOptions& opts) {
  GlobalProgram gp;
  gp.plan = plan;
  gp.world = world;
  const MeshPlan& m = plan.mesh();
  const std::string& where = opts.model_path;
  // the layouts are found on the forward graph
  StrategyOptions so;
  so.tp = m.tp;
  so.dp = m.dp;
  so.vocab_parallel = plan.vocab_parallel;
  so.sequence_parallel = plan.sequence_parallel;
  so.collective_matmul = plan.collective_matmul;
  so.dp_bucket_bytes = plan.dp_bucket_bytes;
  if (!opts.plan_path.empty()) {
    OASES_ASSIGN_OR_RETURN(gp.strategy, strategy_for_plan(plan, opts.plan_path, forward, so));
  } else if (!m.parts.empty()) {
    std::vector<PartLayout> parts = m.parts;
    for (PartLayout& l : parts) l.collective_matmul = l.collective_matmul || plan.collective_matmul;
    auto st = apply_part_layouts(forward, parts, m.ranks > 0 ? m.ranks : world, so);
    if (!st) return st.status().with_context(where);
    gp.strategy = std::move(*st);
  } else {
    auto st = megatron_strategy(forward, so);
    if (!st) return st.status().with_context(where);
    gp.strategy = std::move(*st);
  }
  // mixed precision first (the chunked copies inherit its casts), then the micro-batch chunks,
  // then (fp16) the loss-scale input the backward pass starts from
  TrainingSpec spec = spec_in;
  // (a count past int would wrap to one that skips the chunking; --chunks has no bound of its own)
  if (m.chunk_count() > kMaxPlanChunks) return error("{}: {} micro-batch chunks, more than {}", where, m.chunk_count(), kMaxPlanChunks);
  int k = static_cast<int>(m.chunk_count());
  OASES_ASSIGN_OR_RETURN(DType compute, compute_dtype_from_name(plan.dtype));
  // each chunk's copy of a value the strategy pins (sequence parallelism) gets the same pin
  auto versions = std::make_shared<std::map<ValueId, std::vector<ValueId>>>();
  if (k > 1 || compute != DType::kF32) {
    auto before = spec.before_autodiff;
    spec.before_autodiff = [k, compute, before, versions](Graph g) -> Expected<Graph> {
      if (before) {
        OASES_ASSIGN_OR_RETURN(g, before(std::move(g)));
      }
      if (compute != DType::kF32) OASES_RETURN_IF_ERROR(apply_mixed_precision(g, compute).status());
      if (k > 1) {
        OASES_ASSIGN_OR_RETURN(g, chunk_batch(std::move(g), k, versions.get()));
      }
      if (compute == DType::kF16) OASES_RETURN_IF_ERROR(insert_loss_scale_input(g));
      return g;
    };
  }
  auto tg = build_training_graph(std::move(forward), spec);
  if (!tg) return tg.status().with_context(where);
  gp.train = std::move(*tg);
  std::map<ValueId, ShardingSpec> chunk_pins;
  for (const auto& [v, sp] : gp.strategy.pins) {
    auto it = versions->find(v);
    if (it == versions->end()) continue;
    for (ValueId c : it->second) chunk_pins[c] = sp;
  }
  gp.strategy.pins.insert(chunk_pins.begin(), chunk_pins.end());
  if (opts.pipeline && !opts.stage_cuts.empty()) {
    OASES_RETURN_IF_ERROR(mark_stage_crossings(gp.train.graph, gp.train.params, opts.stage_cuts).status().with_context(where));
  }
  // the partition
  OASES_RETURN_IF_ERROR(split_batch_inputs(gp.train.graph, &gp.strategy, *versions).with_context(where));
  for (ValueId p : gp.train.params) {
    auto it = gp.strategy.specs.find(p);
    gp.param_specs.push_back(it != gp.strategy.specs.end() ? it->second : ShardingSpec::replicated(gp.train.graph.value(p).shape.size()));
    gp.param_shapes.push_back(gp.train.graph.value(p).shape);
  }
  // pipeline stages: buckets per stage where the cuts are known, else none
  gp.strategy.bucket_gradients = !opts.pipeline || !opts.stage_cuts.empty();
  gp.strategy.stage_cuts = opts.pipeline ? opts.stage_cuts : std::vector<StageCut>{};
  gp.strategy.zero = plan.zero > 0;
  if (world > 1 || opts.partition) {
    auto pg = partition_training(gp.train.graph, gp.train.params, gp.strategy, &gp.sharding);
    if (!pg) return pg.status().with_context(where);
    gp.partitioned = std::move(*pg);
  } else {
    dissolve_whole_markers(gp.train.graph);  // one rank: nothing is partial
  }
  return gp;
}

double updated_bytes_of(const Graph& g, ValueId param, ValueId grad, const ShardingSpec& spec, const Mesh& mesh, bool zero) {
  const int64_t numel = shape_numel(g.value(param).shape);
  const double es = static_cast<double>(dtype_size(g.value(param).dtype));
  NodeId p = grad == kNoId ? kNoId : g.producer(grad);
  if (p != kNoId && g.node(p).domain == kOasesDomain && g.node(p).op_type == "FlatReduceScatter") {
    return es * static_cast<double>(flat_piece(numel, std::max<int64_t>(1, g.node(p).attrs.get_int("group_size", 1))));
  }
  const int dp = zero ? zero_whole_axis(spec, mesh) : -1;
  if (dp >= 0) return es * static_cast<double>(flat_piece(numel, mesh.axis_size(dp)));
  return es * static_cast<double>(numel);
}

Expected<RankProgram> build_rank_program(const GlobalProgram& global, int64_t rank, const RankProgramOptions& opts) {
  RankProgram rp;
  rp.rank = rank;
  rp.mesh = global.mesh();
  TrainingGraph& tg = rp.train;
  if (global.world > 1) {
    const PartitionedGraph& pg = *global.partitioned;
    tg.graph = opts.slice_constants ? local_graph_for_rank(pg, rank) : pg.local;
    tg.loss = tg.graph.outputs()[0];
    tg.params = global.train.params;
    for (size_t i = 1; i < tg.graph.outputs().size(); ++i) tg.grads.push_back(tg.graph.outputs()[i]);
    tg.targets = global.train.targets;
    tg.appended_loss = global.train.appended_loss;
    tg.vocab = global.train.vocab;
    tg.frozen = global.train.frozen;
    rp.collectives = pg.collectives;
  } else {
    tg = global.train;
  }
  for (size_t i = 0; i < tg.params.size(); ++i) {
    rp.param_bytes += static_cast<double>(tg.graph.value(tg.params[i]).nbytes());
    rp.updated_bytes += i < tg.grads.size() ? updated_bytes_of(tg.graph, tg.params[i], tg.grads[i], global.param_specs.at(i), rp.mesh,
                                                               global.plan.zero > 0)
                                            : static_cast<double>(tg.graph.value(tg.params[i]).nbytes());
  }
  // the schedule: recomputation, then the instruction order (the same on every rank)
  const MeshPlan& m = global.plan.mesh();
  if (!m.schedule.empty()) {
    OASES_ASSIGN_OR_RETURN(rp.schedule, schedule_by_name(m.schedule));
    rp.schedule->checkpoint = m.recompute_mode();
    OASES_ASSIGN_OR_RETURN(rp.recompute, apply_recompute(tg.graph, rp.schedule->checkpoint));
    OASES_ASSIGN_OR_RETURN(rp.order, schedule_program(tg.graph, *rp.schedule));
    rp.saved_bytes = saved_activation_bytes(tg.graph, rp.order);
    rp.saved_count = saved_activation_count(tg.graph, rp.order);
  }
  OASES_ASSIGN_OR_RETURN(rp.program, lay_out_program(tg.graph, rp.order, opts.keep, fusion_for(opts.fuse, opts.device)));
  return rp;
}

Expected<RankProgram> build_rank_program(const Graph& forward, const Plan& plan, int64_t rank, const TrainingSpec& spec,
                                         const RankProgramOptions& opts) {
  int64_t world = plan.mesh().ranks > 0 ? plan.mesh().ranks : std::max<int64_t>(1, plan.mesh().tp) * std::max<int64_t>(1, plan.mesh().dp);
  OASES_ASSIGN_OR_RETURN(GlobalProgram gp, build_global_program(forward, spec, plan, world, GlobalProgramOptions{}));
  return build_rank_program(gp, rank, opts);
}

}  // namespace oases
