#include "planner/hybrid.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/op_registry.h"

namespace oases {

namespace {

int log2_exact(int64_t n) {
  int k = 0;
  while ((int64_t{1} << k) < n) ++k;
  return (int64_t{1} << k) == n ? k : -1;
}

// weight spec of a linear layer split along its output (column) or input (row) features
ShardingSpec linear_spec(const Graph& g, const LinearInfo& l, bool column, int tp_axis, int segments) {
  ShardingSpec s = ShardingSpec::replicated(g.value(l.weight).shape.size());
  size_t out_dim = l.transposed ? 0 : 1, in_dim = l.transposed ? 1 : 0;
  s.dims[column ? out_dim : in_dim] = DimSpec{tp_axis, column ? segments : 1};
  return s;
}

// The parts reached first from value v through unscoped nodes (casts, reshapes, chunk slices).
std::set<std::string> reader_parts(const Graph& g, ValueId v) {
  std::set<std::string> out;
  std::vector<ValueId> stack{v};
  std::set<ValueId> seen;
  while (!stack.empty()) {
    ValueId cur = stack.back();
    stack.pop_back();
    if (!seen.insert(cur).second) continue;
    for (const Use& u : g.uses(cur)) {
      const Node& n = g.node(u.node);
      if (n.phase != Node::Phase::kForward && n.phase != Node::Phase::kLoss) continue;
      std::string p = part_of_scope(n.scope);
      if (!p.empty()) {
        out.insert(p);
        continue;
      }
      for (ValueId o : n.outputs) {
        if (o != kNoId) stack.push_back(o);
      }
    }
  }
  return out;
}

}  // namespace

Expected<Mesh> mesh_for_degrees(int64_t ranks, const std::set<int64_t>& degrees, std::map<int64_t, PartAxes>* axes) {
  if (degrees.empty()) return Status::error("no tensor-parallel degree given");
  for (int64_t t : degrees) {
    if (t < 1 || ranks % t != 0) return error("tp degree {} does not divide the {} ranks", t, ranks);
  }
  if (degrees.size() == 1) {
    int64_t t = *degrees.begin();
    (*axes)[t] = PartAxes{1, 0};
    return Mesh::data_tensor(ranks / t, t);
  }
  int k = log2_exact(ranks);
  if (k < 0) return error("parts with different tp degrees need a power-of-two number of ranks ({} is not)", ranks);
  if (k > 7) return error("parts with different tp degrees are supported up to 128 ranks ({} asked)", ranks);
  Mesh m;
  for (int i = 0; i < k; ++i) {
    m.axes.push_back(fmt::format("m{}", i));
    m.sizes.push_back(2);
  }
  m.parts.assign(static_cast<size_t>(k), {});
  std::map<std::pair<int, int>, int> ranges;
  auto range = [&](int a, int b) -> int {
    if (a >= b) return -1;
    if (b - a == 1) return a;
    auto it = ranges.find({a, b});
    if (it != ranges.end()) return it->second;
    std::string name = "m";
    std::vector<int> bases;
    for (int i = a; i < b; ++i) {
      name += std::to_string(i);
      bases.push_back(i);
    }
    int idx = m.add_compound(name, bases);
    ranges[{a, b}] = idx;
    return idx;
  };
  std::vector<int> js;
  for (int64_t t : degrees) {
    int j = log2_exact(t);
    if (j < 0) return error("parts with different tp degrees need power-of-two degrees ({} is not)", t);
    js.push_back(j);
    (*axes)[t] = PartAxes{range(k - j, k), range(0, k - j)};
  }
  // the minor dp axes a batch moves over between two degrees: dp(j1) = dp(j2) ++ [k-j2, k-j1)
  for (int j1 : js) {
    for (int j2 : js) {
      if (j1 < j2) range(k - j2, k - j1);
    }
  }
  OASES_RETURN_IF_ERROR(m.validate());
  return m;
}

std::vector<std::string> model_parts(const ModelStructure& ms) {
  std::vector<std::string> out;
  for (const EmbeddingInfo& e : ms.embeddings) {
    if (e.role == "token") {
      out.push_back("embedding");
      break;
    }
  }
  for (const BlockInfo& b : ms.blocks) {
    if (b.has_attn) out.push_back(fmt::format("layer.{}.attn", b.index));
    if (b.has_mlp) out.push_back(fmt::format("layer.{}.mlp", b.index));
  }
  if (ms.has_head) out.push_back("head");
  return out;
}

Status hybrid_inputs_supported(const Graph& forward) {
  for (ValueId v : forward.inputs()) {
    const Value& val = forward.value(v);
    if (val.shape.empty()) continue;
    std::set<std::string> parts = reader_parts(forward, v);
    if (parts.size() != 1) {
      return error("input '{}' is read by {} parts; parts with different layouts need each batch input read by one", val.name,
                   parts.size());
    }
  }
  return Status::ok();
}

void select_collective_matmuls(const std::vector<PartLayout>& layouts, Strategy* st) {
  st->collective_matmul = false;
  st->collective_matmul_parts.clear();
  for (const PartLayout& l : layouts) {
    if (!l.collective_matmul || !l.sequence_parallel || l.tp < 2) continue;
    st->collective_matmul = true;
    st->collective_matmul_parts.insert(l.part);
  }
}

bool layouts_are_mixed(const std::vector<PartLayout>& layouts) {
  for (const PartLayout& l : layouts) {
    if (l.tp != layouts[0].tp || l.sequence_parallel != layouts[0].sequence_parallel) return true;
  }
  return false;
}

Expected<Strategy> apply_part_layouts(Graph& g, const std::vector<PartLayout>& layouts, int64_t ranks, const StrategyOptions& opt) {
  ModelStructure ms = find_transformer_structure(g);
  std::vector<std::string> parts = model_parts(ms);
  if (layouts.size() != parts.size()) return error("the layouts name {} parts, the model has {}", layouts.size(), parts.size());
  std::map<std::string, PartLayout> by_part;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (layouts[i].part != parts[i]) return error("layout {} is for '{}', the model's part {} is '{}'", i, layouts[i].part, i, parts[i]);
    if (layouts[i].tp < 1 || ranks % layouts[i].tp != 0)
      return error("{}: tp {} does not divide the {} ranks", parts[i], layouts[i].tp, ranks);
    by_part[parts[i]] = layouts[i];
  }
  if (layouts.empty()) return Status::error("the model has no transformer parts to lay out");
  if (!layouts_are_mixed(layouts)) {
    StrategyOptions so = opt;
    so.tp = layouts[0].tp;
    so.dp = ranks / layouts[0].tp;
    so.sequence_parallel = layouts[0].sequence_parallel;
    auto st = megatron_strategy(g, so);
    if (st) select_collective_matmuls(layouts, &*st);
    return st;
  }
  if (parts.front() != "embedding" || parts.back() != "head") {
    return Status::error("parts with different layouts need a recognised token embedding and LM head");
  }
  if (!opt.vocab_parallel)
    return Status::error("parts with different layouts split the embedding and head over the vocabulary (drop --no-vocab-parallel)");
  OASES_RETURN_IF_ERROR(hybrid_inputs_supported(g));
  std::set<int64_t> degrees;
  for (const PartLayout& l : layouts) degrees.insert(l.tp);
  std::map<int64_t, PartAxes> axes;
  OASES_ASSIGN_OR_RETURN(Mesh mesh, mesh_for_degrees(ranks, degrees, &axes));
  Strategy st;
  st.mesh = mesh;
  st.dp_bucket_bytes = opt.dp_bucket_bytes;
  auto set = [&](ValueId v, const ShardingSpec& s, const std::string& what) -> Status {
    Status ok = s.validate(g.value(v).shape, st.mesh);
    if (!ok.is_ok()) return error("{}: weight '{}' {}: {}", what, g.value(v).name, shape_str(g.value(v).shape), ok.message());
    auto it = st.specs.find(v);
    if (it != st.specs.end() && it->second != s) {
      return error("{}: weight '{}' is shared with another part that splits it as {}, here {}", what, g.value(v).name,
                   it->second.to_string(&st.mesh), s.to_string(&st.mesh));
    }
    st.specs[v] = s;
    return Status::ok();
  };
  auto linear = [&](const LinearInfo& l, bool column, int segments, int64_t tp, const std::string& what) -> Status {
    if (l.matmul == kNoId || tp == 1) return Status::ok();
    int64_t features = column ? l.out_features : l.in_features;
    if (features % (tp * segments) != 0) {
      return error("{}: tp {} does not divide the {} {} features{}", what, tp, features, column ? "output" : "input",
                   segments > 1 ? fmt::format(" of each of its {} fused parts", segments) : "");
    }
    int ax = axes[tp].tp;
    OASES_RETURN_IF_ERROR(set(l.weight, linear_spec(g, l, column, ax, segments), what));
    if (l.bias != kNoId && column)
      OASES_RETURN_IF_ERROR(set(l.bias, ShardingSpec::replicated(1).with_dim(0, ax, segments), what + " bias"));
    st.layers.push_back(LayerSplit{what, column ? "column" : "row", {l.weight}});
    return Status::ok();
  };
  // sequence parallelism inside a part: its norms and the partial sums entering its residual
  auto pin = [&](ValueId v, const PartLayout& l, const std::string& what) -> Status {
    const Shape& s = g.value(v).shape;
    if (s.size() != 3 || !l.sequence_parallel || l.tp == 1) return Status::ok();
    if (s[1] % l.tp != 0) return error("{}: tp {} does not divide the sequence length {} (sequence parallelism)", what, l.tp, s[1]);
    st.pins[v] = ShardingSpec::replicated(3).with_dim(0, axes[l.tp].dp).with_dim(1, axes[l.tp].tp);
    return Status::ok();
  };
  for (const BlockInfo& b : ms.blocks) {
    std::string base = fmt::format("block {}", b.index);
    if (b.has_attn) {
      const PartLayout& l = by_part[fmt::format("layer.{}.attn", b.index)];
      const AttentionInfo& a = b.attn;
      OASES_ASSIGN_OR_RETURN(std::vector<int> segs, attention_projection_split(a, l.tp, base));
      for (size_t i = 0; i < a.qkv.size(); ++i) {
        std::string what = base + (a.qkv.size() == 1 ? " qkv" : std::string(" ") + "qkv"[i]);
        if (segs[i] == 0) {
          if (l.tp > 1) st.layers.push_back(LayerSplit{what, "replicated", {a.qkv[i].weight}});
          continue;
        }
        OASES_RETURN_IF_ERROR(linear(a.qkv[i], true, segs[i], l.tp, what));
      }
      OASES_RETURN_IF_ERROR(linear(a.out, false, 1, l.tp, base + " attention output"));
      if (a.alibi_slopes != kNoId && l.tp > 1) {
        const ShardingSpec by_heads =
            ShardingSpec::replicated(g.value(a.alibi_slopes).shape.size()).with_dim(a.alibi_heads_dim, axes[l.tp].tp);
        OASES_RETURN_IF_ERROR(set(a.alibi_slopes, by_heads, base + " ALiBi slopes"));
      }
      if (a.out.matmul != kNoId) OASES_RETURN_IF_ERROR(pin(g.node(a.out.matmul).outputs[0], l, base + " attention output"));
    }
    if (b.has_mlp) {
      const PartLayout& l = by_part[fmt::format("layer.{}.mlp", b.index)];
      for (size_t i = 0; i < b.mlp.up.size(); ++i) {
        OASES_RETURN_IF_ERROR(linear(b.mlp.up[i], true, 1, l.tp, base + (b.mlp.up.size() == 2 && i == 0 ? " mlp gate" : " mlp up")));
      }
      OASES_RETURN_IF_ERROR(linear(b.mlp.down, false, 1, l.tp, base + " mlp down"));
      if (b.mlp.down.matmul != kNoId) OASES_RETURN_IF_ERROR(pin(g.node(b.mlp.down.matmul).outputs[0], l, base + " mlp down"));
    }
    for (const NormInfo& nrm : b.norms) {
      if (nrm.feeds != "attn" && nrm.feeds != "mlp") continue;
      const PartLayout& l = by_part[fmt::format("layer.{}.{}", b.index, nrm.feeds)];
      OASES_RETURN_IF_ERROR(pin(g.node(nrm.node).outputs[0], l, g.node(nrm.node).describe()));
    }
  }
  const PartLayout& emb = by_part["embedding"];
  const PartLayout& head = by_part["head"];
  for (const EmbeddingInfo& e : ms.embeddings) {
    if (e.role != "token" || emb.tp == 1) continue;
    if (e.rows % emb.tp != 0)
      return error("tp {} does not divide the vocabulary size {} of embedding '{}'", emb.tp, e.rows, g.value(e.weight).name);
    OASES_RETURN_IF_ERROR(set(e.weight, ShardingSpec::replicated(2).with_dim(0, axes[emb.tp].tp), "token embedding"));
    st.layers.push_back(LayerSplit{"token embedding", "vocabulary", {e.weight}});
    OASES_RETURN_IF_ERROR(pin(g.node(e.gather).outputs[0], emb, "token embedding"));
  }
  if (ms.tied_head && head.tp != emb.tp) {
    return error("the LM head is tied to the token embedding: both need one tp degree (embedding {}, head {})", emb.tp, head.tp);
  }
  if (!ms.tied_head && head.tp > 1) {
    if (ms.head.out_features % head.tp != 0)
      return error("tp {} does not divide the vocabulary size {} of the LM head", head.tp, ms.head.out_features);
    OASES_RETURN_IF_ERROR(set(ms.head.weight, linear_spec(g, ms.head, true, axes[head.tp].tp, 1), "LM head"));
    if (ms.head.bias != kNoId)
      OASES_RETURN_IF_ERROR(set(ms.head.bias, ShardingSpec::replicated(1).with_dim(0, axes[head.tp].tp), "LM head bias"));
    st.layers.push_back(LayerSplit{"LM head", "vocabulary", {ms.head.weight}});
  } else if (ms.tied_head && head.tp > 1) {
    st.layers.push_back(LayerSplit{"LM head (tied)", "vocabulary", {ms.head.weight}});
  }
  for (const NormInfo& nrm : ms.final_norms) OASES_RETURN_IF_ERROR(pin(g.node(nrm.node).outputs[0], head, g.node(nrm.node).describe()));

  // the value entering each part, and the layout markers between parts
  auto entry = [&](const std::string& part) -> Expected<ValueId> {
    if (part == "head") {
      if (!ms.final_norms.empty()) return g.node(ms.final_norms[0].node).inputs[0];
      return g.node(ms.head.matmul).inputs[0];
    }
    size_t d1 = part.find('.', 6);
    int b = std::atoi(part.substr(6, d1 - 6).c_str());
    std::string sub = part.substr(d1 + 1);
    for (const BlockInfo& bi : ms.blocks) {
      if (bi.index != b) continue;
      for (const NormInfo& nrm : bi.norms) {
        if (nrm.feeds == sub) return g.node(nrm.node).inputs[0];
      }
    }
    return error("{}: no norm before it; parts with different layouts enter each part through its norm", part);
  };
  auto dims_of = [&](const PartLayout& l, size_t rank) {
    std::vector<int64_t> d(rank, -1);
    if (rank >= 1) d[0] = axes[l.tp].dp;
    if (rank == 3 && l.sequence_parallel && l.tp > 1) d[1] = axes[l.tp].tp;
    return d;
  };
  for (size_t i = 1; i < parts.size(); ++i) {
    const PartLayout& prev = layouts[i - 1];
    const PartLayout& cur = layouts[i];
    if (prev.tp == cur.tp && prev.sequence_parallel == cur.sequence_parallel) continue;
    OASES_ASSIGN_OR_RETURN(ValueId x, entry(parts[i]));
    const Value xv = g.value(x);
    std::vector<Use> readers = xv.uses;
    AttrMap a;
    a.set_string("mesh", mesh.to_string());
    a.set_ints("dims", dims_of(cur, xv.shape.size()));
    a.set_ints("grad_dims", dims_of(prev, xv.shape.size()));
    ValueId y = g.add_value(g.unique_name(xv.name + "/layout"), xv.dtype, xv.shape, true);
    NodeId n = g.add_node("Layout", {x}, {y}, a, g.unique_name(parts[i] + "/layout"), kOasesDomain);
    g.node(n).scope = parts[i] == "head" ? "head" : parts[i];
    for (const Use& u : readers) g.set_input(u.node, u.slot, y);
    if (g.is_output(x)) return error("{}: the value entering the part is a graph output", parts[i]);
    if (cur.sequence_parallel && cur.tp > 1) {
      Status ok = ShardingSpec::replicated(3).with_dim(0, axes[cur.tp].dp).with_dim(1, axes[cur.tp].tp).validate(xv.shape, mesh);
      if (xv.shape.size() == 3 && !ok.is_ok()) return error("{}: sequence parallelism: {}", parts[i], ok.message());
    }
  }
  st.part_layouts = layouts;
  std::vector<std::string> text;
  for (const PartLayout& l : layouts)
    text.push_back(fmt::format("{}:tp{}{}{}", l.part, l.tp, l.sequence_parallel ? "+sp" : "", l.collective_matmul ? "+cm" : ""));
  st.layers.push_back(LayerSplit{fmt::format("parts {}", fmt::join(text, " ")), "per-part", {}});
  select_collective_matmuls(layouts, &st);
  return st;
}

Status split_batch_inputs_by_part(const Graph& train, const std::vector<PartLayout>& layouts, Strategy* s,
                                  const std::map<ValueId, std::vector<ValueId>>& chunks) {
  std::set<int64_t> degrees;
  for (const PartLayout& l : layouts) degrees.insert(l.tp);
  std::map<int64_t, PartAxes> axes;
  OASES_ASSIGN_OR_RETURN(Mesh mesh, mesh_for_degrees(s->mesh.size(), degrees, &axes));
  if (!(mesh == s->mesh)) return error("the strategy's mesh {} is not the layouts' {}", s->mesh.to_string(), mesh.to_string());
  std::map<std::string, int64_t> tp_of;
  for (const PartLayout& l : layouts) tp_of[l.part] = l.tp;
  for (ValueId v : train.inputs()) {
    const Value& val = train.value(v);
    if (val.shape.empty()) continue;
    std::vector<ValueId> carriers = batch_carriers(v, chunks);
    for (ValueId c : carriers) {
      const Value& cv = train.value(c);
      std::set<std::string> parts = reader_parts(train, c);
      if (parts.size() != 1 || !tp_of.count(*parts.begin())) {
        return error("input '{}' is read by {} parts; parts with different layouts need each batch input read by one", val.name,
                     parts.size());
      }
      int dp = axes[tp_of[*parts.begin()]].dp;
      if (dp < 0) continue;
      int64_t n = s->mesh.axis_size(dp);
      if (cv.shape.empty() || cv.shape[0] % n != 0)
        return error("{} data-parallel ranks of part {} do not divide the batch size {} of input '{}'{}", n, *parts.begin(),
                     cv.shape.empty() ? 0 : cv.shape[0], val.name, c == v ? "" : " in each micro-batch chunk");
      // (a chunk's slice is made by a node: a pin, not a seed, fixes its spec)
      (c == v ? s->specs : s->pins)[c] = ShardingSpec::replicated(cv.shape.size()).with_dim(0, dp);
    }
    if (carriers.front() != v) s->specs[v] = ShardingSpec::replicated(val.shape.size());
  }
  return Status::ok();
}

std::string part_of_scope(const std::string& scope) {
  if (scope == "embedding") return "embedding";
  if (scope == "head" || scope == "final_norm" || scope == "loss") return "head";
  if (scope.rfind("layer.", 0) != 0) return "";
  size_t dot = scope.find('.', 6);
  if (dot == std::string::npos) return "";
  std::string layer = scope.substr(0, dot);
  std::string rest = scope.substr(dot + 1);
  if (rest.rfind("attn", 0) == 0) return layer + ".attn";
  if (rest.rfind("mlp", 0) == 0) return layer + ".mlp";
  return "";
}

}  // namespace oases
