// Fuses scaled-dot-product attention as exporters write it into oases.Attention:
//   S = MatMul(q·c1, kᵀ·c2) [· c | / c] [+ additive mask] [Where(keep, S, -big)]  →  P = Softmax(S)
//   O = MatMul(P, v)
// A constant mask equal to the causal (lower-triangular) pattern becomes causal=1; any other mask
// (additive float or boolean keep-mask) is passed as the fourth input. Scalar factors on q, k and
// the scores multiply into `scale`. Keys and values whose heads were repeated for grouped-query
// attention (LLaMA's repeat_kv: Unsqueeze → Expand → Reshape) are read before the repeat, so the
// fused node has k, v [B, Hkv, T, D] with Hkv < H.
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "graph/op_registry.h"
#include "graph/parameters.h"
#include "graph/passes/pass.h"
#include "graph/passes/pattern.h"

namespace oases {

using namespace pattern;

namespace {

constexpr double kVeryNegative = -1e4;

// Is the constant `v` (bool keep-mask, or additive float mask when `additive`) the causal pattern
// for scores [.., tq, tk] (query i sees keys j <= i + tk - tq)?
bool is_causal_constant(const Graph& g, ValueId v, int64_t tq, int64_t tk, bool additive) {
  const Value& val = g.value(v);
  if (!val.is_constant() || val.shape.size() < 2) return false;
  const Shape& s = val.shape;
  if (s[s.size() - 2] != tq || s[s.size() - 1] != tk) return false;
  if (val.numel() > (int64_t{1} << 26) || tq == 0 || tk == 0) return false;  // empty scores: nothing to recognise
  int64_t mats = val.numel() / (tq * tk);
  // reads the elements in their own type: a 1024 x 1024 mask checked in every one of 96 layers
  // would otherwise convert (and allocate) 8 MiB of doubles each time
  auto check = [&](auto typed) {
    using T = decltype(typed);
    const T* d = val.constant.data<T>();
    for (int64_t m = 0; m < mats; ++m) {
      for (int64_t i = 0; i < tq; ++i) {
        const T* row = d + (m * tq + i) * tk;
        for (int64_t j = 0; j < tk; ++j) {
          bool allowed = j <= i + tk - tq;
          double x = static_cast<double>(row[j]);
          if (additive) {
            if (allowed ? x != 0.0 : !(x <= kVeryNegative)) return false;
          } else if ((x != 0.0) != allowed) {
            return false;
          }
        }
      }
    }
    return true;
  };
  switch (val.constant.dtype()) {
    case DType::kBool:
    case DType::kU8: return check(uint8_t{});
    case DType::kF32: return check(float{});
    case DType::kF64: return check(double{});
    case DType::kI64: return check(int64_t{});
    case DType::kI32: return check(int32_t{});
    default: break;
  }
  std::vector<double> d = val.constant.to_double();
  for (int64_t m = 0; m < mats; ++m) {
    for (int64_t i = 0; i < tq; ++i) {
      for (int64_t j = 0; j < tk; ++j) {
        bool allowed = j <= i + tk - tq;
        double x = d[static_cast<size_t>((m * tq + i) * tk + j)];
        if (additive) {
          if (allowed ? x != 0.0 : !(x <= kVeryNegative)) return false;
        } else if ((x != 0.0) != allowed) {
          return false;
        }
      }
    }
  }
  return true;
}

bool broadcasts_to(const Shape& s, const Shape& target) {
  auto b = broadcast_shapes(s, target);
  return b && *b == target;
}

// PyTorch's exporters write scaled_dot_product_attention's guard for rows that see no key (all
// -inf scores: Softmax gives NaN) as Where(IsNaN(P), 0, P). oases.Attention gives such rows 0, so the
// guard fuses with it. Returns the guarded probabilities when `p` is read only by that guard.
ValueId nan_guarded(const Graph& g, ValueId p) {
  if (g.is_output(p)) return kNoId;
  const auto& readers = g.uses(p);
  if (readers.size() != 2) return kNoId;
  const Node* isnan = nullptr;
  const Node* where = nullptr;
  for (const auto& r : readers) {
    const Node& n = g.node(r.node);
    if (!is_default_domain(n.domain)) return kNoId;
    if (n.op_type == "IsNaN") isnan = &n;
    if (n.op_type == "Where") where = &n;
  }
  if (!isnan || !where || isnan->inputs[0] != p || where->inputs.size() != 3) return kNoId;
  if (where->inputs[0] != isnan->outputs[0] || where->inputs[2] != p || !is_scalar_near(g, where->inputs[1], 0.0, 0.0)) return kNoId;
  if (sole_consumer(g, isnan->outputs[0]) != where) return kNoId;
  if (g.value(where->outputs[0]).shape != g.value(p).shape) return kNoId;
  return where->outputs[0];
}

// Grouped-query attention as LLaMA's repeat_kv writes it: the kv heads repeated to the query
// heads by Reshape(Expand(Unsqueeze(x, axis 2), [B, Hkv, rep, T, D]), [B, Hkv·rep, T, D]).
// Returns x [B, Hkv, T, D] and the repeat count, or kNoId when v is not such a repeat.
ValueId unrepeat_kv(const Graph& g, ValueId v, int64_t* rep) {
  const Node* r = producer_if(g, v, "Reshape");
  if (!r) return kNoId;
  const Node* e = producer_if(g, r->inputs[0], "Expand");
  if (!e) return kNoId;
  const Node* u = producer_if(g, e->inputs[0], "Unsqueeze");
  if (!u) return kNoId;
  std::vector<int64_t> axes = u->attrs.get_ints("axes");
  if (axes.size() != 1 || (axes[0] != 2 && axes[0] != -3)) return kNoId;
  ValueId x = u->inputs[0];
  const Shape &xs = g.value(x).shape, &es = g.value(e->outputs[0]).shape, &rs = g.value(v).shape;
  if (xs.size() != 4 || es.size() != 5 || rs.size() != 4) return kNoId;
  if (es[0] != xs[0] || es[1] != xs[1] || es[3] != xs[2] || es[4] != xs[3] || es[2] < 1) return kNoId;
  if (rs != Shape{xs[0], xs[1] * es[2], xs[2], xs[3]}) return kNoId;
  if (g.value(x).dtype != g.value(v).dtype) return kNoId;
  *rep = es[2];
  return x;
}

class FuseAttentionPass : public Pass {
 public:
  std::string name() const override { return "fuse-attention"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep;
    rep.pass = name();
    int n_causal = 0, n_masked = 0;
    // one mask constant often serves every layer: check each (storage, window, form) once
    std::map<std::tuple<const void*, int64_t, int64_t, int64_t, bool>, bool> causal_memo;
    auto is_causal = [&](ValueId m, int64_t tq, int64_t tk, bool additive) {
      const Value& val = g.value(m);
      if (!val.is_constant()) return false;
      auto key = std::make_tuple(val.constant.raw(), val.numel(), tq, tk, additive);
      auto it = causal_memo.find(key);
      if (it == causal_memo.end()) it = causal_memo.emplace(key, is_causal_constant(g, m, tq, tk, additive)).first;
      return it->second;
    };
    // An additive term computed from a trained table (T5's relative position bias, read by a
    // Gather) is not a mask: the fused op takes no gradient for its mask, so the table would never
    // train. Such attention stays unfused (graph/parameters.h decides what is trained).
    std::set<ValueId> learned;
    for (const InitializerRole& r : classify_initializers(g)) {
      if (r.trainable) learned.insert(r.value);
    }
    auto reads_learned = [&](ValueId m) {
      std::vector<ValueId> stack{m};
      std::set<ValueId> seen{m};
      while (!stack.empty()) {
        ValueId x = stack.back();
        stack.pop_back();
        if (learned.count(x)) return true;
        NodeId p = g.value(x).producer;
        if (p == kNoId) continue;
        for (ValueId in : g.node(p).inputs) {
          if (in != kNoId && seen.insert(in).second) stack.push_back(in);
        }
      }
      return false;
    };
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& sm = g.node(id);
      if (sm.op_type != "Softmax" || !is_default_domain(sm.domain)) continue;
      const Shape& ss = g.value(sm.inputs[0]).shape;
      if (ss.size() != 4 || sm.attrs.get_int("axis", -1) != 3) continue;
      if (g.value(sm.inputs[0]).dtype != DType::kF32) continue;
      ValueId probs = sm.outputs[0];
      if (ValueId guarded = nan_guarded(g, probs); guarded != kNoId) probs = guarded;
      const Node* pv = sole_consumer(g, probs);
      if (!pv || pv->op_type != "MatMul" || !is_default_domain(pv->domain) || pv->inputs[0] != probs) continue;
      ValueId v = pv->inputs[1];
      int64_t tq = ss[2], tk = ss[3];

      double scale = 1.0;
      bool causal = false, ok = true;
      ValueId mask = kNoId;
      bool mask_keep_inverted = false;  // mask is a "fill where true" bool that needs a Not
      ValueId s = sm.inputs[0];
      const Node* qk = nullptr;
      for (int steps = 0; steps < 8 && ok; ++steps) {
        NodeId pid = g.value(s).producer;
        if (pid == kNoId) {
          ok = false;
          break;
        }
        const Node& p = g.node(pid);
        if (!is_default_domain(p.domain)) {
          ok = false;
        } else if (p.op_type == "MatMul") {
          qk = &p;
          break;
        } else if (p.op_type == "Mul") {
          int ci = scalar_constant(g, p.inputs[1]) ? 1 : (scalar_constant(g, p.inputs[0]) ? 0 : -1);
          if (ci < 0) {
            ok = false;
          } else {
            scale *= *scalar_constant(g, p.inputs[ci]);
            s = p.inputs[1 - ci];
          }
        } else if (p.op_type == "Div") {
          auto c = scalar_constant(g, p.inputs[1]);
          if (!c || *c == 0) {
            ok = false;
          } else {
            scale /= *c;
            s = p.inputs[0];
          }
        } else if (p.op_type == "Add") {
          int si = g.value(p.inputs[0]).shape == ss ? 0 : 1;
          ValueId m = p.inputs[1 - si];
          if (g.value(p.inputs[si]).shape != ss || !broadcasts_to(g.value(m).shape, ss)) {
            ok = false;
          } else if (is_causal(m, tq, tk, true) && !causal) {
            causal = true;
          } else if (mask == kNoId && g.value(m).dtype == DType::kF32 && !reads_learned(m)) {
            mask = m;
          } else {
            ok = false;
          }
          s = p.inputs[si];
        } else if (p.op_type == "Where") {
          ValueId cond = p.inputs[0], a = p.inputs[1], b = p.inputs[2];
          auto cb = scalar_constant(g, b), ca = scalar_constant(g, a);
          bool keep_form = cb && *cb <= kVeryNegative && g.value(a).shape == ss;  // Where(keep, S, -big)
          bool fill_form = ca && *ca <= kVeryNegative && g.value(b).shape == ss;  // Where(masked, -big, S)
          if ((!keep_form && !fill_form) || !broadcasts_to(g.value(cond).shape, ss)) {
            ok = false;
          } else if (keep_form && is_causal(cond, tq, tk, false) && !causal) {
            causal = true;
          } else if (mask == kNoId) {
            mask = cond;
            mask_keep_inverted = fill_form;
          } else {
            ok = false;
          }
          s = keep_form ? a : b;
        } else {
          ok = false;
        }
      }
      if (!ok || !qk) continue;
      ValueId q = qk->inputs[0], kt = qk->inputs[1];
      if (const Node* m = producer_if(g, q, "Mul")) {
        for (int i = 0; i < 2; ++i) {
          if (auto c = scalar_constant(g, m->inputs[1 - i]); c && g.value(m->inputs[i]).shape == g.value(q).shape) {
            scale *= *c;
            q = m->inputs[i];
            break;
          }
        }
      }
      if (const Node* m = producer_if(g, kt, "Mul")) {
        for (int i = 0; i < 2; ++i) {
          if (auto c = scalar_constant(g, m->inputs[1 - i]); c && g.value(m->inputs[i]).shape == g.value(kt).shape) {
            scale *= *c;
            kt = m->inputs[i];
            break;
          }
        }
      }
      const Shape &qs = g.value(q).shape, &kts = g.value(kt).shape, &vs = g.value(v).shape;
      if (qs.size() != 4 || kts.size() != 4 || vs.size() != 4) continue;
      if (qs[3] != kts[2] || kts[3] != vs[2] || qs[0] != vs[0] || kts[1] != vs[1] || qs[1] % vs[1] != 0) continue;
      if (g.value(q).dtype != DType::kF32 || g.value(v).dtype != DType::kF32) continue;
      std::string base = sm.name;
      // grouped-query attention: read k and v before their heads were repeated (kᵀ = Transpose(k))
      ValueId k = kNoId;
      if (const Node* t = producer_if(g, kt, "Transpose"); t && t->attrs.get_ints("perm") == std::vector<int64_t>{0, 1, 3, 2}) {
        int64_t rep_k = 0, rep_v = 0;
        ValueId k0 = unrepeat_kv(g, t->inputs[0], &rep_k), v0 = unrepeat_kv(g, v, &rep_v);
        if (k0 != kNoId && v0 != kNoId && rep_k == rep_v) {
          k = k0;
          v = v0;
        }
      }
      if (k == kNoId) {
        k = g.add_value(g.unique_name(base + "_k"), DType::kF32, {kts[0], kts[1], kts[3], kts[2]}, true);
        g.add_node("Transpose", {kt}, {k}, AttrMap{{"perm", Attribute::of_ints({0, 1, 3, 2})}}, g.unique_name(base + "_kT"));
      }
      std::vector<ValueId> ins{q, k, v};
      if (mask != kNoId) {
        if (mask_keep_inverted) {
          ValueId keep = g.add_value(g.unique_name(base + "_keep"), DType::kBool, g.value(mask).shape, true);
          g.add_node("Not", {mask}, {keep}, {}, g.unique_name(base + "_not"));
          mask = keep;
        }
        ins.push_back(mask);
        ++n_masked;
      }
      if (causal) ++n_causal;
      AttrMap a{{"causal", Attribute::of_int(causal ? 1 : 0)}, {"scale", Attribute::of_float(static_cast<float>(scale))}};
      g.add_node("Attention", ins, {pv->outputs[0]}, a, g.unique_name(base + "_attention"), kOasesDomain);
      ++rep.count;
    }
    rep.changed = rep.count > 0;
    rep.found = fmt::format("fused {} attention ({} causal, {} with a mask input)", rep.count, n_causal, n_masked);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_attention_pass() {
  return std::make_unique<FuseAttentionPass>();
}

}  // namespace oases
