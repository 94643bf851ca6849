// What the cost model knows about a model: its training graph read once, node by node, under
// Megatron's split at a reference tp degree (sharding propagation over a {dp: 1, tp: R} mesh), so
// that for any layout of a part (tp degree t, dp = N/t, K micro-batch chunks, with or without
// sequence parallelism) every node's local shapes, work and profile key follow by division: dims
// split over dp are batch dims (divided by dp·K), dims split over tp are divided by t. The
// collectives Megatron's split inserts come from the same propagation (its conversions), the
// vocabulary-parallel loss adds its own small all-reduces.
//
// Parts are the chain the search walks: embedding, layer.i.attn, layer.i.mlp, ..., head.
// Nodes without a scope belong to the part of their producers (forward) or of their origin
// (backward); weight-only nodes to their first reader's part.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "graph/blocks.h"
#include "graph/graph.h"
#include "planner/cluster_spec.h"
#include "planner/profile.h"
#include "planner/strategy.h"

namespace oases {

// A tensor of a node, with the role of each dim under the reference split.
struct TensorRecord {
  DType dtype = DType::kF32;
  Shape shape;             // global
  std::vector<char> mark;  // per dim: 'b' batch (over dp), 't' tp, '-' whole
  double local_elements(int64_t t, int64_t dpk) const;
  Shape local_shape(int64_t t, int64_t dpk) const;
};

struct NodeRecord {
  std::string op;       // the profile's op name, "|tAB" added for a product's transposed operands
  NodeId node = kNoId;  // in the training graph read (what oases-profile times alone)
  std::vector<TensorRecord> inputs, outputs;
  double flops = 0, bytes = 0;  // global, one execution over the whole batch
  bool batch = false;           // works on batch rows: runs once per chunk on B/(dp·K) rows
  bool uses_tp = false;         // its work is split over tp
  enum class Phase { kForward, kBackward } phase = Phase::kForward;
  // a backward node that sums batch rows into a weight's gradient (batch inputs, no batch output):
  // what a zero-bubble schedule defers to its W steps
  bool weight_grad = false;
};

struct CommRecord {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  TensorRecord tensor;   // the whole tensor the collective moves (global shape)
  bool over_dp = false;  // a data-parallel reduction (gradients), else over tp
  bool batch = false;    // per chunk
  NodeRecord::Phase phase = NodeRecord::Phase::kForward;
};

// One part's records under one reference split (with or without sequence parallelism).
struct PartRecords {
  std::vector<NodeRecord> nodes;
  std::vector<CommRecord> comms;
  double param_elements = 0;        // global elements of the part's trainable weights
  double split_param_elements = 0;  // of which split over tp
  // bytes per batch row (global, /dp·K for a chunk on a rank): forward values backward reads; the
  // part's entry; collective outputs and norm inputs (what comm-optimised checkpointing keeps)
  TensorRecord entry;  // the [B, T, C] value entering the part
  std::vector<TensorRecord> saved, kept_comm_opt;
  // what is alive where the part's backward holds the most (the training graph's order): its own
  // saved activations not yet read for the last time, and every gradient made and not yet read
  // for the last time (the incoming one, those of the part's products, a residual's). Batch values
  // only (weights' gradients are state).
  std::vector<TensorRecord> peak_saved, peak_grads;
  // a block's MLP part: the saved activations of the block's attention part (recomputing whole
  // blocks, alive while the MLP's backward runs)
  std::vector<TensorRecord> block_saved_before;
  bool backward_first = false;  // the loss's part: its backward runs before every other's
  // what the part's weight-gradient nodes (backward nodes reducing batch values into weights'
  // gradients: a zero-bubble schedule's W) read: gradients the input-gradient pass (B) made, and
  // activations (recomputed ones under checkpointing). Held from a micro-batch's B to its W.
  std::vector<TensorRecord> weight_grad_inputs, weight_act_inputs;
  std::string signature;  // equal for parts of identical shape and split
};

struct ModelAnalysis {
  std::vector<std::string> parts;          // chain order
  std::vector<PartRecords> plain, seqpar;  // per part; seqpar empty when sequence parallelism is impossible
  int64_t batch = 0, seq = 0, hidden = 0, vocab = 0;
  int64_t reference_tp = 0;  // 0: no tp degree > 1 divides the model
  bool tied_head = false;
  double tied_table_elements = 0;      // the tied table's [V, H] (a stage without the embedding holds a copy)
  bool mixed_ok = true;                // parts may take different layouts (else one for all)
  std::string mixed_why;               // why not
  std::vector<int64_t> tp_candidates;  // degrees dividing heads, kv heads, MLP width and vocabulary
  std::map<std::string, int> part_index;
};

// `train`: the training graph (loss + backward, K = 1) made from `forward`; `ranks` bounds the
// degrees. Reads shapes only.
Expected<ModelAnalysis> analyze_model(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, int64_t ranks);

// analyze_model of one model on several rank counts (the pipeline search's stage meshes): what
// depends on the model alone (its structure, which tp degrees split it, why its parts may not differ,
// the records under each reference degree) is worked out by the first analysis and kept for the
// others. Thread-safe; the graphs must outlive it.
class ModelAnalyzer {
 public:
  ModelAnalyzer(const Graph& forward, const Graph& train, const std::vector<ValueId>& params);
  Expected<ModelAnalysis> analyze(int64_t ranks);

 private:
  struct Records {
    std::vector<PartRecords> plain, seqpar;
  };
  const Graph& forward_;
  const Graph& train_;
  const std::vector<ValueId>& params_;
  std::mutex mu_;
  bool model_read_ = false;
  ModelStructure ms_;
  std::vector<std::string> parts_;
  int64_t batch_ = 0, seq_ = 0;
  std::string mixed_why_;               // "" when the model lets parts differ
  std::map<int64_t, bool> divides_;     // tp degree: Megatron's split takes it
  std::map<int64_t, Records> records_;  // by reference tp degree
};

}  // namespace oases
