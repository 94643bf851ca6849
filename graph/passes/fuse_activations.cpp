// Fuses activation decompositions:
//   GELU (erf):  0.5 · x · (1 + erf(x / √2))                         → Gelu
//   GELU (tanh): 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))  → Gelu(approximate="tanh")
//                (or Bloom's tanh(√(2/π) · x · (1 + 0.044715 · x²)), the same function)
//   SiLU:        x · sigmoid(x)                                      → oases.Silu
//   SwiGLU:      silu(gate) · up                                     → oases.SwiGLU
// The factors of "0.5 · x · (1 + f)" may come in any order exporters write them.
#include <cmath>

#include "graph/op_registry.h"
#include "graph/passes/pass.h"
#include "graph/passes/pattern.h"

namespace oases {

using namespace pattern;

namespace {

const Node* as_op(const Graph& g, const Node* n, const char* op) {
  return n && n->op_type == op && is_default_domain(n->domain) ? n : nullptr;
}

// Given one_plus = 1 + f(x), finds the value equal to 0.5 · x · one_plus.
ValueId match_half_x(const Graph& g, ValueId one_plus, ValueId x) {
  const Node* m1 = as_op(g, sole_consumer(g, one_plus), "Mul");
  if (!m1) return kNoId;
  ValueId other = other_operand(*m1, one_plus);
  // (a) (x · 0.5) · one_plus  or  (0.5 · x) · one_plus
  if (const Node* h = producer_if(g, other, "Mul")) {
    ValueId c = other_operand(*h, x);
    if (c != kNoId && is_scalar_near(g, c, 0.5)) return m1->outputs[0];
  }
  // (b) (x · one_plus) · 0.5
  if (other == x) {
    const Node* m2 = as_op(g, sole_consumer(g, m1->outputs[0]), "Mul");
    if (m2 && is_scalar_near(g, other_operand(*m2, m1->outputs[0]), 0.5)) return m2->outputs[0];
    // (b') 0.5 via Div by 2
    const Node* d2 = as_op(g, sole_consumer(g, m1->outputs[0]), "Div");
    if (d2 && d2->inputs[0] == m1->outputs[0] && is_scalar_near(g, d2->inputs[1], 2.0)) return d2->outputs[0];
  }
  // (c) x · (one_plus · 0.5)
  if (is_scalar_near(g, other, 0.5)) {
    const Node* m2 = as_op(g, sole_consumer(g, m1->outputs[0]), "Mul");
    if (m2 && other_operand(*m2, m1->outputs[0]) == x) return m2->outputs[0];
  }
  return kNoId;
}

ValueId add_one(const Graph& g, ValueId v) {
  const Node* a = as_op(g, sole_consumer(g, v), "Add");
  if (!a || !is_scalar_near(g, other_operand(*a, v), 1.0, 1e-6)) return kNoId;
  return a->outputs[0];
}

// x³ as Pow(x, 3) or x·x·x.
bool is_cube_of(const Graph& g, ValueId v, ValueId* x) {
  if (const Node* p = producer_if(g, v, "Pow"); p && is_scalar_near(g, p->inputs[1], 3.0, 1e-9)) {
    *x = p->inputs[0];
    return true;
  }
  if (const Node* m = producer_if(g, v, "Mul")) {
    for (int i = 0; i < 2; ++i) {
      if (const Node* sq = producer_if(g, m->inputs[i], "Mul"); sq && sq->inputs[0] == sq->inputs[1] && m->inputs[1 - i] == sq->inputs[0]) {
        *x = sq->inputs[0];
        return true;
      }
    }
  }
  return false;
}

// coef · x² as (x · coef) · x, (coef · x) · x, x · (x · coef) or (x · x) · coef.
bool is_scaled_square_of(const Graph& g, ValueId v, double coef, ValueId* x) {
  const Node* m = producer_if(g, v, "Mul");
  if (!m) return false;
  for (int i = 0; i < 2; ++i) {
    const Node* inner = producer_if(g, m->inputs[i], "Mul");
    if (!inner) continue;
    ValueId other = m->inputs[1 - i];
    for (int j = 0; j < 2; ++j) {
      if (inner->inputs[j] == other && is_scalar_near(g, inner->inputs[1 - j], coef)) {
        *x = other;
        return true;
      }
    }
    if (inner->inputs[0] == inner->inputs[1] && is_scalar_near(g, other, coef)) {
      *x = inner->inputs[0];
      return true;
    }
  }
  return false;
}

// Bloom's tanh argument: (√(2/π) · x) · (1 + 0.044715 · x²), the factors in either order.
ValueId bloom_tanh_argument_of(const Graph& g, const Node& m) {
  for (int i = 0; i < 2; ++i) {
    const Node* cx = producer_if(g, m.inputs[i], "Mul");
    const Node* one_plus = producer_if(g, m.inputs[1 - i], "Add");
    if (!cx || !one_plus) continue;
    for (int j = 0; j < 2; ++j) {
      if (!is_scalar_near(g, cx->inputs[1 - j], std::sqrt(2.0 / M_PI))) continue;
      ValueId x = cx->inputs[j];
      for (int k = 0; k < 2; ++k) {
        ValueId sq_x;
        if (is_scalar_near(g, one_plus->inputs[1 - k], 1.0, 1e-6) && is_scaled_square_of(g, one_plus->inputs[k], 0.044715, &sq_x) &&
            sq_x == x) {
          return x;
        }
      }
    }
  }
  return kNoId;
}

class FuseGeluPass : public Pass {
 public:
  std::string name() const override { return "fuse-gelu"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    int n_erf = 0, n_tanh = 0;
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& n = g.node(id);
      if (!is_default_domain(n.domain)) continue;
      if (n.op_type == "Erf") {
        // a = x / √2 or x · (1/√2)
        ValueId a = n.inputs[0], x = kNoId;
        if (const Node* d = producer_if(g, a, "Div"); d && is_scalar_near(g, d->inputs[1], std::sqrt(2.0))) x = d->inputs[0];
        if (const Node* m = producer_if(g, a, "Mul")) {
          for (int i = 0; i < 2; ++i) {
            if (is_scalar_near(g, m->inputs[1 - i], 1.0 / std::sqrt(2.0))) x = m->inputs[i];
          }
        }
        if (x == kNoId) continue;
        ValueId one_plus = add_one(g, n.outputs[0]);
        if (one_plus == kNoId) continue;
        ValueId out = match_half_x(g, one_plus, x);
        if (out == kNoId) continue;
        g.add_node("Gelu", {x}, {out}, AttrMap{{"approximate", Attribute::of_string("none")}}, g.unique_name(n.name + "_gelu"));
        ++n_erf;
      } else if (n.op_type == "Tanh") {
        // t = c · (x + 0.044715 · x³), c = √(2/π)
        const Node* m = producer_if(g, n.inputs[0], "Mul");
        if (!m) continue;
        if (ValueId xb = bloom_tanh_argument_of(g, *m); xb != kNoId) {
          ValueId one_plus = add_one(g, n.outputs[0]);
          ValueId out = one_plus == kNoId ? kNoId : match_half_x(g, one_plus, xb);
          if (out != kNoId) {
            g.add_node("Gelu", {xb}, {out}, AttrMap{{"approximate", Attribute::of_string("tanh")}}, g.unique_name(n.name + "_gelu"));
            ++n_tanh;
          }
          continue;
        }
        ValueId inner = kNoId;
        for (int i = 0; i < 2; ++i) {
          if (is_scalar_near(g, m->inputs[1 - i], std::sqrt(2.0 / M_PI))) inner = m->inputs[i];
        }
        const Node* add = producer_if(g, inner, "Add");
        if (!add) continue;
        ValueId x = kNoId;
        for (int i = 0; i < 2 && x == kNoId; ++i) {
          const Node* cm = producer_if(g, add->inputs[1 - i], "Mul");
          if (!cm) continue;
          for (int j = 0; j < 2; ++j) {
            ValueId cube_x;
            if (is_scalar_near(g, cm->inputs[1 - j], 0.044715) && is_cube_of(g, cm->inputs[j], &cube_x) && cube_x == add->inputs[i]) {
              x = cube_x;
            }
          }
        }
        if (x == kNoId) continue;
        ValueId one_plus = add_one(g, n.outputs[0]);
        if (one_plus == kNoId) continue;
        ValueId out = match_half_x(g, one_plus, x);
        if (out == kNoId) continue;
        g.add_node("Gelu", {x}, {out}, AttrMap{{"approximate", Attribute::of_string("tanh")}}, g.unique_name(n.name + "_gelu"));
        ++n_tanh;
      }
    }
    rep.count = n_erf + n_tanh;
    rep.changed = rep.count > 0;
    rep.found = fmt::format("fused {} GELU (erf form) and {} GELU (tanh form)", n_erf, n_tanh);
    return rep;
  }
};

class FuseSwiGluPass : public Pass {
 public:
  std::string name() const override { return "fuse-silu-swiglu"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    int n_silu = 0, n_swiglu = 0;
    // x · sigmoid(x) → Silu
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& n = g.node(id);
      if (n.op_type != "Sigmoid" || !is_default_domain(n.domain)) continue;
      ValueId x = n.inputs[0];
      for (const Use& u : g.uses(n.outputs[0])) {
        const Node& m = g.node(u.node);
        if (m.op_type == "Mul" && is_default_domain(m.domain) && other_operand(m, n.outputs[0]) == x) {
          g.add_node("Silu", {x}, {m.outputs[0]}, {}, g.unique_name(n.name + "_silu"), kOasesDomain);
          ++n_silu;
          break;
        }
      }
    }
    // Silu(gate) · up → SwiGLU
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& n = g.node(id);
      if (n.op_type != "Silu" || n.domain != kOasesDomain) continue;
      const Node* m = as_op(g, sole_consumer(g, n.outputs[0]), "Mul");
      if (!m) continue;
      ValueId up = other_operand(*m, n.outputs[0]);
      if (up == kNoId || g.value(up).shape != g.value(n.inputs[0]).shape) continue;
      g.add_node("SwiGLU", {n.inputs[0], up}, {m->outputs[0]}, {}, g.unique_name(n.name + "_swiglu"), kOasesDomain);
      ++n_swiglu;
    }
    rep.count = n_silu + n_swiglu;
    rep.changed = rep.count > 0;
    rep.found = fmt::format("fused {} SiLU and {} SwiGLU", n_silu, n_swiglu);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gelu_pass() {
  return std::make_unique<FuseGeluPass>();
}
std::unique_ptr<Pass> make_fuse_swiglu_pass() {
  return std::make_unique<FuseSwiGluPass>();
}

}  // namespace oases
