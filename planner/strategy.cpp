#include "planner/strategy.h"

#include <functional>

#include <fmt/format.h>

#include "graph/op_registry.h"
#include "planner/collective_matmul.h"
#include "planner/hybrid.h"
#include "planner/pipeline_program.h"
#include "planner/propagation.h"

namespace oases {

namespace {

// weight spec of a linear layer split along its output (column) or input (row) features
ShardingSpec linear_spec(const Graph& g, const LinearInfo& l, bool column, int tp_axis, int segments) {
  ShardingSpec s = ShardingSpec::replicated(g.value(l.weight).shape.size());
  // stored [in, out] unless transposed ([out, in])
  size_t out_dim = l.transposed ? 0 : 1, in_dim = l.transposed ? 1 : 0;
  s.dims[column ? out_dim : in_dim] = DimSpec{tp_axis, column ? segments : 1};
  return s;
}

}  // namespace

std::string Layout::to_string() const {
  return fmt::format("tp{}{}{}", tp, sequence_parallel ? "+sp" : "", collective_matmul ? "+cm" : "");
}

Expected<std::vector<int>> attention_projection_split(const AttentionInfo& a, int64_t tp, const std::string& what) {
  if (a.heads % tp != 0) return error("{}: tp {} does not divide its {} attention heads", what, tp, a.heads);
  bool kv_split = a.kv_heads % tp == 0;
  if (!kv_split && tp % a.kv_heads != 0) {
    return error("{}: tp {} neither divides nor is a multiple of its {} key/value heads ({} query heads)", what, tp, a.kv_heads, a.heads);
  }
  if (a.qkv.size() == 1) {
    // [q | k | v] in three equal parts split by heads each, unless the K/V parts are narrower;
    // laid out per head ([.., H, 3, D]), a plain column split hands out whole heads
    if (a.qkv_per_head) return std::vector<int>{1};
    return std::vector<int>{a.kv_heads == a.heads ? 3 : 0};
  }
  std::vector<int> segs(a.qkv.size(), 1);
  // q, then k and v: kept whole on every rank when tp exceeds the key/value heads
  for (size_t i = 1; i < segs.size() && !kv_split; ++i) segs[i] = 0;
  return segs;
}

Expected<Strategy> megatron_strategy(const Graph& g, const StrategyOptions& opt) {
  Strategy st;
  st.mesh = Mesh::data_tensor(opt.dp, opt.tp);
  st.dp_bucket_bytes = opt.dp_bucket_bytes;
  if (opt.tp < 1 || opt.dp < 1) return error("tp ({}) and dp ({}) must be at least 1", opt.tp, opt.dp);
  int tp = st.mesh.axis("tp");
  ModelStructure ms = find_transformer_structure(g);
  if (opt.tp == 1) return st;
  if (ms.blocks.empty()) return Status::error("no transformer block was recognised, so the Megatron strategy has nothing to split");
  // A bias that one initializer serves in layers splitting it differently (exporters merge
  // initializers of equal value: a fresh model's zero biases become one tensor) stays whole; each
  // column-parallel use slices its part locally (and any later use that differs keeps it whole).
  auto set = [&](ValueId v, const ShardingSpec& s, const std::string& what, bool bias = false) -> Status {
    Status ok = s.validate(g.value(v).shape, st.mesh);
    if (!ok.is_ok()) return error("{}: weight '{}' {}: {}", what, g.value(v).name, shape_str(g.value(v).shape), ok.message());
    auto it = st.specs.find(v);
    if (it != st.specs.end() && it->second != s && bias && g.value(v).shape.size() == 1) {
      it->second = ShardingSpec::replicated(1);
      return Status::ok();
    }
    if (it != st.specs.end() && it->second != s) {
      return error("{}: weight '{}' is shared with another layer that splits it as {}, here {}", what, g.value(v).name,
                   it->second.to_string(&st.mesh), s.to_string(&st.mesh));
    }
    st.specs[v] = s;
    return Status::ok();
  };
  auto linear = [&](const LinearInfo& l, bool column, int segments, const std::string& what) -> Status {
    if (l.matmul == kNoId) return Status::ok();
    int64_t features = column ? l.out_features : l.in_features;
    if (features % (opt.tp * segments) != 0) {
      return error("{}: tp {} does not divide the {} {} features{}", what, opt.tp, features, column ? "output" : "input",
                   segments > 1 ? fmt::format(" of each of its {} fused parts", segments) : "");
    }
    OASES_RETURN_IF_ERROR(set(l.weight, linear_spec(g, l, column, tp, segments), what));
    if (l.bias != kNoId) {
      ShardingSpec b = ShardingSpec::replicated(1);
      if (column) b.dims[0] = DimSpec{tp, segments};
      OASES_RETURN_IF_ERROR(set(l.bias, b, what + " bias", true));
    }
    st.layers.push_back(LayerSplit{what, column ? "column" : "row", {l.weight}});
    return Status::ok();
  };
  for (const BlockInfo& b : ms.blocks) {
    std::string base = fmt::format("block {}", b.index);
    if (b.has_attn) {
      const AttentionInfo& a = b.attn;
      OASES_ASSIGN_OR_RETURN(std::vector<int> segs, attention_projection_split(a, opt.tp, base));
      for (size_t i = 0; i < a.qkv.size(); ++i) {
        std::string what = base + (a.qkv.size() == 1 ? " qkv" : std::string(" ") + "qkv"[i]);
        if (segs[i] == 0) {
          st.layers.push_back(LayerSplit{what, "replicated", {a.qkv[i].weight}});
          continue;
        }
        OASES_RETURN_IF_ERROR(linear(a.qkv[i], true, segs[i], what));
      }
      OASES_RETURN_IF_ERROR(linear(a.out, false, 1, base + " attention output"));
      if (a.alibi_slopes != kNoId) {
        // each rank's heads read their own ALiBi slopes
        const ShardingSpec by_heads = ShardingSpec::replicated(g.value(a.alibi_slopes).shape.size()).with_dim(a.alibi_heads_dim, tp);
        OASES_RETURN_IF_ERROR(set(a.alibi_slopes, by_heads, base + " ALiBi slopes"));
      }
    }
    if (b.has_mlp) {
      for (size_t i = 0; i < b.mlp.up.size(); ++i) {
        OASES_RETURN_IF_ERROR(linear(b.mlp.up[i], true, 1, base + (b.mlp.up.size() == 2 && i == 0 ? " mlp gate" : " mlp up")));
      }
      OASES_RETURN_IF_ERROR(linear(b.mlp.down, false, 1, base + " mlp down"));
    }
  }
  if (opt.sequence_parallel) {
    // the residual stream and the norms on it split over the sequence: all-reduces become a
    // reduce-scatter (into the residual) and an all-gather (into the column-parallel projections)
    auto pin = [&](ValueId v, const std::string& what) -> Status {
      const Shape& s = g.value(v).shape;
      if (s.size() != 3) return Status::ok();
      if (s[1] % opt.tp != 0) return error("{}: tp {} does not divide the sequence length {} (sequence parallelism)", what, opt.tp, s[1]);
      // (the batch stays split over dp: a pin without it would gather the batch at every norm)
      int dp = st.mesh.axis("dp");
      ShardingSpec spec = ShardingSpec::replicated(3);
      if (dp >= 0 && st.mesh.axis_size(dp) > 1) spec = spec.with_dim(0, dp);
      st.pins[v] = spec.with_dim(1, tp);
      return Status::ok();
    };
    std::vector<const NormInfo*> norms;
    for (const BlockInfo& b : ms.blocks) {
      for (const NormInfo& nrm : b.norms) norms.push_back(&nrm);
    }
    for (const NormInfo& nrm : ms.final_norms) norms.push_back(&nrm);
    for (const NormInfo* nrm : norms) {
      const Node& n = g.node(nrm->node);
      OASES_RETURN_IF_ERROR(pin(n.inputs[0], n.describe()));
      OASES_RETURN_IF_ERROR(pin(n.outputs[0], n.describe()));
    }
    // the partial sums entering the residual stream (row-parallel projections, before their bias,
    // and a vocabulary-parallel embedding) reduce-scatter straight into it
    for (const BlockInfo& b : ms.blocks) {
      for (const LinearInfo* l : {&b.attn.out, &b.mlp.down}) {
        if (l->matmul != kNoId) OASES_RETURN_IF_ERROR(pin(g.node(l->matmul).outputs[0], g.node(l->matmul).describe()));
      }
    }
    for (const EmbeddingInfo& e : ms.embeddings) {
      if (e.role == "token") OASES_RETURN_IF_ERROR(pin(g.node(e.gather).outputs[0], g.node(e.gather).describe()));
    }
    st.layers.push_back(LayerSplit{"norms and residual stream", "sequence", {}});
  }
  if (opt.vocab_parallel) {
    for (const EmbeddingInfo& e : ms.embeddings) {
      if (e.role != "token") continue;
      if (e.rows % opt.tp != 0) {
        return error("tp {} does not divide the vocabulary size {} of embedding '{}' (or use --no-vocab-parallel)", opt.tp, e.rows,
                     g.value(e.weight).name);
      }
      ShardingSpec s = ShardingSpec::replicated(2);
      s.dims[0] = DimSpec{tp, 1};
      OASES_RETURN_IF_ERROR(set(e.weight, s, "token embedding"));
      st.layers.push_back(LayerSplit{"token embedding", "vocabulary", {e.weight}});
    }
    if (ms.has_head && !ms.tied_head) {
      if (ms.head.out_features % opt.tp != 0) {
        return error("tp {} does not divide the vocabulary size {} of the LM head (or use --no-vocab-parallel)", opt.tp,
                     ms.head.out_features);
      }
      OASES_RETURN_IF_ERROR(set(ms.head.weight, linear_spec(g, ms.head, true, tp, 1), "LM head"));
      if (ms.head.bias != kNoId) {
        ShardingSpec b = ShardingSpec::replicated(1);
        b.dims[0] = DimSpec{tp, 1};
        OASES_RETURN_IF_ERROR(set(ms.head.bias, b, "LM head bias"));
      }
      st.layers.push_back(LayerSplit{"LM head", "vocabulary", {ms.head.weight}});
    } else if (ms.has_head) {
      st.layers.push_back(LayerSplit{"LM head (tied)", "vocabulary", {ms.head.weight}});
    }
  }
  st.collective_matmul = opt.collective_matmul && opt.sequence_parallel && opt.tp > 1;
  return st;
}

std::vector<ValueId> batch_carriers(ValueId input, const ChunkVersions& chunks) {
  auto it = chunks.find(input);
  if (it == chunks.end() || it->second.empty()) return {input};
  return it->second;
}

Status split_batch_inputs(const Graph& g, Strategy* s, const ChunkVersions& chunks) {
  if (!s->part_layouts.empty()) return split_batch_inputs_by_part(g, s->part_layouts, s, chunks);
  int dp = s->mesh.axis("dp");
  if (dp < 0 || s->mesh.axis_size(dp) == 1) return Status::ok();
  int64_t n = s->mesh.axis_size(dp);
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    if (val.shape.empty()) continue;
    std::vector<ValueId> carriers = batch_carriers(v, chunks);
    for (ValueId c : carriers) {
      const Value& cv = g.value(c);
      if (cv.shape.empty() || cv.shape[0] % n != 0) {
        return error("dp {} does not divide the batch size {} of input '{}'{}", n, cv.shape.empty() ? 0 : cv.shape[0], val.name,
                     c == v ? "" : " in each micro-batch chunk");
      }
      // (a chunk's slice is made by a node: a pin, not a seed, fixes its spec)
      (c == v ? s->specs : s->pins)[c] = ShardingSpec::replicated(cv.shape.size()).with_dim(0, dp);
    }
    if (carriers.front() != v) s->specs[v] = ShardingSpec::replicated(val.shape.size());
  }
  return Status::ok();
}

Expected<PartitionedGraph> partition_training(const Graph& train, const std::vector<ValueId>& params, const Strategy& s,
                                              ShardingResult* sharding) {
  std::map<size_t, ShardingSpec> outs;
  const auto& o = train.outputs();
  for (size_t k = 0; k < o.size(); ++k) {
    outs[k] = ShardingSpec::replicated(train.value(o[k]).shape.size());
    if (k >= 1 && k - 1 < params.size()) {
      auto it = s.specs.find(params[k - 1]);
      if (it != s.specs.end()) outs[k] = it->second;
    }
  }
  OASES_ASSIGN_OR_RETURN(ShardingResult sr, propagate_sharding(train, s.mesh, s.specs, outs, s.pins));
  OASES_ASSIGN_OR_RETURN(PartitionedGraph pg, partition_graph(train, sr));
  if (s.collective_matmul) {
    auto selected = [&s](const std::string& part) { return s.collective_matmul_parts.empty() || s.collective_matmul_parts.count(part) > 0; };
    OASES_ASSIGN_OR_RETURN(CollectiveMatmulReport cm, decompose_collective_matmuls(pg.local, &pg.specs, selected));
    pg.collectives += cm.shifts - cm.gathers - cm.scatters;
  }
  int dp = s.mesh.axis("dp");
  const int64_t bucket_bytes = s.bucket_gradients ? s.dp_bucket_bytes : 0;
  std::function<int(NodeId)> stage_of;
  StageAssignment stages;
  if (!s.stage_cuts.empty() && bucket_bytes > 0) {
    OASES_ASSIGN_OR_RETURN(stages, assign_stages(pg.local, params, s.stage_cuts, static_cast<int>(s.stage_cuts.size())));
    stage_of = [&stages](NodeId id) { return stages.stages[static_cast<size_t>(id)].front(); };
  }
  auto bucket = [&](int axis) { bucket_gradient_all_reduces(pg, axis, bucket_bytes, stage_of); };
  if (dp >= 0 && s.mesh.axis_size(dp) > 1 && bucket_bytes > 0) bucket(dp);
  // sequence parallelism leaves the gradients of weights applied on sequence shards (norms, the
  // row-parallel biases, position embeddings) partial over tp: dozens of tiny all-reduces, bucketed
  // like the data-parallel ones
  int tpa = s.mesh.axis("tp");
  bool tp_pins = false;
  for (const auto& [v, sp] : s.pins) tp_pins |= tpa >= 0 && sp.uses_axis(tpa);
  if (tp_pins && s.part_layouts.empty() && tpa >= 0 && s.mesh.axis_size(tpa) > 1 && bucket_bytes > 0)
    bucket(tpa);
  if (!s.part_layouts.empty() && bucket_bytes > 0) {
    // parts with their own dp axes: the gradients of each axis bucketed apart
    for (int a = 0; a < pg.mesh.num_axes(); ++a) {
      if (a != dp && pg.mesh.axis_size(a) > 1) bucket(a);
    }
  }
  if (s.zero) shard_gradient_reductions(pg);
  if (sharding) *sharding = std::move(sr);
  return pg;
}

}  // namespace oases
