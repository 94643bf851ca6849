#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace oases {

std::string describe_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

CostModel::CostModel(const ModelAnalysis& a, const ClusterSpec& cluster, const OpTimeModel& ops) : a_(a), cluster_(cluster), ops_(ops) {}

const PartRecords* CostModel::records(int i, bool sp) const {
  if (sp) return a_.seqpar.empty() ? nullptr : &a_.seqpar[static_cast<size_t>(i)];
  return &a_.plain[static_cast<size_t>(i)];
}

std::vector<Layout> candidate_layouts(const ModelAnalysis& a, int64_t ranks, int part, int64_t chunks) {
  std::vector<Layout> out;
  for (int64_t t : a.tp_candidates) {
    int64_t d = ranks / t;
    if (a.batch % (d * chunks) != 0) continue;
    out.push_back(Layout{t, false});
    if (t > 1 && !a.seqpar.empty() && a.seq % t == 0) {
      out.push_back(Layout{t, true});
      // the embedding's collectives sit beside a gather, not a product: nothing to decompose
      if (a.parts[static_cast<size_t>(part)] != "embedding") out.push_back(Layout{t, true, true});
    }
  }
  return out;
}

std::vector<Layout> CostModel::layouts(int part, int64_t chunks) const {
  return candidate_layouts(a_, ranks(), part, chunks);
}

Expected<std::vector<PricedOp>> priced_part_ops(const PartRecords& recs, int64_t t, int64_t dpk) {
  auto divides = [&](const TensorRecord& r, int64_t b) {
    for (size_t k = 0; k < r.shape.size(); ++k) {
      if (r.mark[k] == 'b' && r.shape[k] % b != 0) return false;
      if (r.mark[k] == 't' && r.shape[k] % t != 0) return false;
    }
    return true;
  };
  std::vector<PricedOp> out;
  out.reserve(recs.nodes.size());
  for (const NodeRecord& r : recs.nodes) {
    int64_t b = r.batch ? dpk : 1;
    PricedOp p;
    bool ok = true;
    for (const TensorRecord& x : r.inputs) {
      ok &= divides(x, b);
      p.inputs.push_back({x.dtype, x.local_shape(t, b)});
    }
    for (const TensorRecord& x : r.outputs) {
      ok &= divides(x, b);
      p.outputs.push_back({x.dtype, x.local_shape(t, b)});
    }
    if (!ok) return error("{} does not divide into tp {} x {} batch ways (dp x chunks)", r.op.substr(0, r.op.find('|')), t, dpk);
    size_t bar = r.op.find('|');
    p.op = r.op.substr(0, bar);
    p.key = op_key(p.op, p.inputs, p.outputs);
    if (bar != std::string::npos) p.key.append(" ").append(r.op, bar + 1);
    double f = static_cast<double>(b) * (r.uses_tp ? static_cast<double>(t) : 1.0);
    p.flops = r.flops / f;
    p.bytes = r.bytes / f;
    p.node = r.node;
    p.batch = r.batch;
    p.forward = r.phase == NodeRecord::Phase::kForward;
    p.weight_grad = r.weight_grad;
    out.push_back(std::move(p));
  }
  return out;
}

double CostModel::collective(CollectiveKind k, double bytes, int64_t n, int64_t stride) const {
  if (n <= 1) return 0;
  std::vector<int64_t> members;
  for (int64_t i = 0; i < n; ++i) members.push_back(i * stride);
  // plus what the profile measured a collective to take beyond the link (planner/profile.h)
  return cluster_.collective_seconds(k, bytes, members) + ops_.comm_sync_seconds();
}

const PartCost& CostModel::part(int i, const Layout& l, int64_t chunks) {
  const PartRecords* recs = records(i, l.sequence_parallel);
  auto key = std::make_tuple(recs ? recs->signature : "none:" + std::to_string(i), l.tp, l.sequence_parallel, l.collective_matmul, chunks);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  PartCost pc;
  const std::string& name = a_.parts[static_cast<size_t>(i)];
  pc.block = name.rfind("layer.", 0) == 0;
  pc.block_start = pc.block && name.size() > 5 && name.compare(name.size() - 5, 5, ".attn") == 0;
  if (!recs) {
    pc.feasible = false;
    pc.why = "sequence parallelism is not possible for this model";
    return cache_.emplace(key, pc).first->second;
  }
  int64_t t = l.tp, d = ranks() / l.tp, dpk = d * chunks;
  auto priced = priced_part_ops(*recs, t, dpk);
  if (!priced) {
    pc.feasible = false;
    pc.why = priced.status().message();
    return cache_.emplace(key, pc).first->second;
  }
  double prod_fwd = 0, prod_bwd = 0;  // per chunk: the matrix products (what ring steps run beside)
  for (const PricedOp& p : *priced) {
    double s = ops_.seconds(p.op, p.key, p.flops, p.bytes);
    if (p.weight_grad) (p.batch ? pc.wgt_chunk : pc.wgt_once) += s;
    if (p.batch) {
      (p.forward ? pc.fwd_chunk : pc.bwd_chunk) += s;
      if (p.op.find("MatMul") != std::string::npos || p.op.find("Gemm") != std::string::npos) (p.forward ? prod_fwd : prod_bwd) += s;
    } else {
      (p.forward ? pc.fwd_once : pc.bwd_once) += s;
    }
  }
  double dec_fwd = 0, dec_bwd = 0;  // per chunk: the collectives collective matmuls decompose
  for (const CommRecord& c : recs->comms) {
    int64_t n = c.over_dp ? d : t, stride = c.over_dp ? t : 1;
    if (n <= 1) continue;
    double bytes = c.tensor.local_elements(t, c.batch ? dpk : 1) * static_cast<double>(dtype_size(c.tensor.dtype));
    double s = collective(c.kind, bytes, n, stride);
    bool ring =
        l.collective_matmul && !c.over_dp && c.batch && (c.kind == CollectiveKind::kAllGather || c.kind == CollectiveKind::kReduceScatter);
    if (ring) {
      // decomposed: the same bytes in n - 1 shifts; the parts are copied into place (gather: the
      // gathered value and the products' outputs; scatter: the rows each step reads)
      bool f = c.phase == NodeRecord::Phase::kForward;
      (f ? dec_fwd : dec_bwd) += s;
      double whole = c.tensor.local_elements(t, dpk) * static_cast<double>(dtype_size(c.tensor.dtype));
      if (c.kind == CollectiveKind::kAllGather) whole *= static_cast<double>(t);
      (f ? pc.cm_copy_fwd_chunk : pc.cm_copy_bwd_chunk) += ops_.seconds("RingAssemble", "", 0, 4.0 * whole);
      // n - 1 collectives where there was one: each more costs the executor's hand-over (compute
      // thread) and sync (communication thread), and the n - 1 products and copies their dispatch
      double more = static_cast<double>(n - 2);
      s += more * ops_.comm_sync_seconds();
      (f ? pc.cm_copy_fwd_chunk : pc.cm_copy_bwd_chunk) +=
          more * ops_.comm_start_seconds() + static_cast<double>(3 * n) * ops_.instr_seconds();
    }
    if (c.batch) {
      if (c.phase == NodeRecord::Phase::kForward) {
        pc.comm_fwd_chunk += s;
        ++pc.collectives_fwd;
      } else {
        pc.comm_bwd_chunk += s;
        ++pc.collectives_bwd;
      }
    } else {
      pc.comm_dp += s;
    }
  }
  if (l.collective_matmul && t > 1) {
    double frac = static_cast<double>(t - 1) / static_cast<double>(t);
    pc.cm_hide_fwd_chunk = std::min(dec_fwd, frac * prod_fwd);
    // backward: the input-gradient products (about half of the products) sit beside the ring steps
    pc.cm_hide_bwd_chunk = std::min(dec_bwd, frac * prod_bwd / 2);
  }
  pc.dp = std::max<int64_t>(1, ranks() / std::max<int64_t>(1, t));
  pc.param_bytes = 4.0 * (recs->split_param_elements / static_cast<double>(t) + (recs->param_elements - recs->split_param_elements));
  auto bytes_of = [&](const TensorRecord& r) { return r.local_elements(t, dpk) * static_cast<double>(dtype_size(r.dtype)); };
  for (const TensorRecord& r : recs->saved) pc.saved_plain_chunk += bytes_of(r);
  if (!recs->entry.shape.empty()) pc.saved_entry_chunk = bytes_of(recs->entry);
  for (const TensorRecord& r : recs->kept_comm_opt) pc.saved_commopt_chunk += bytes_of(r);
  if (pc.block_start) pc.saved_commopt_chunk = std::max(pc.saved_commopt_chunk, pc.saved_entry_chunk);
  for (const TensorRecord& r : recs->peak_saved) pc.peak_saved_chunk += bytes_of(r);
  for (const TensorRecord& r : recs->peak_grads) pc.peak_grads_chunk += bytes_of(r);
  for (const TensorRecord& r : recs->block_saved_before) pc.before_saved_chunk += bytes_of(r);
  pc.backward_first = recs->backward_first;
  for (const TensorRecord& r : recs->weight_grad_inputs) pc.weight_grads_chunk += bytes_of(r);
  for (const TensorRecord& r : recs->weight_act_inputs) pc.weight_acts_chunk += bytes_of(r);
  if (!pc.block) {
    for (const NodeRecord& n : recs->nodes) {
      if (!n.batch) continue;
      for (const TensorRecord& r : n.outputs) pc.work_chunk = std::max(pc.work_chunk, bytes_of(r));
    }
    // over several chunks a weight's gradient is one chunk's product added to the sum so far: a
    // weight-sized temporary (the vocabulary's table, for the embedding and the head)
    if (chunks > 1) pc.work_chunk = std::max(pc.work_chunk, pc.param_bytes);
  }
  return cache_.emplace(key, pc).first->second;
}

double CostModel::reshard_seconds(int i, const Layout& from, const Layout& to, int64_t chunks) {
  if (from.same_split(to)) return 0;
  const TensorRecord& e = a_.plain[static_cast<size_t>(i)].entry;
  if (e.shape.empty()) return 0;
  int64_t n = ranks();
  int64_t da = n / from.tp, db = n / to.tp;
  double es = static_cast<double>(dtype_size(e.dtype));
  double whole_row = 1;  // elements of one batch row
  for (size_t k = 0; k < e.shape.size(); ++k) {
    if (e.mark[k] != 'b') whole_row *= static_cast<double>(e.shape[k]);
  }
  double rows = static_cast<double>(e.shape.empty() ? 1 : e.shape[0]) / static_cast<double>(chunks);
  double s = 0;
  // the sequence gathered out of a sequence-parallel layout (forward), or into one (backward)
  if (from.sequence_parallel) s += collective(CollectiveKind::kAllGather, rows / static_cast<double>(da) * whole_row * es, from.tp, 1);
  if (to.sequence_parallel) s += collective(CollectiveKind::kAllGather, rows / static_cast<double>(db) * whole_row * es, to.tp, 1);
  // the batch: gathered over the minor dp axes where the next part has fewer dp ranks (forward), or
  // where the previous one has (backward); a slice costs nothing
  if (da > db) s += collective(CollectiveKind::kAllGather, rows / static_cast<double>(db) * whole_row * es, da / db, from.tp);
  if (db > da) s += collective(CollectiveKind::kAllGather, rows / static_cast<double>(da) * whole_row * es, db / da, to.tp);
  return s;
}

PartTime CostModel::part_time(int i, const Layout& prev, const Layout& cur, const ScheduleOptions& s, int64_t chunks) {
  const PartCost& pc = part(i, cur, chunks);
  if (!pc.feasible) return part_time(pc, 0, s, chunks);
  return part_time(pc, i > 0 ? reshard_seconds(i, prev, cur, chunks) : 0, s, chunks);
}

PartTime CostModel::part_time(const PartCost& pc, double r, const ScheduleOptions& s, int64_t chunks) const {
  PartTime pt;
  if (!pc.feasible) {
    pt.compute = 1e30;
    return pt;
  }
  double K = static_cast<double>(chunks);
  double rf = r / 2, rb = r / 2;
  bool recompute = s.checkpoint != CheckpointMode::kNone && pc.block;
  double rc = recompute ? pc.fwd_chunk : 0;
  double rcomm = recompute && s.checkpoint == CheckpointMode::kBlock ? pc.comm_fwd_chunk : 0;
  double rcopy = recompute ? pc.cm_copy_fwd_chunk : 0;
  pt.compute = K * (pc.fwd_chunk + rc + pc.bwd_chunk + pc.cm_copy_fwd_chunk + pc.cm_copy_bwd_chunk + rcopy) + pc.fwd_once + pc.bwd_once;
  double cf = K * (pc.comm_fwd_chunk + rf), cb = K * (pc.comm_bwd_chunk + rcomm + rb);
  pt.comm = cf + cb + pc.comm_dp;
  // collective matmuls: what the ring steps hide beside their own products (a recomputed forward
  // repeats its decomposed collectives under default/overlap_checkpoint, and their overlap)
  double in_f = K * pc.cm_hide_fwd_chunk, in_b = K * (pc.cm_hide_bwd_chunk + (rcomm > 0 ? pc.cm_hide_fwd_chunk : 0));
  // the gradients' reduction: an all-reduce (a ring's reduce-scatter and all-gather), or under the
  // distributed optimizer the reduce-scatter alone, and the weights' all-gather after the update
  const double gather = zero_ && pc.dp > 1 ? pc.comm_dp / 2 : 0, reduce = pc.comm_dp - gather;
  if (s.interleave && chunks > 1) {
    // one chunk's collective under the next chunk's compute, across parts without draining;
    // beside computation a collective takes longer (the profile's comm_beside_compute), for the
    // share of it that computation covers
    double beside = ops_.comm_beside_compute_seconds();
    if (beside > 0) {
      double nf = K * pc.collectives_fwd, nb = K * (pc.collectives_bwd + (rcomm > 0 ? pc.collectives_fwd : 0));
      if (cf > 0) cf += nf * beside * std::min(1.0, K * pc.fwd_chunk / cf);
      if (cb > 0) cb += nb * beside * std::min(1.0, K * (pc.bwd_chunk + rc) / cb);
      pt.comm = cf + cb + pc.comm_dp;
    }
    // (the other chunks' compute and the ring steps' own products hide the same communication:
    // together no more than the compute there is)
    pt.exposed = std::max(0.0, cf - K * pc.fwd_chunk) + std::max(0.0, cb + reduce - K * (pc.bwd_chunk + rc));
  } else {
    // the result is read right away (but for the ring steps beside their products); the gradient
    // reduction hides behind the next part's backward
    pt.exposed = (cf - in_f) + (cb - in_b) + std::max(0.0, reduce - K * pc.bwd_chunk);
  }
  // The weights' all-gather flies beside the next step's first instructions at run time
  // (Executor::defer_constant_writes) and the simulator prices it so; here, part by part, it stays
  // exposed: hiding it behind a part's own forward made the one-mesh search's choice, which the
  // pipeline search builds its stages on, a worse base for them (test_zero.sh's 40 MiB case:
  // 19.4 ms instead of 18.8), so the search stays conservative and --simulate re-ranks.
  pt.exposed += gather;
  return pt;
}

double CostModel::part_saved(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks) {
  const PartCost& pc = part(i, l, chunks);
  double K = static_cast<double>(chunks);
  if (pc.block && s.checkpoint == CheckpointMode::kBlock) return pc.block_start ? K * pc.saved_entry_chunk : 0;
  if (pc.block && s.checkpoint == CheckpointMode::kCommOptimized) return K * pc.saved_commopt_chunk;
  return K * pc.saved_plain_chunk;
}

double CostModel::part_memory(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks) {
  const PartCost& pc = part(i, l, chunks);
  return state_bytes(pc) - pc.param_bytes + std::max(pc.param_bytes, pc.backward_first ? 0.0 : part_saved(i, l, s, chunks));
}

double CostModel::state_bytes(const PartCost& pc) const {
  // weights, gradients and AdamW's two moments (the moments shared over dp by the distributed optimizer)
  return zero_ ? (2.0 + 2.0 / static_cast<double>(pc.dp)) * pc.param_bytes : 4.0 * pc.param_bytes;
}

double CostModel::updated_bytes(const PartCost& pc) const {
  return zero_ ? pc.param_bytes / static_cast<double>(pc.dp) : pc.param_bytes;
}

double CostModel::part_transient(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks) {
  const PartCost& pc = part(i, l, chunks);
  return part_working(i, l, s, chunks) + (pc.backward_first ? part_saved(i, l, s, chunks) : 0.0);
}

double CostModel::part_working(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks, int64_t together) {
  const PartCost& pc = part(i, l, chunks);
  if (!pc.block) return pc.work_chunk;
  // The block's backward working set at its busiest node: its saved activations still to be read
  // and the gradients alive (PartRecords::peak_saved, peak_grads). Kept whole (no recomputation):
  // what the gradients add beyond the saved activations the backward has already freed.
  if (s.checkpoint == CheckpointMode::kNone) return std::max(0.0, pc.peak_grads_chunk - (pc.saved_plain_chunk - pc.peak_saved_chunk));
  // Recomputed: the recomputed activations, and recomputing whole blocks the attention part's too
  // while the MLP part's backward runs (the MLP's recomputation reads them). An interleaved
  // schedule runs each step for every chunk in turn: a part's recomputation for all K chunks comes
  // before its backward for any (recomputing whole blocks, overlap_checkpoint, always; restarting
  // from the kept collectives' results, oases, where no collective divides the part's steps, and
  // for the last block, whose recomputation is moved ahead to hide the head's all-reduce), so every
  // chunk's recomputed activations are alive at once; in line, one chunk's. The gradients at the
  // busiest node: the first chunk's, beside every other chunk's gradient from the next part, which
  // waits for its turn (the entry's shape: the residual stream's). Until 2026-11-27 two chunks'
  // gradients were counted: interleaved K = 2 rows 1.09-1.15x over, K = 8 with sp 0.87x under.
  // (What the built programs' arenas show: bench/plan/memory_table.py.)
  const double K = static_cast<double>(together > 0 ? std::min(together, chunks) : chunks);
  const double active = s.interleave ? K : 1.0;
  const double before = s.checkpoint == CheckpointMode::kBlock ? pc.before_saved_chunk : 0.0;
  return active * (pc.peak_saved_chunk + before) + pc.peak_grads_chunk + (active - 1.0) * pc.saved_entry_chunk;
}

double CostModel::part_objective(int i, const Layout& prev, const Layout& cur, const ScheduleOptions& s, int64_t chunks) {
  PartTime pt = part_time(i, prev, cur, s, chunks);
  return pt.total() + ops_.optimizer_seconds(updated_bytes(part(i, cur, chunks)));
}

double CostModel::part_objective(const PartCost& pc, double reshard_s, const ScheduleOptions& s, int64_t chunks) const {
  return part_time(pc, reshard_s, s, chunks).total() + ops_.optimizer_seconds(updated_bytes(pc));
}

double CostModel::optimizer_seconds(const PlanChoice& p) {
  double bytes = 0;
  for (int i = 0; i < num_parts(); ++i) bytes += updated_bytes(part(i, p.layouts[static_cast<size_t>(i)], p.chunks));
  return ops_.optimizer_seconds(bytes);
}

PlanEstimate CostModel::estimate(const PlanChoice& p) {
  PlanEstimate e;
  auto so = schedule_by_name(p.schedule);
  ScheduleOptions s = so ? *so : ScheduleOptions{};
  for (int i = 0; i < num_parts(); ++i) {
    const Layout& cur = p.layouts[static_cast<size_t>(i)];
    const Layout& prev = i > 0 ? p.layouts[static_cast<size_t>(i - 1)] : cur;
    PartTime pt = part_time(i, prev, cur, s, p.chunks);
    e.compute_s += pt.compute;
    e.comm_s += pt.comm;
    e.exposed_s += pt.exposed;
    const PartCost& pc = part(i, cur, p.chunks);
    const double saved = pc.backward_first ? 0.0 : part_saved(i, cur, s, p.chunks);  // (the loss part's: in its transient)
    e.static_bytes += state_bytes(pc);
    e.saved_bytes += saved;
    e.shared_bytes += std::min(saved, pc.param_bytes);
    e.transient_bytes = std::max(e.transient_bytes, part_transient(i, cur, s, p.chunks));
  }
  e.optimizer_s = optimizer_seconds(p);
  e.step_s = e.compute_s + e.exposed_s + e.optimizer_s;
  e.memory_bytes = e.static_bytes + e.saved_bytes - e.shared_bytes + e.transient_bytes;
  return e;
}

}  // namespace oases
