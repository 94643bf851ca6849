// The planner's cost model: per part of the chain (embedding, each attention, each MLP, head) and
// per layout (tp degree t, the other N/t ranks data-parallel, sequence parallelism on or off), with
// K micro-batch chunks, the time and memory one rank spends, under each of the five schedules.
//
// Compute: every node of the part at its local shapes, timed by the op-time model (profile or
// roofline). Communication: ring collectives by group size and link class (cluster file): the
// tp collectives per chunk, the data-parallel gradient reduction once per step, and the batch
// moving between parts of different layouts (an all-gather over the minor dp axes forward, its
// reverse backward). Overlap, per part:
//   plain, default_checkpoint, optim_comm_checkpoint (chunks one after another): a collective's
//     result is read at once, so tp communication adds to compute;
//   overlap_checkpoint, oases (chunks interleaved, across layers without draining): one chunk's
//     collective flies while the next computes, so a part costs max(compute, communication) per
//     pass;
// recomputation: the checkpointed schedules redo each block's forward in backward, and
// default/overlap_checkpoint also its forward collectives; a part's gradient all-reduce hides
// behind the next part's backward, what it does not hide is exposed.
// Memory per rank: weights, gradients and AdamW's two moments (16 bytes per local parameter; under
// the distributed optimizer, set_zero, the moments are 1/dp of that: 8 + 8/dp bytes),
// the activations each schedule keeps for backward (plain: everything backward reads; default:
// the block input; comm-optimised: block input, collective outputs and norm inputs), and the
// largest working set of one part's recomputed backward.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "planner/analysis.h"
#include "planner/cluster_spec.h"
#include "planner/profile.h"
#include "planner/schedule.h"

namespace oases {

// One part under one layout with K chunks, on one rank (seconds, bytes).
struct PartCost {
  bool feasible = true;
  std::string why;
  double fwd_chunk = 0, bwd_chunk = 0;                                           // compute per chunk
  double fwd_once = 0, bwd_once = 0;                                             // compute done once per step (weights)
  double wgt_chunk = 0, wgt_once = 0;  // of bwd_chunk and bwd_once: the weight-gradient nodes' (PricedOp::weight_grad)
  double comm_fwd_chunk = 0, comm_bwd_chunk = 0;                                 // tp collectives per chunk
  double comm_dp = 0;                                                            // data-parallel gradient reduction per step
  int collectives_fwd = 0, collectives_bwd = 0;                                  // per chunk
  double param_bytes = 0;                                                        // local
  int64_t dp = 1;                                                                // the part's data-parallel ranks
  double saved_plain_chunk = 0, saved_entry_chunk = 0, saved_commopt_chunk = 0;  // bytes per chunk
  // outside the blocks (embedding, head and loss): the largest tensor one chunk's nodes make, alive
  // beside what is saved while it is made (the loss's shifted logits beside the logits)
  double work_chunk = 0;
  // a part's backward at its busiest (PartRecords::peak_saved, peak_grads), per chunk: its saved
  // activations still to be read, the gradients alive; a block's MLP part: the attention part's
  // saved activations (PartRecords::block_saved_before)
  double peak_saved_chunk = 0, peak_grads_chunk = 0, before_saved_chunk = 0;
  bool backward_first = false;  // the loss's part (PartRecords::backward_first)
  // per chunk, what its weight-gradient nodes read (PartRecords::weight_grad_inputs, weight_act_inputs)
  double weight_grads_chunk = 0, weight_acts_chunk = 0;
  bool block = false;        // a block part (attention or MLP), checkpointed by the schedules
  bool block_start = false;  // the attention part: owns the block input
  // collective matmuls (Layout::collective_matmul), per chunk: the ring steps' time that the products beside them
  // can hide (each of the n - 1 steps under the product of the part already here; backward, the
  // input-gradient products only), and the copies that place and pick the parts
  double cm_hide_fwd_chunk = 0, cm_hide_bwd_chunk = 0, cm_copy_fwd_chunk = 0, cm_copy_bwd_chunk = 0;
};

// One op execution the cost model prices: a node of the training graph the analysis read, at one
// layout's local shapes, keyed as a profile keys it (planner/profile.h op_key; a product's
// transposed operands follow as " t01"). The profile's sample at `key` times it.
struct PricedOp {
  std::string op;   // "MatMul", "oases.AttentionGrad"
  std::string key;  // "MatMul float32[4x32x64] float32[64x64] -> float32[4x32x64]"
  NodeId node = kNoId;
  std::vector<std::pair<DType, Shape>> inputs, outputs;  // local
  double flops = 0, bytes = 0;                           // one execution on one rank
  bool batch = false;                                    // once per chunk (else once per step)
  bool forward = true;
  bool weight_grad = false;  // NodeRecord::weight_grad
};

// The ops one part's records price under tp `t` with `dpk` = dp x K batch ways, in record order:
// what CostModel::part times and what oases-profile measures (planner/coverage.h). An error names
// the first op whose tensors do not divide into the layout.
Expected<std::vector<PricedOp>> priced_part_ops(const PartRecords& recs, int64_t t, int64_t dpk);

// Layouts part `part` may take with K chunks on `ranks` ranks: the degree divides the model and
// the ranks, the batch divides into dp x K, sequence parallelism where the sequence divides (and,
// but for the embedding, with collective matmuls).
std::vector<Layout> candidate_layouts(const ModelAnalysis& a, int64_t ranks, int part, int64_t chunks);

struct PartTime {
  double compute = 0, comm = 0, exposed = 0;  // exposed: communication the compute did not hide
  double total() const { return compute + exposed; }
};

struct PlanChoice {
  std::vector<Layout> layouts;  // per part, chain order
  std::string schedule = "plain";
  int64_t chunks = 1;
  bool zero = false;  // priced with the distributed optimizer (CostModel::set_zero; Plan::zero)
  bool operator==(const PlanChoice&) const = default;
};

struct PlanEstimate {
  double step_s = 0, compute_s = 0, comm_s = 0, exposed_s = 0, optimizer_s = 0;
  double memory_bytes = 0;  // peak per rank: static + saved - shared + transient
  double static_bytes = 0, saved_bytes = 0, transient_bytes = 0;
  // per part the smaller of its saved activations and its weight gradients: the backward frees the
  // one as it makes the other, so the peak holds the larger (CostModel::part_memory)
  double shared_bytes = 0;
  double hidden_s() const { return comm_s - exposed_s; }
};

class CostModel {
 public:
  CostModel(const ModelAnalysis& a, const ClusterSpec& cluster, const OpTimeModel& ops);

  const ModelAnalysis& analysis() const { return a_; }
  const ClusterSpec& cluster() const { return cluster_; }
  int64_t ranks() const { return cluster_.ranks(); }
  int num_parts() const { return static_cast<int>(a_.parts.size()); }
  // Layouts a part may take with K chunks (candidate_layouts on the cluster's ranks).
  std::vector<Layout> layouts(int part, int64_t chunks) const;
  const PartCost& part(int i, const Layout& l, int64_t chunks);
  // Moving the batch from one part's layout to the next: forward and backward, per chunk.
  double reshard_seconds(int i, const Layout& from, const Layout& to, int64_t chunks);
  // The chain cost of part i after a part laid out `prev` (the search minimises their sum).
  PartTime part_time(int i, const Layout& prev, const Layout& cur, const ScheduleOptions& s, int64_t chunks);
  // What the search adds up: the part's time and its share of the optimizer step.
  double part_objective(int i, const Layout& prev, const Layout& cur, const ScheduleOptions& s, int64_t chunks);
  // The same from the part's cost under its layout and the seconds reshard_seconds gives for the
  // move into it (0 for the first part): what the search tabulates, pricing each move once for
  // every schedule.
  PartTime part_time(const PartCost& pc, double reshard_s, const ScheduleOptions& s, int64_t chunks) const;
  double part_objective(const PartCost& pc, double reshard_s, const ScheduleOptions& s, int64_t chunks) const;
  // A part's share of a rank's peak: its weights and moments, and the larger of its saved
  // activations and its weight gradients (the backward frees the part's activations as it makes
  // its gradients; the activations of the parts before it are still kept, the gradients of those
  // after it already made: no step holds both of any part whole).
  // The loss's part (the head) keeps nothing here: its backward runs first, so its saved
  // activations are gone before any other part's backward (they are in its part_transient).
  double part_memory(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks);
  double part_saved(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks);  // activations kept for its backward
  // Bytes beyond what the part keeps while its backward runs: its working set (part_working) and,
  // for the loss's part, its saved activations. `together`: the chunks an interleaved schedule
  // runs each step for (0: all; a pipeline's stage, the chunks of one micro-batch).
  double part_working(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks, int64_t together = 0);
  double part_transient(int i, const Layout& l, const ScheduleOptions& s, int64_t chunks);
  double optimizer_seconds(const PlanChoice& p);
  PlanEstimate estimate(const PlanChoice& p);

  // The distributed optimizer (ZeRO stage 1, Plan::zero): each part's AdamW moments and its update
  // shared over its dp ranks; its gradient reduction a reduce-scatter (hidden as the all-reduce
  // was) and an all-gather of the updated weights after the step (exposed: the next step's
  // forward reads them).
  void set_zero(bool z) { zero_ = z; }
  bool zero() const { return zero_; }
  // Bytes a rank holds for a part's weights, gradients and moments; the weights an update touches.
  double state_bytes(const PartCost& pc) const;
  double updated_bytes(const PartCost& pc) const;

  // Seconds of a collective of `bytes` over the group of ranks {0, stride, 2 stride, ...} (size n).
  double collective(CollectiveKind k, double bytes, int64_t n, int64_t stride) const;

 private:
  const ModelAnalysis& a_;
  ClusterSpec cluster_;
  const OpTimeModel& ops_;
  bool zero_ = false;
  std::map<std::tuple<std::string, int64_t, bool, bool, int64_t>, PartCost> cache_;
  std::map<std::tuple<std::string, int64_t, bool, int64_t>, double> node_cache_;
  const PartRecords* records(int i, bool sp) const;
};

// "1.5 GiB", "320 MiB", "12 KiB"
std::string describe_bytes(double bytes);

}  // namespace oases
