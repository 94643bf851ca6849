#include "graph/blocks.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <map>
#include <set>

#include "graph/op_registry.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

bool is_param(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  return val.is_initializer && is_floating(val.dtype);
}

// The parameter v is, or the one a Cast makes it from (a mixed-precision training graph reads
// its fp32 parameters through a Cast to bf16 or fp16); else kNoId.
ValueId param_or_cast(const Graph& g, ValueId v) {
  if (v == kNoId) return kNoId;
  if (is_param(g, v)) return v;
  NodeId p = g.value(v).producer;
  if (p == kNoId) return kNoId;
  const Node& c = g.node(p);
  if (c.op_type != "Cast" || !is_default_domain(c.domain) || c.inputs.empty() || !is_param(g, c.inputs[0])) return kNoId;
  return c.inputs[0];
}

bool is_norm(const Node& n) {
  return op_has_trait(n, kTraitNorm);
}

bool is_matmul(const Node& n) {
  return op_has_trait(n, kTraitLinear);
}

// MlpInfo::kind of an activation: its op type in lower case ("gelu", "relu", "silu", "swiglu"),
// "gelu_tanh" for Gelu's tanh approximation.
std::string activation_kind(const Node& n) {
  std::string kind = n.op_type;
  for (char& ch : kind) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (kind == "gelu" && n.attrs.get_string("approximate", "none") == "tanh") kind = "gelu_tanh";
  return kind;
}

// Walks backwards from v, stopping at norms and linear layers; collects the linear layers met.
void linears_behind(const Graph& g, ValueId v, std::vector<NodeId>* found, int max_nodes = 64) {
  std::vector<ValueId> stack{v};
  std::set<ValueId> seen;
  int visited = 0;
  while (!stack.empty() && visited < max_nodes) {
    ValueId cur = stack.back();
    stack.pop_back();
    if (!seen.insert(cur).second) continue;
    NodeId p = g.value(cur).producer;
    if (p == kNoId) continue;
    const Node& n = g.node(p);
    ++visited;
    if (is_norm(n)) continue;
    if (is_matmul(n)) {
      LinearInfo li;
      if (match_linear(g, p, &li)) {
        if (std::find(found->begin(), found->end(), p) == found->end()) found->push_back(p);
        continue;
      }
    }
    if (n.op_type == "Attention" && n.domain == kOasesDomain) continue;
    for (ValueId in : n.inputs) {
      if (in != kNoId && !g.value(in).is_constant()) stack.push_back(in);
    }
  }
}

// First linear layer reached forwards from v through data-movement and elementwise ops.
NodeId linear_ahead(const Graph& g, ValueId v, int max_depth = 12) {
  std::vector<std::pair<ValueId, int>> queue{{v, 0}};
  std::set<ValueId> seen;
  for (size_t i = 0; i < queue.size(); ++i) {
    auto [cur, depth] = queue[i];
    if (!seen.insert(cur).second || depth > max_depth) continue;
    for (const Use& u : g.uses(cur)) {
      const Node& n = g.node(u.node);
      if (is_matmul(n)) {
        LinearInfo li;
        if (match_linear(g, n.id, &li) && u.slot == 0) return n.id;
        continue;
      }
      if (is_norm(n) || (n.op_type == "Attention" && n.domain == kOasesDomain)) continue;
      for (ValueId o : n.outputs) {
        if (o != kNoId) queue.push_back({o, depth + 1});
      }
    }
  }
  return kNoId;
}

// A fused q/k/v projection whose output is viewed as [.., H, 3, D]: each head's q, k and v side
// by side (Bloom), so whole heads are contiguous columns.
bool fused_per_head(const Graph& g, const LinearInfo& l, int64_t heads, int64_t head_dim) {
  ValueId out = g.node(l.bias_add != kNoId ? l.bias_add : l.matmul).outputs[0];
  const auto& uses = g.uses(out);
  if (uses.size() != 1) return false;
  const Node& r = g.node(uses[0].node);
  if (r.op_type != "Reshape" || !is_default_domain(r.domain)) return false;
  const Shape& s = g.value(r.outputs[0]).shape;
  return s.size() == 5 && s[2] == heads && s[3] == 3 && s[4] == head_dim;
}

// The ALiBi slopes behind an attention's mask input: a constant float tensor of `heads` elements
// (one dimension of that size) multiplied into the bias a few ops before the mask.
ValueId alibi_slopes_behind(const Graph& g, ValueId mask, int64_t heads, int* dim) {
  std::vector<std::pair<ValueId, int>> stack{{mask, 0}};
  std::set<ValueId> seen;
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!seen.insert(v).second || depth > 8) continue;
    NodeId p = g.value(v).producer;
    if (p == kNoId) continue;
    const Node& n = g.node(p);
    for (ValueId in : n.inputs) {
      if (in == kNoId) continue;
      const Value& c = g.value(in);
      if (n.op_type == "Mul" && c.is_constant() && c.dtype == DType::kF32 && c.numel() == heads && heads > 1) {
        for (size_t d = 0; d < c.shape.size(); ++d) {
          if (c.shape[d] == heads) {
            *dim = static_cast<int>(d);
            return in;
          }
        }
      }
      if (!c.is_constant()) stack.push_back({in, depth + 1});
    }
  }
  return kNoId;
}

}  // namespace

bool match_linear(const Graph& g, NodeId mm, LinearInfo* out) {
  const Node& n = g.node(mm);
  if (!is_matmul(n) || n.inputs.size() < 2) return false;
  LinearInfo li;
  li.matmul = mm;
  ValueId w = n.inputs[1];
  if (n.op_type == "Gemm") {
    if (n.attrs.get_int("transA", 0)) return false;
    li.transposed = n.attrs.get_int("transB", 0) != 0;
  }
  if (param_or_cast(g, w) != kNoId) {
    w = param_or_cast(g, w);
  } else {
    NodeId p = g.value(w).producer;
    if (p == kNoId) return false;
    const Node& t = g.node(p);
    if (t.op_type != "Transpose" || !is_default_domain(t.domain) || param_or_cast(g, t.inputs[0]) == kNoId) return false;
    if (t.attrs.get_ints("perm") != std::vector<int64_t>{1, 0}) return false;
    li.transpose = p;
    li.transposed = !li.transposed;
    w = param_or_cast(g, t.inputs[0]);
  }
  const Shape& ws = g.value(w).shape;
  if (ws.size() != 2) return false;
  li.weight = w;
  li.in_features = li.transposed ? ws[1] : ws[0];
  li.out_features = li.transposed ? ws[0] : ws[1];
  if (n.op_type == "Gemm" && n.has_input(2) && param_or_cast(g, n.inputs[2]) != kNoId) {
    li.bias = param_or_cast(g, n.inputs[2]);
    li.bias_add = mm;
  } else {
    const auto& uses = g.uses(n.outputs[0]);
    if (uses.size() == 1) {
      const Node& a = g.node(uses[0].node);
      if (a.op_type == "Add" && is_default_domain(a.domain)) {
        ValueId b = a.inputs[0] == n.outputs[0] ? a.inputs[1] : a.inputs[0];
        if (param_or_cast(g, b) != kNoId && g.value(b).shape == Shape{li.out_features}) {
          li.bias = param_or_cast(g, b);
          li.bias_add = a.id;
        }
      }
    }
  }
  *out = li;
  return true;
}

ModelStructure find_transformer_structure(const Graph& g) {
  ModelStructure ms;
  auto order_or = g.topo_order();
  if (!order_or) return ms;
  const std::vector<NodeId>& order = *order_or;
  std::map<NodeId, size_t> pos;
  for (size_t i = 0; i < order.size(); ++i) pos[order[i]] = i;

  // embeddings
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.op_type == "Gather" && is_default_domain(n.domain) && is_param(g, n.inputs[0]) && g.value(n.inputs[0]).shape.size() == 2 &&
        n.attrs.get_int("axis", 0) == 0) {
      EmbeddingInfo e;
      e.gather = id;
      e.weight = n.inputs[0];
      e.rows = g.value(e.weight).shape[0];
      e.dim = g.value(e.weight).shape[1];
      e.role = g.value(n.inputs[1]).is_input ? "token" : "position";
      ms.embeddings.push_back(e);
    }
  }
  // a model with several input-fed gathers: the one with the most rows holds the tokens
  if (!ms.embeddings.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < ms.embeddings.size(); ++i) {
      if (ms.embeddings[i].rows > ms.embeddings[best].rows) best = i;
    }
    for (size_t i = 0; i < ms.embeddings.size(); ++i) {
      ms.embeddings[i].role = i == best ? "token" : (ms.embeddings[i].role == "token" ? "other" : ms.embeddings[i].role);
    }
    ms.vocab = ms.embeddings[best].rows;
    ms.hidden = ms.embeddings[best].dim;
  }

  // attention blocks
  std::vector<NodeId> attns;
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.op_type == "Attention" && n.domain == kOasesDomain) attns.push_back(id);
  }
  std::set<NodeId> used_linears;
  for (size_t b = 0; b < attns.size(); ++b) {
    BlockInfo bi;
    bi.index = static_cast<int>(b);
    bi.has_attn = true;
    const Node& a = g.node(attns[b]);
    AttentionInfo& ai = bi.attn;
    ai.attention = a.id;
    ai.causal = a.attrs.get_int("causal", 0) != 0;
    const Shape& q = g.value(a.inputs[0]).shape;
    const Shape& k = g.value(a.inputs[1]).shape;
    ai.heads = q[1];
    ai.kv_heads = k[1];
    ai.head_dim = q[3];
    std::vector<NodeId> lin;
    for (int i = 0; i < 3; ++i) linears_behind(g, a.inputs[i], &lin);
    std::sort(lin.begin(), lin.end(), [&](NodeId x, NodeId y) { return pos[x] < pos[y]; });
    for (NodeId l : lin) {
      LinearInfo li;
      match_linear(g, l, &li);
      ai.qkv.push_back(li);
      used_linears.insert(l);
    }
    if (ai.qkv.size() == 1) ai.qkv_per_head = fused_per_head(g, ai.qkv[0], ai.heads, ai.head_dim);
    if (a.has_input(3)) ai.alibi_slopes = alibi_slopes_behind(g, a.inputs[3], ai.heads, &ai.alibi_heads_dim);
    NodeId o = linear_ahead(g, a.outputs[0]);
    if (o != kNoId) {
      match_linear(g, o, &ai.out);
      used_linears.insert(o);
    }
    ms.blocks.push_back(bi);
  }

  // MLPs: activations between linear layers, assigned to the block whose attention precedes them
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (!op_has_trait(n, kTraitActivation)) continue;
    std::string kind = activation_kind(n);
    MlpInfo mi;
    mi.activation = id;
    mi.kind = kind;
    std::vector<NodeId> lin;
    for (ValueId in : n.inputs) linears_behind(g, in, &lin);
    if (lin.empty()) continue;
    std::sort(lin.begin(), lin.end(), [&](NodeId x, NodeId y) { return pos[x] < pos[y]; });
    if (kind == "swiglu") {
      // gate first: the linear feeding input 0
      std::vector<NodeId> gate;
      linears_behind(g, n.inputs[0], &gate);
      if (gate.size() == 1 && lin.size() == 2 && lin[0] != gate[0]) std::swap(lin[0], lin[1]);
    }
    bool clash = false;
    for (NodeId l : lin) clash |= used_linears.count(l) > 0;
    if (clash) continue;
    for (NodeId l : lin) {
      LinearInfo li;
      match_linear(g, l, &li);
      mi.up.push_back(li);
    }
    NodeId d = linear_ahead(g, n.outputs[0]);
    if (d == kNoId || used_linears.count(d)) continue;
    match_linear(g, d, &mi.down);
    for (NodeId l : lin) used_linears.insert(l);
    used_linears.insert(d);
    // owning block: the attention that reads the same input (attention and MLP side by side on
    // one norm, as GPT-J, GPT-NeoX and Phi do), else the last attention before the activation
    int owner = -1;
    for (size_t b = 0; b < attns.size(); ++b) {
      if (pos[attns[b]] < pos[id]) owner = static_cast<int>(b);
    }
    auto activation_input = [&](const LinearInfo& l) {
      const Node& mm = g.node(l.matmul);
      for (ValueId v : mm.inputs) {
        if (v != kNoId && v != l.weight && !g.value(v).is_constant()) return v;
      }
      return kNoId;
    };
    // the residual stream a projection reads: its input, or the input of the norm that made it
    // (GPT-NeoX and Falcon give the side-by-side attention and MLP a norm each on one residual)
    auto stream_input = [&](ValueId v) {
      if (v == kNoId || g.value(v).producer == kNoId) return v;
      const Node& p = g.node(g.value(v).producer);
      return is_norm(p) && p.has_input(0) ? p.inputs[0] : v;
    };
    for (size_t b = 0; b < ms.blocks.size() && b < attns.size(); ++b) {
      if (!ms.blocks[b].has_attn || ms.blocks[b].has_mlp) continue;
      bool shared = false;
      for (const LinearInfo& q : ms.blocks[b].attn.qkv) {
        for (const LinearInfo& u : mi.up) {
          ValueId a = activation_input(q), m = activation_input(u);
          shared |= a != kNoId && (a == m || stream_input(a) == stream_input(m));
        }
      }
      if (shared) {
        owner = static_cast<int>(b);
        break;
      }
    }
    if (owner < 0) {
      BlockInfo bi;
      bi.index = static_cast<int>(ms.blocks.size());
      ms.blocks.push_back(bi);
      owner = bi.index;
    }
    if (ms.blocks[owner].has_mlp) {  // an MLP-only block (no attention before it in this block)
      BlockInfo bi;
      bi.index = static_cast<int>(ms.blocks.size());
      ms.blocks.push_back(bi);
      owner = bi.index;
    }
    ms.blocks[owner].mlp = mi;
    ms.blocks[owner].has_mlp = true;
  }

  // norms: to the block owning the first projection after them (the norm's reader), else final
  // (position of a q/k/v or up projection, block * 2 + sub-layer)
  std::vector<std::pair<size_t, int>> inputs_of_blocks;
  for (size_t b = 0; b < ms.blocks.size(); ++b) {
    const BlockInfo& bl = ms.blocks[b];
    if (bl.has_attn) {
      for (const auto& l : bl.attn.qkv) inputs_of_blocks.push_back({pos[l.matmul], static_cast<int>(2 * b)});
    }
    if (bl.has_mlp) {
      for (const auto& l : bl.mlp.up) inputs_of_blocks.push_back({pos[l.matmul], static_cast<int>(2 * b + 1)});
    }
  }
  std::sort(inputs_of_blocks.begin(), inputs_of_blocks.end());
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (!is_norm(n)) continue;
    NormInfo ni;
    ni.node = id;
    ni.kind = n.op_type == "LayerNormalization" ? "layernorm" : "rmsnorm";
    ni.scale = n.inputs[1];
    ni.bias = n.has_input(2) ? n.inputs[2] : kNoId;
    auto it = std::upper_bound(inputs_of_blocks.begin(), inputs_of_blocks.end(), std::make_pair(pos[id], INT_MAX));
    if (it != inputs_of_blocks.end()) {
      ni.feeds = it->second % 2 == 0 ? "attn" : "mlp";
      ms.blocks[static_cast<size_t>(it->second / 2)].norms.push_back(ni);
    } else {
      ms.final_norms.push_back(ni);
    }
  }

  // LM head: a linear layer after the last block whose output width is the vocabulary
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& n = g.node(*it);
    if (!is_matmul(n) || used_linears.count(*it)) continue;
    LinearInfo li;
    if (!match_linear(g, *it, &li)) continue;
    if (ms.vocab > 0 && li.out_features != ms.vocab) continue;
    ms.has_head = true;
    ms.head = li;
    for (const auto& e : ms.embeddings) {
      if (e.role == "token" && e.weight == li.weight) ms.tied_head = true;
    }
    if (ms.vocab == 0) ms.vocab = li.out_features;
    if (ms.hidden == 0) ms.hidden = li.in_features;
    break;
  }
  return ms;
}

namespace {

class FindBlocksPass : public Pass {
 public:
  std::string name() const override { return "find-transformer-blocks"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    ModelStructure ms = find_transformer_structure(g);
    auto tag = [&](NodeId n, const std::string& scope) {
      if (n != kNoId && g.alive(n)) g.node(n).scope = scope;
    };
    auto tag_linear = [&](const LinearInfo& l, const std::string& scope) {
      tag(l.matmul, scope);
      tag(l.transpose, scope);
      tag(l.bias_add, scope);
    };
    int attn = 0, mlp = 0;
    for (const BlockInfo& b : ms.blocks) {
      std::string base = fmt::format("layer.{}", b.index);
      if (b.has_attn) {
        ++attn;
        tag(b.attn.attention, base + ".attn");
        for (const auto& l : b.attn.qkv) tag_linear(l, base + ".attn");
        tag_linear(b.attn.out, base + ".attn");
      }
      if (b.has_mlp) {
        ++mlp;
        tag(b.mlp.activation, base + ".mlp");
        for (const auto& l : b.mlp.up) tag_linear(l, base + ".mlp");
        tag_linear(b.mlp.down, base + ".mlp");
      }
      for (size_t i = 0; i < b.norms.size(); ++i) tag(b.norms[i].node, fmt::format("{}.{}.norm{}", base, b.norms[i].feeds, i + 1));
    }
    for (const auto& e : ms.embeddings) tag(e.gather, "embedding");
    for (const auto& nrm : ms.final_norms) tag(nrm.node, "final_norm");
    if (ms.has_head) tag_linear(ms.head, "head");
    rep.count = static_cast<int>(ms.blocks.size());
    rep.found = fmt::format("{} transformer blocks ({} attention, {} MLP), {} embeddings, {}", ms.blocks.size(), attn, mlp,
                            ms.embeddings.size(), ms.has_head ? (ms.tied_head ? "tied LM head" : "LM head") : "no LM head");
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_find_blocks_pass() {
  return std::make_unique<FindBlocksPass>();
}

int block_of_scope(const std::string& scope) {
  if (scope.rfind("layer.", 0) != 0) return -1;
  return std::atoi(scope.c_str() + 6);
}

}  // namespace oases
