// Fuses scaled-dot-product attention as exporters write it into oases.Attention:
//   S = MatMul(q·c1, kᵀ·c2) [· c | / c] [+ additive mask] [Where(keep, S, -big)]  →  P = Softmax(S)
//   O = MatMul(P, v)
// A constant mask equal to the causal (lower-triangular) pattern becomes causal=1; any other mask
// (additive float or boolean keep-mask) is passed as the fourth input. Scalar factors on q, k and
// the scores multiply into `scale`. Keys and values whose heads were repeated for grouped-query
// attention (LLaMA's repeat_kv: Unsqueeze → Expand → Reshape; for kᵀ also through the flattened
// transpose the dynamo exporter writes) are read before the repeat, so the fused node has k, v
// [B, Hkv, T, D] with Hkv < H, whichever exporter wrote the model.
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

// The kv heads repeated to the query heads: Expand(Unsqueeze(x, axis 2), [B, Hkv, rep, T, D]) with
// x [B, Hkv, T, D]. Returns x and writes the Expand's output shape, or kNoId.
ValueId repeated_heads(const Graph& g, ValueId expanded, Shape* es_out) {
  const Node* e = producer_if(g, expanded, "Expand");
  if (!e) return kNoId;
  const Node* u = producer_if(g, e->inputs[0], "Unsqueeze");
  if (!u) return kNoId;
  std::vector<int64_t> axes = u->attrs.get_ints("axes");
  if (axes.size() != 1 || (axes[0] != 2 && axes[0] != -3)) return kNoId;
  ValueId x = u->inputs[0];
  const Shape &xs = g.value(x).shape, &es = g.value(e->outputs[0]).shape;
  if (xs.size() != 4 || es.size() != 5) return kNoId;
  if (es[0] != xs[0] || es[1] != xs[1] || es[3] != xs[2] || es[4] != xs[3] || es[2] < 1) return kNoId;
  *es_out = es;
  return x;
}

// Grouped-query attention as LLaMA's repeat_kv writes it: the repeat above, then Reshape to
// [B, Hkv·rep, T, D]. Returns x [B, Hkv, T, D] and the repeat count, or kNoId when v is not such a repeat.
ValueId unrepeat_kv(const Graph& g, ValueId v, int64_t* rep) {
  const Node* r = producer_if(g, v, "Reshape");
  if (!r) return kNoId;
  Shape es;
  ValueId x = repeated_heads(g, r->inputs[0], &es);
  if (x == kNoId) return kNoId;
  const Shape &xs = g.value(x).shape, &rs = g.value(v).shape;
  if (rs != Shape{xs[0], xs[1] * es[2], xs[2], xs[3]}) return kNoId;
  if (g.value(x).dtype != g.value(v).dtype) return kNoId;
  *rep = es[2];
  return x;
}

// The same repeat read through kᵀ as torch's dynamo exporter writes it: the repeated keys
// [B, Hkv, rep, T, D] flattened to [B·Hkv·rep, T, D], Transpose(0, 2, 1), Reshape to [B, H, D, T].
// Returns x [B, Hkv, T, D] and the repeat count, or kNoId.
ValueId unrepeat_kv_transposed(const Graph& g, ValueId kt, int64_t* rep) {
  const Node* r2 = producer_if(g, kt, "Reshape");
  if (!r2) return kNoId;
  const Node* t = producer_if(g, r2->inputs[0], "Transpose");
  if (!t || t->attrs.get_ints("perm") != std::vector<int64_t>{0, 2, 1}) return kNoId;
  const Node* r1 = producer_if(g, t->inputs[0], "Reshape");
  if (!r1) return kNoId;
  Shape es;
  ValueId x = repeated_heads(g, r1->inputs[0], &es);
  if (x == kNoId) return kNoId;
  const Shape &xs = g.value(x).shape, &fs = g.value(r1->outputs[0]).shape, &ks = g.value(kt).shape;
  if (fs != Shape{xs[0] * xs[1] * es[2], xs[2], xs[3]}) return kNoId;
  if (ks != Shape{xs[0], xs[1] * es[2], xs[3], xs[2]}) return kNoId;
  if (g.value(x).dtype != g.value(kt).dtype) return kNoId;
  *rep = es[2];
  return x;
}

// A value passed through ops that leave it unchanged (Cast to its own type, Identity, · 1).
ValueId through_no_ops(const Graph& g, ValueId v) {
  for (int steps = 0; steps < 4; ++steps) {
    NodeId p = g.value(v).producer;
    if (p == kNoId) break;
    const Node& n = g.node(p);
    if (!is_default_domain(n.domain)) break;
    if ((n.op_type == "Cast" || n.op_type == "Identity") && g.value(n.inputs[0]).dtype == g.value(v).dtype) {
      v = n.inputs[0];
    } else if (n.op_type == "Mul" && is_scalar_near(g, n.inputs[1], 1.0, 0.0)) {
      v = n.inputs[0];
    } else if (n.op_type == "Mul" && is_scalar_near(g, n.inputs[0], 1.0, 0.0)) {
      v = n.inputs[1];
    } else {
      break;
    }
  }
  return v;
}

// x [B·H, T, D] as Reshape(x4 [B, H, T, D]): x4, or kNoId.
ValueId unflatten_heads(const Graph& g, ValueId v, int64_t b, int64_t h) {
  const Node* r = producer_if(g, v, "Reshape");
  if (!r) return kNoId;
  const Shape &xs = g.value(r->inputs[0]).shape, &vs = g.value(v).shape;
  if (xs.size() != 4 || vs.size() != 3 || xs[0] != b || xs[1] != h || xs[0] * xs[1] != vs[0] || xs[2] != vs[1] || xs[3] != vs[2]) {
    return kNoId;
  }
  return r->inputs[0];
}

// Bloom's ALiBi term [B·H, 1|Tq, Tk] (per-head slopes times key positions, laid out for baddbmm)
// viewed as [B, H, 1|Tq, Tk]: made from the [B, H, ..] tensor it was flattened from when there
// is one, so that a split of the heads reaches it (the slopes split, not the whole bias sliced).
ValueId alibi_by_heads(Graph& g, ValueId term, int64_t b, int64_t h, const std::string& base) {
  const Shape ts = g.value(term).shape;
  const Shape want{b, h, ts[1], ts[2]};
  ValueId src = term;
  if (const Node* r = producer_if(g, through_no_ops(g, term), "Reshape")) {
    const Shape& xs = g.value(r->inputs[0]).shape;
    if (xs.size() >= 2 && xs[0] == b && xs[1] == h && shape_numel(xs) == shape_numel(ts) && g.value(r->inputs[0]).dtype == DType::kF32) {
      src = r->inputs[0];
    }
  }
  if (g.value(src).shape == want) return src;
  ValueId out = g.add_value(g.unique_name(base + "_alibi"), DType::kF32, want, true);
  g.add_node("Reshape", {src, g.add_constant(base + "_alibi_shape", Tensor::from_int64(want, {4}))}, {out}, {},
             g.unique_name(base + "_alibi_by_heads"));
  return out;
}

class FuseAttentionPass : public Pass {
 public:
  std::string name() const override { return "fuse-attention"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep;
    rep.pass = name();
    int n_causal = 0, n_masked = 0, n_alibi = 0;
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
      ValueId v = kNoId, out = kNoId;
      if (pv && pv->op_type == "Reshape" && is_default_domain(pv->domain) &&
          g.value(pv->outputs[0]).shape == Shape{ss[0] * ss[1], ss[2], ss[3]}) {
        // Bloom (bmm): Reshape(MatMul(Reshape(P, [B·H, Tq, Tk]), v [B·H, Tk, Dv]), [B, H, Tq, Dv])
        const Node* mm = sole_consumer(g, pv->outputs[0]);
        if (!mm || mm->op_type != "MatMul" || !is_default_domain(mm->domain) || mm->inputs[0] != pv->outputs[0]) continue;
        const Node* back = sole_consumer(g, mm->outputs[0]);
        v = unflatten_heads(g, mm->inputs[1], ss[0], ss[1]);
        if (!back || back->op_type != "Reshape" || !is_default_domain(back->domain) || v == kNoId) continue;
        if (g.value(back->outputs[0]).shape != Shape{ss[0], ss[1], ss[2], g.value(v).shape[3]}) continue;
        out = back->outputs[0];
      } else {
        if (!pv || pv->op_type != "MatMul" || !is_default_domain(pv->domain) || pv->inputs[0] != probs) continue;
        v = pv->inputs[1];
        out = pv->outputs[0];
      }
      int64_t tq = ss[2], tk = ss[3];

      double scale = 1.0;
      bool causal = false, ok = true;
      ValueId mask = kNoId;
      // Bloom (baddbmm): scores on [B·H, Tq, Tk] with the ALiBi term added, viewed as [B, H, Tq, Tk]
      bool flat = false;
      ValueId alibi = kNoId;
      Shape cur = ss;
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
        } else if (p.op_type == "Reshape" && !flat) {
          const Shape& fs = g.value(p.inputs[0]).shape;
          flat = fs == Shape{ss[0] * ss[1], tq, tk};
          ok = flat;
          cur = fs;
          s = p.inputs[0];
        } else if (p.op_type == "Add" && flat) {
          // the ALiBi term [B·H, 1|Tq, Tk], added before any scale of the scores
          int si = g.value(p.inputs[0]).shape == cur ? 0 : 1;
          ValueId m = p.inputs[1 - si];
          const Shape& ms = g.value(m).shape;
          if (g.value(p.inputs[si]).shape != cur || alibi != kNoId || scale != 1.0 || ms.size() != 3 || ms[0] != cur[0] || ms[2] != tk ||
              (ms[1] != 1 && ms[1] != tq) || g.value(m).dtype != DType::kF32 || g.value(m).is_constant() || reads_learned(m)) {
            ok = false;
          } else {
            alibi = m;
          }
          s = p.inputs[si];
        } else if (flat && p.op_type != "Mul" && p.op_type != "Div") {
          ok = false;
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
      std::string base = sm.name;
      ValueId q = qk->inputs[0], kt = qk->inputs[1], k = kNoId;
      if (flat) {
        // q [B·H, Tq, D] = Reshape(q4); kᵀ [B·H, D, Tk] = Transpose(Reshape(k4 [B, H, Tk, D]), 0 2 1)
        const Node* t = producer_if(g, kt, "Transpose");
        q = unflatten_heads(g, q, ss[0], ss[1]);
        k = t && t->attrs.get_ints("perm") == std::vector<int64_t>{0, 2, 1} ? unflatten_heads(g, t->inputs[0], ss[0], ss[1]) : kNoId;
        if (q == kNoId || k == kNoId || alibi == kNoId || mask_keep_inverted) continue;
        if (mask != kNoId && g.value(mask).dtype != DType::kF32) continue;
        const Shape &qs = g.value(q).shape, &ks = g.value(k).shape, &vs = g.value(v).shape;
        if (vs.size() != 4 || qs[3] != ks[3] || ks[2] != vs[2] || ks[1] != vs[1] || qs[0] != vs[0] || qs[1] % vs[1] != 0) continue;
        if (g.value(q).dtype != DType::kF32 || g.value(k).dtype != DType::kF32 || g.value(v).dtype != DType::kF32) continue;
        // the ALiBi bias joins the additive mask: [B, H, 1, Tk] + [B|1, 1, Tq, Tk]
        ValueId bias = alibi_by_heads(g, alibi, ss[0], ss[1], base);
        if (mask != kNoId) {
          auto sum_shape = broadcast_shapes(g.value(bias).shape, g.value(mask).shape);
          if (!sum_shape || !broadcasts_to(*sum_shape, ss)) continue;
          ValueId both = g.add_value(g.unique_name(base + "_alibi_mask"), DType::kF32, *sum_shape, true);
          g.add_node("Add", {bias, mask}, {both}, {}, g.unique_name(base + "_alibi_plus_mask"));
          bias = both;
        }
        mask = bias;
        ++n_alibi;
      } else {
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
        // grouped-query attention: read k and v before their heads were repeated (kᵀ = Transpose(k))
        if (const Node* t = producer_if(g, kt, "Transpose"); t && t->attrs.get_ints("perm") == std::vector<int64_t>{0, 1, 3, 2}) {
          int64_t rep_k = 0, rep_v = 0;
          ValueId k0 = unrepeat_kv(g, t->inputs[0], &rep_k), v0 = unrepeat_kv(g, v, &rep_v);
          if (k0 != kNoId && v0 != kNoId && rep_k == rep_v) {
            k = k0;
            v = v0;
          }
        }
        if (k == kNoId) {
          int64_t rep_k = 0, rep_v = 0;
          ValueId k0 = unrepeat_kv_transposed(g, kt, &rep_k), v0 = unrepeat_kv(g, v, &rep_v);
          if (k0 != kNoId && v0 != kNoId && rep_k == rep_v) {
            k = k0;
            v = v0;
          }
        }
        if (k == kNoId) {
          k = g.add_value(g.unique_name(base + "_k"), DType::kF32, {kts[0], kts[1], kts[3], kts[2]}, true);
          g.add_node("Transpose", {kt}, {k}, AttrMap{{"perm", Attribute::of_ints({0, 1, 3, 2})}}, g.unique_name(base + "_kT"));
        }
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
      g.add_node("Attention", ins, {out}, a, g.unique_name(base + "_attention"), kOasesDomain);
      ++rep.count;
    }
    rep.changed = rep.count > 0;
    rep.found = fmt::format("fused {} attention ({} causal, {} with a mask input, {} with ALiBi)", rep.count, n_causal, n_masked, n_alibi);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_attention_pass() {
  return std::make_unique<FuseAttentionPass>();
}

}  // namespace oases
