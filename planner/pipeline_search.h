// Planning pipeline stages (issue 15): for N GPUs, every stage count S whose stage mesh of N/S GPUs
// lines up with the hosts (whole hosts, or an equal share of one), every micro-batch count M (a
// multiple of S dividing the batch) and every pipeline schedule, the stages' inner plan is the
// one-mesh search's (planner/search.h) on N/S GPUs with M x K chunks, every stage taking the same
// layout, and then each stage its own tp where its parts run faster so (oases-train --stage-meshes);
// the model's blocks are cut so the slowest stage (the embedding
// on the first, the head on the last) is as fast as it can be; each stage's memory counts its own
// parameters and the activations of the micro-batches it keeps in flight; the activation crossing
// each boundary is priced by the cross-mesh resharding planner (planner/reshard.h) on the
// cluster's hosts and links; and the pipeline simulator (planner/pipeline.h) gives the step time
// and the bubble. The fastest candidate under the memory limit wins.
#pragma once

#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/pipeline.h"
#include "planner/search.h"

namespace oases {

struct PipelinePlanOptions {
  std::vector<PipelineSchedule> schedules{PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kEager1F1B,
                                          PipelineSchedule::kZBH1};
  std::vector<int64_t> micro_factors{1, 2, 4, 8, 12, 16};  // M = factor x S
  std::vector<int64_t> inner_chunks{1, 2};         // K per micro-batch
  double memory_limit = 0;                         // bytes per GPU (0: none)
  SearchOptions inner;                             // schedules, degrees, mixed layouts of the stages' search
  std::vector<int64_t> stage_counts;               // S to consider (empty: every divisor of the GPUs fitting hosts and blocks)
  // Fitting candidates to return (PipelinePlan::runners_up holds the others, fastest first), for a
  // caller that ranks them by another measure (oases-plan --simulate replays their programs).
  int keep = 1;
  // The distributed optimizer on every stage or not (CostModel::set_zero): each choice listed is
  // weighed, the faster that fits kept.
  std::vector<bool> zero{false};
  // Virtual stages per pipeline stage weighed with 1F1B (interleaved, planner/pipeline.h): those
  // whose S x V block ranges the model has.
  std::vector<int> virtual_stages{1, 2, 4};
};

struct PipelineStagePlan {
  std::vector<StageCut> ranges;  // the block ranges it holds: one, or V with virtual stages
  bool embedding = false, head = false;
  int64_t first_rank = 0, ranks = 0;
  Layout layout;  // the stage's tp (and sequence parallelism), dp = ranks / tp
  double forward_s = 0, backward_s = 0;  // one micro-batch
  // of backward_s, a zero-bubble schedule's W steps (the weight gradients; the first stage's whole
  // backward); 0 when the schedule does not split the backward
  double weight_s = 0;
  double memory_bytes = 0;
  int peak_in_flight = 0;
  std::vector<InFlight> flight;  // after each of its steps: micro-batches F-to-B and B-to-W (pipeline.h in_flight_profile)
};

struct PipelinePlan {
  bool found = false;
  int stages = 0;
  int64_t stage_ranks = 0;
  int micro_batches = 0;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int virtual_stages = 1;  // interleaved 1F1B: block ranges per stage
  PlanChoice inner;  // the stages' layout (chunks = M x K); with per_stage, its schedule and chunks
  bool zero = false;  // priced with the distributed optimizer (Plan::zero)
  bool per_stage = false;  // the stages differ in tp (PipelineStagePlan::layout)
  std::vector<PipelineStagePlan> stage;
  std::vector<double> transfer_s;  // per boundary of model stages, one micro-batch's activation
  // once a step, after the flush: a tied embedding and head on different stages send the head's
  // gradient of the table to the first stage and the sum back (both after their stages' reductions)
  double exchange_s = 0;
  double step_s = 0, bubble = 0, optimizer_s = 0, memory_bytes = 0;
  PipelineSim sim;
  int64_t candidates = 0;  // (S, M, K, schedule) priced
  double search_ms = 0;
  std::string why;  // when nothing was found
  // What was found as a plan (planner/plan.h): the stages' blocks and meshes, the inner schedule,
  // micro-batches and pipeline schedule; what oases-plan writes and oases-train runs. And the
  // inner layouts in words (plan_report.h describe_layouts).
  Plan plan;
  std::string inner_layouts;
  // With PipelinePlanOptions::keep > 1: the next fastest fitting candidates of other (S, M,
  // schedule, inner plan, stage layouts), fastest first (their own runners_up empty).
  std::vector<PipelinePlan> runners_up;
};

// `forward`/`train`/`params`: the model as the one-mesh search plans it (planner/analysis.h).
// `ops`: op times on the cluster's device.
Expected<PipelinePlan> search_pipeline(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, const ClusterSpec& cluster,
                                       const OpTimeModel& ops, int64_t gpus, const PipelinePlanOptions& o);

// The stage counts S the search tries for `gpus` GPUs on `cluster` (`blocks` transformer blocks):
// o.stage_counts where they divide, else every S >= 2 whose stage mesh lines up with the hosts.
std::vector<int64_t> pipeline_stage_counts(const ClusterSpec& cluster, int64_t gpus, int blocks, const PipelinePlanOptions& o);
// The micro-batch counts M it tries with S stages on a batch of `batch` (M = factor x S dividing it);
// the stages' inner search then prices M x K chunks for each K of o.inner_chunks.
std::vector<int64_t> pipeline_micro_batches(int64_t S, int64_t batch, const PipelinePlanOptions& o);

// The same model laid out by hand: S stages of tp x (N / S / tp) with M micro-batches (Megatron-LM's
// configurations), priced as the search prices its candidates; the inner schedule is `inner_schedule`,
// with the distributed optimizer when `zero` (Megatron-LM's --use-distributed-optimizer) and
// `virtual_stages` block ranges a stage (its interleaved schedule, --num-layers-per-virtual-pipeline-stage).
Expected<PipelinePlan> price_pipeline(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, const ClusterSpec& cluster,
                                      const OpTimeModel& ops, int64_t gpus, int stages, int64_t tp, int micro_batches,
                                      PipelineSchedule schedule, const std::string& inner_schedule, bool zero = false, int virtual_stages = 1);

// The plan of a pipeline the search found (PipelinePlan::plan, what its file carries): the first
// stage's inner plan on its mesh, each later stage the same or, on a layout of its own, every part
// in that layout (the one it was priced in), with their blocks, the micro-batches and the schedule. `stage_a`: the model analysed on
// p.stage_ranks ranks.
Plan plan_of_pipeline(const ModelAnalysis& stage_a, const PipelinePlan& p);

// The model stages' block ranges in model order (with virtual stages, S x V of them).
std::vector<StageCut> model_cuts(const PipelinePlan& p);
nlohmann::json pipeline_plan_json(const PipelinePlan& p);
std::string describe_pipeline(const PipelinePlan& p);

}  // namespace oases
