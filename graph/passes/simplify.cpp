// Removes no-op nodes exporters leave and fusion needs gone: Identity, Cast to the same type,
// inference-mode Dropout (mask unused), Reshape/Expand to the same shape, and merges consecutive
// Transposes (dropping identity permutations).
#include "graph/op_registry.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

bool identity_perm(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

class SimplifyPass : public Pass {
 public:
  std::string name() const override { return "simplify"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    int removed = 0, merged = 0;
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      Node& n = g.node(id);
      if (!is_default_domain(n.domain) || n.inputs.empty() || n.inputs[0] == kNoId || n.outputs.empty()) continue;
      ValueId x = n.inputs[0], y = n.output(0);
      if (y == kNoId) continue;
      const Value& xv = g.value(x);
      const Value& yv = g.value(y);
      bool noop = false;
      if (n.op_type == "Identity") noop = true;
      if (n.op_type == "Cast" && xv.dtype == yv.dtype) noop = true;
      if ((n.op_type == "Reshape" || n.op_type == "Expand") && xv.shape == yv.shape && xv.dtype == yv.dtype) noop = true;
      if (n.op_type == "Dropout" && n.attrs.get_int("training_mode", 0) == 0 && !n.has_input(2)) {
        ValueId mask = n.output(1);
        noop = mask == kNoId || (g.uses(mask).empty() && !g.is_output(mask));
      }
      if (n.op_type == "Transpose" && identity_perm(n.attrs.get_ints("perm"))) noop = true;
      if (noop && !g.is_output(y)) {
        g.replace_all_uses(y, x);
        g.remove_node(id);
        ++removed;
        continue;
      }
      if (n.op_type == "Transpose") {
        NodeId p = xv.producer;
        if (p != kNoId && g.node(p).op_type == "Transpose" && is_default_domain(g.node(p).domain)) {
          // y = transpose(transpose(z, p1), p2) = transpose(z, p1[p2])
          std::vector<int64_t> p1 = g.node(p).attrs.get_ints("perm"), p2 = n.attrs.get_ints("perm"), comp;
          if (p1.size() != p2.size()) continue;
          for (int64_t a : p2) comp.push_back(p1[a]);
          g.set_input(id, 0, g.node(p).inputs[0]);
          n.attrs.set_ints("perm", comp);
          ++merged;
          if (identity_perm(comp) && !g.is_output(y)) {
            g.replace_all_uses(y, n.inputs[0]);
            g.remove_node(id);
            ++removed;
          }
        }
      }
    }
    rep.count = removed + merged;
    rep.changed = rep.count > 0;
    rep.found = fmt::format("{} no-op nodes removed, {} transpose pairs merged", removed, merged);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_simplify_pass() {
  return std::make_unique<SimplifyPass>();
}

}  // namespace oases
