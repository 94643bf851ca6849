// What the planner prices, op by op: the one list `oases-plan --profile` checks a profile against
// and `oases-profile --model` measures (it times alone every entry its runs of the program did not
// time). It walks the searches' own spaces: the one-mesh search on `gpus` ranks (every chunk count,
// allowed_layouts of planner/search.h) and the pipeline search's stages (pipeline_stage_counts and
// pipeline_micro_batches of planner/pipeline_search.h: the model analysed on gpus / S ranks, priced
// with M x K chunks), and for each part and layout the ops CostModel::part times
// (priced_part_ops of planner/cost_model.h). Collective matmuls price the same ops as their
// sequence-parallel layout (their ring copies are priced from the profile's copy rate).
#pragma once

#include <string>
#include <vector>

#include "planner/analysis.h"
#include "planner/cost_model.h"
#include "planner/pipeline_search.h"
#include "planner/profile.h"
#include "planner/search.h"

namespace oases {

// What oases-plan searches (its flags): the one-mesh search's options and the pipeline search's.
struct PricingSpace {
  int64_t gpus = 1;
  SearchOptions search;       // degrees, chunk counts, sequence parallelism (also the stages' inner search)
  bool pipeline = true;       // the pipeline search too (oases-plan without --no-pipeline, 2 GPUs or more)
  PipelinePlanOptions pipe;   // its stage counts, micro-batch factors and chunks per micro-batch
  int64_t gpus_per_node = 0;  // the hosts a stage mesh lines up with (0: one host of `gpus`)
};

// oases-plan MODEL --gpus N with no search flags, its chunk counts widened by `more_chunks`.
PricingSpace default_pricing_space(int64_t gpus, const std::vector<int64_t>& more_chunks = {});

struct PricedSample {
  PricedOp op;
  std::string part;    // "layer.0.attn"
  Layout layout;       // tp (dp = ranks / tp), sequence parallelism
  int64_t ranks = 1;   // the mesh's: every GPU, or one pipeline stage's
  int64_t chunks = 1;  // of the batch on that mesh (a pipeline's micro-batches x chunks each)
  int64_t stages = 1;
  // "layer.0.attn at tp 2 x dp 1, 2 chunks", ", sequence-parallel", ", a stage of 2 pipeline stages"
  std::string where() const;
};

// Every distinct op key the planner prices for the model in `space` (each with the first place that
// prices it), in the searches' order. `a`: the model analysed on space.gpus ranks (analyze_model).
Expected<std::vector<PricedSample>> priced_ops(const Graph& forward, const Graph& train, const std::vector<ValueId>& params,
                                               const ModelAnalysis& a, const PricingSpace& space);

// Which of `priced` the profile has no sample of: by key (the profile timed the op at that shape),
// or, for a profile of another backend than the CPU (a GPU profile times its own compute type,
// the planner's keys are float32's), by op (it has samples of the op to interpolate between).
std::vector<const PricedSample*> uncovered(const std::vector<PricedSample>& priced, const Profile& p);

}  // namespace oases
