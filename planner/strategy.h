// Strategies: the sharding of the parameters (and batch inputs) a parallel training run starts
// from. The Megatron strategy is found on any imported graph from its recognised transformer blocks
// (graph/blocks.h): q/k/v, up and gate projections column-split, output and down projections
// row-split (attention heads follow), the token embedding and LM head split over the vocabulary,
// norms and position embeddings replicated. A plan file can override any parameter's spec.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/blocks.h"
#include "graph/sharding.h"
#include "planner/pipeline.h"
#include "planner/partition.h"

namespace oases {

struct StrategyOptions {
  int64_t tp = 1, dp = 1;
  bool vocab_parallel = true;                   // split the token embedding and LM head over the vocabulary
  bool sequence_parallel = false;               // norms and residuals split over the sequence (reduce-scatter + all-gather)
  bool collective_matmul = false;               // with sequence parallelism: ring-decomposed gathers/scatters (planner/collective_matmul.h)
  int64_t dp_bucket_bytes = int64_t{25} << 20;  // data-parallel gradient all-reduce buckets
};

// What the strategy decided for one linear layer or embedding, for plans and reports.
struct LayerSplit {
  std::string what;   // "layer.0.attn.qkv", "embedding", ...
  std::string split;  // "column", "row", "vocabulary", "replicated"
  std::vector<ValueId> weights;
};

// How one recognised part of a transformer (the token embedding, a block's attention or MLP, the
// head with its loss) is split: Megatron's way over its own `tp` ranks, the other ranks
// data-parallel (planner/hybrid.h), what the cost model prices and the search chooses.
struct Layout {
  int64_t tp = 1;
  bool sequence_parallel = false;  // norms and residuals split over the sequence
  bool collective_matmul = false;  // its sequence-parallel gathers and scatters decomposed into ring steps (planner/collective_matmul.h)
  auto operator<=>(const Layout&) const = default;
  // the same split of the values (collective_matmul only changes how a part's collectives run)
  bool same_split(const Layout& o) const { return tp == o.tp && sequence_parallel == o.sequence_parallel; }
  std::string to_string() const;  // "tp2+sp+cm"
};

// One part's layout, with the part's name: a plan's per-part layouts.
struct PartLayout : Layout {
  std::string part;  // "embedding", "layer.3.attn", "layer.3.mlp", "head"

  PartLayout() = default;
  PartLayout(std::string part_name, const Layout& layout) : Layout(layout), part(std::move(part_name)) {}
  auto operator<=>(const PartLayout&) const = default;
};

struct Strategy {
  Mesh mesh;
  int64_t dp_bucket_bytes = int64_t{25} << 20;
  std::map<ValueId, ShardingSpec> specs;  // parameters and inputs
  std::vector<LayerSplit> layers;
  std::map<ValueId, ShardingSpec> pins;  // values every reader sees in this spec (sequence parallelism)
  // Per-part layouts when the parts differ (empty: one tp x dp split for all); the batch inputs and
  // the data-parallel gradient all-reduces then follow each part's dp axis.
  std::vector<PartLayout> part_layouts;
  // Collective matmuls (planner/collective_matmul.h) in these parts; every part when the set is empty.
  bool collective_matmul = false;
  std::set<std::string> collective_matmul_parts;
  // bucket the gradient all-reduces (dp, and tp of sequence-parallel weights); with `stage_cuts`
  // (pipeline stages) each stage's apart: a bucket joining two stages' gradients (or the loss)
  // would make one stage wait for the other's
  bool bucket_gradients = true;
  std::vector<StageCut> stage_cuts;
  // the distributed optimizer: gradient all-reduces become reduce-scatters of flat pieces
  // (planner/partition.h shard_gradient_reductions)
  bool zero = false;
};

// How tp ranks split one attention's q/k/v projections (a.qkv, in order): per projection the
// number of fused parts each split by heads over the columns (1 = a plain column split), or 0 =
// kept whole on every rank. Megatron's rule for grouped-query and multi-query attention: tp must
// divide the query heads; when it divides the key/value heads too they split like the queries,
// and when it is a multiple of them (tp > kv heads) every rank keeps the K/V projections whole and
// its attention reads the K/V head its query heads use (the gradients of the replicated K/V
// weights are summed over the tp group, each rank contributing its heads' part). A fused
// projection whose parts differ in width (Falcon's [q | k | v] with one K/V head) is kept whole:
// the attention then runs whole on every rank and the output projection reads its rank's heads.
// Errors name the block (`what`) and the head counts.
Expected<std::vector<int>> attention_projection_split(const AttentionInfo& a, int64_t tp, const std::string& what);

// Megatron's strategy for the model's parameters (ValueIds of `g`). Errors name the block and the
// size that tp does not divide (heads, kv heads, hidden, MLP width, vocabulary).
Expected<Strategy> megatron_strategy(const Graph& g, const StrategyOptions& opt);
// The values a batch input's rows reach the model through: with micro-batch chunks, each chunk's
// slice of it (`chunks`: input -> its slice per chunk, from chunk_batch), else the input itself.
using ChunkVersions = std::map<ValueId, std::vector<ValueId>>;
std::vector<ValueId> batch_carriers(ValueId input, const ChunkVersions& chunks);

// Data-parallel batch split of the graph inputs (dim 0) over "dp"; errors when it does not divide.
// With micro-batch chunks the split lands on each chunk's slice and the input stays whole on every
// rank (a contiguous slice of a dp-split batch would gather it first: every rank would compute
// every row of every chunk).
Status split_batch_inputs(const Graph& g, Strategy* s, const ChunkVersions& chunks = {});

// Global training graph (outputs: loss, then gradients of `params` in order) -> per-rank template.
// Gradients leave in their parameter's spec; the loss replicated.
Expected<PartitionedGraph> partition_training(const Graph& train, const std::vector<ValueId>& params, const Strategy& s,
                                              ShardingResult* sharding = nullptr);

}  // namespace oases
