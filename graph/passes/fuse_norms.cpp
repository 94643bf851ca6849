// Fuses the decompositions exporters write for LayerNorm (below opset 17, or hand-written) and
// RMSNorm (LLaMA) into LayerNormalization and oases.RMSNormalization.
//   LayerNorm: m = mean(x); d = x - m; v = mean(d²); n = d / sqrt(v + eps)  [or d · 1/sqrt(..)]
//              y = n · gamma + beta   (gamma, beta optional)
//   RMSNorm:   r = 1/sqrt(mean(x²) + eps); y = (x · r) · w   [or x / sqrt(..)]
#include "graph/op_registry.h"
#include "graph/passes/pass.h"
#include "graph/passes/pattern.h"

namespace oases {

using namespace pattern;

namespace {

// Consumers of v with op type `op` whose other operand is `other` (any position when commutative).
const Node* consumer_with(const Graph& g, ValueId v, const std::string& op, ValueId other, bool v_first_only) {
  for (const Use& u : g.uses(v)) {
    const Node& n = g.node(u.node);
    if (n.op_type != op || !is_default_domain(n.domain) || n.inputs.size() != 2) continue;
    if (v_first_only && u.slot != 0) continue;
    if (other == kNoId || other_operand(n, v) == other) return &n;
  }
  return nullptr;
}

// A sole Mul/Div consumer applying a scale or an Add applying a bias of the normalised shape.
ValueId affine_operand(const Graph& g, ValueId v, const std::string& op, int k) {
  const Node* n = sole_consumer(g, v);
  if (!n || n->op_type != op || !is_default_domain(n->domain) || n->inputs.size() != 2) return kNoId;
  ValueId o = other_operand(*n, v);
  if (o == kNoId || o == v) return kNoId;
  const Shape& vs = g.value(v).shape;
  const Shape& os = g.value(o).shape;
  if (static_cast<int>(os.size()) > k) {
    for (size_t i = 0; i + k < os.size(); ++i) {
      if (os[i] != 1) return kNoId;
    }
  }
  Shape norm(vs.end() - k, vs.end());
  Shape tail(os.size() > static_cast<size_t>(k) ? os.end() - k : os.begin(), os.end());
  auto b = broadcast_shapes(tail, norm);
  if (!b || *b != norm) return kNoId;
  if (g.value(o).dtype != g.value(v).dtype) return kNoId;
  return o;
}

// Reshapes a parameter of shape [1, .., 1, C] to [C] for the fused op's scale/bias slot.
ValueId squeeze_leading(Graph& g, ValueId v, int k, const std::string& name) {
  const Shape& s = g.value(v).shape;
  if (static_cast<int>(s.size()) <= k) return v;
  Shape t(s.end() - k, s.end());
  ValueId out = g.add_value(g.unique_name(name), g.value(v).dtype, t, true);
  g.add_node("Reshape", {v}, {out}, AttrMap{{"shape", Attribute::of_ints(t)}}, g.unique_name(name + "_reshape"));
  return out;
}

ValueId ones_like_norm(Graph& g, const Shape& norm, DType dt, const std::string& name) {
  Tensor t(DType::kF32, norm);
  float* p = t.mutable_data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 1.f;
  return g.add_constant(name, dt == DType::kF32 ? t : t.cast(dt));
}

// Follows "d / sqrt(v + eps)" or "d * reciprocal(sqrt(v + eps))" from the variance value.
// Returns the normalised output (consumer of d) and eps.
bool match_rsqrt_scale(const Graph& g, ValueId var, ValueId d, ValueId* normed, double* eps) {
  const Node* add = sole_consumer(g, var);
  if (!add || add->op_type != "Add") return false;
  auto e = scalar_constant(g, other_operand(*add, var));
  if (!e || *e < 0 || *e > 1e-1) return false;
  const Node* sq = sole_consumer(g, add->outputs[0]);
  if (!sq || sq->op_type != "Sqrt") return false;
  ValueId s = sq->outputs[0];
  if (const Node* div = consumer_with(g, s, "Div", d, false); div && div->inputs[0] == d && div->inputs[1] == s) {
    *normed = div->outputs[0];
    *eps = *e;
    return true;
  }
  const Node* rec = sole_consumer(g, s);
  ValueId r = kNoId;
  if (rec && rec->op_type == "Reciprocal") {
    r = rec->outputs[0];
  } else if (rec && rec->op_type == "Div" && rec->inputs[1] == s && is_scalar_near(g, rec->inputs[0], 1.0, 1e-6)) {
    r = rec->outputs[0];
  }
  if (r == kNoId) return false;
  if (const Node* mul = consumer_with(g, r, "Mul", d, false)) {
    *normed = mul->outputs[0];
    *eps = *e;
    return true;
  }
  return false;
}

// Square of v: Pow(v, 2) or Mul(v, v) consuming v.
ValueId square_of(const Graph& g, ValueId v) {
  for (const Use& u : g.uses(v)) {
    const Node& n = g.node(u.node);
    if (!is_default_domain(n.domain)) continue;
    if (n.op_type == "Pow" && n.inputs[0] == v && is_scalar_near(g, n.inputs[1], 2.0, 1e-9)) return n.outputs[0];
    if (n.op_type == "Mul" && n.inputs[0] == v && n.inputs[1] == v) return n.outputs[0];
  }
  return kNoId;
}

// Attaches the fused node as producer of `final_out`, keeping its name (a graph output keeps its).
void emit_fused(Graph& g, const std::string& op, const std::string& domain, std::vector<ValueId> ins, ValueId final_out, AttrMap attrs,
                const std::string& name) {
  g.add_node(op, ins, {final_out}, std::move(attrs), g.unique_name(name), domain);
}

class FuseLayerNormPass : public Pass {
 public:
  std::string name() const override { return "fuse-layernorm"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& r1 = g.node(id);
      if (r1.op_type != "ReduceMean" || !is_default_domain(r1.domain)) continue;
      int k = trailing_reduce_count(g, r1);
      if (k < 1) continue;
      ValueId x = r1.inputs[0], mean = r1.outputs[0];
      if (!is_floating(g.value(x).dtype)) continue;
      const Node* sub = consumer_with(g, mean, "Sub", x, false);
      if (!sub || sub->inputs[0] != x || sub->inputs[1] != mean) continue;
      ValueId d = sub->outputs[0];
      ValueId sq = square_of(g, d);
      if (sq == kNoId) continue;
      const Node* r2 = sole_consumer(g, sq);
      if (!r2 || r2->op_type != "ReduceMean" || trailing_reduce_count(g, *r2) != k) continue;
      ValueId normed;
      double eps;
      if (!match_rsqrt_scale(g, r2->outputs[0], d, &normed, &eps)) continue;
      ValueId out = normed, gamma = kNoId, beta = kNoId;
      if (ValueId s = affine_operand(g, out, "Mul", k); s != kNoId) {
        gamma = s;
        out = sole_consumer(g, out)->outputs[0];
        if (ValueId b = affine_operand(g, out, "Add", k); b != kNoId) {
          beta = b;
          out = sole_consumer(g, out)->outputs[0];
        }
      }
      const Shape& xs = g.value(x).shape;
      Shape norm(xs.end() - k, xs.end());
      DType dt = g.value(x).dtype;
      gamma = gamma == kNoId ? ones_like_norm(g, norm, dt, "ln_ones") : squeeze_leading(g, gamma, k, "ln_scale");
      std::vector<ValueId> ins{x, gamma};
      if (beta != kNoId) ins.push_back(squeeze_leading(g, beta, k, "ln_bias"));
      AttrMap a{{"axis", Attribute::of_int(-k)}, {"epsilon", Attribute::of_float(static_cast<float>(eps))}};
      emit_fused(g, "LayerNormalization", "", ins, out, a, r1.name + "_fused_layernorm");
      ++rep.count;
    }
    rep.changed = rep.count > 0;
    rep.found = fmt::format("fused {} LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div)", rep.count);
    return rep;
  }
};

class FuseRmsNormPass : public Pass {
 public:
  std::string name() const override { return "fuse-rmsnorm"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& r1 = g.node(id);
      if (r1.op_type != "ReduceMean" || !is_default_domain(r1.domain)) continue;
      int k = trailing_reduce_count(g, r1);
      if (k < 1) continue;
      // r1 reduces x² for some x
      ValueId sq = r1.inputs[0];
      ValueId x = kNoId;
      if (const Node* p = producer_if(g, sq, "Pow"); p && is_scalar_near(g, p->inputs[1], 2.0, 1e-9)) {
        x = p->inputs[0];
      } else if (const Node* m = producer_if(g, sq, "Mul"); m && m->inputs[0] == m->inputs[1]) {
        x = m->inputs[0];
      }
      if (x == kNoId || !is_floating(g.value(x).dtype)) continue;
      // not a LayerNorm's variance: x must not be a mean-subtracted value x = a - mean(a) (the
      // LayerNorm pass has fused those already; its decomposed nodes stay until dead-code removal)
      if (const Node* sub = producer_if(g, x, "Sub")) {
        const Node* mean = producer_if(g, sub->inputs[1], "ReduceMean");
        if (mean && mean->inputs[0] == sub->inputs[0]) continue;
      }
      ValueId normed;
      double eps;
      if (!match_rsqrt_scale(g, r1.outputs[0], x, &normed, &eps)) continue;
      ValueId out = normed, w = kNoId;
      if (ValueId s = affine_operand(g, out, "Mul", k); s != kNoId) {
        w = s;
        out = sole_consumer(g, out)->outputs[0];
      }
      const Shape& xs = g.value(x).shape;
      Shape norm(xs.end() - k, xs.end());
      DType dt = g.value(x).dtype;
      w = w == kNoId ? ones_like_norm(g, norm, dt, "rms_ones") : squeeze_leading(g, w, k, "rms_scale");
      AttrMap a{{"axis", Attribute::of_int(-k)}, {"epsilon", Attribute::of_float(static_cast<float>(eps))}};
      emit_fused(g, "RMSNormalization", kOasesDomain, {x, w}, out, a, r1.name + "_fused_rmsnorm");
      ++rep.count;
    }
    rep.changed = rep.count > 0;
    rep.found = fmt::format("fused {} RMSNorm (Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul)", rep.count);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_layernorm_pass() {
  return std::make_unique<FuseLayerNormPass>();
}
std::unique_ptr<Pass> make_fuse_rmsnorm_pass() {
  return std::make_unique<FuseRmsNormPass>();
}

}  // namespace oases
