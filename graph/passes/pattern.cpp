#include "graph/passes/pattern.h"

#include <algorithm>
#include <cmath>

#include "graph/op_registry.h"

namespace oases::pattern {

const Node* producer_if(const Graph& g, ValueId v, const std::string& op, const std::string& domain) {
  if (v == kNoId) return nullptr;
  NodeId p = g.value(v).producer;
  if (p == kNoId || !g.alive(p)) return nullptr;
  const Node& n = g.node(p);
  bool dom_ok = domain.empty() ? is_default_domain(n.domain) : n.domain == domain;
  return n.op_type == op && dom_ok ? &n : nullptr;
}

const Node* sole_consumer(const Graph& g, ValueId v) {
  if (v == kNoId || g.is_output(v)) return nullptr;
  const auto& u = g.uses(v);
  if (u.size() != 1) return nullptr;
  return &g.node(u[0].node);
}

std::optional<double> scalar_constant(const Graph& g, ValueId v) {
  if (v == kNoId) return std::nullopt;
  const Value& val = g.value(v);
  if (!val.is_constant() || val.numel() < 1 || val.numel() > 4096) return std::nullopt;
  std::vector<double> d = val.constant.to_double();
  for (double x : d) {
    if (x != d[0] && !(std::isnan(x) && std::isnan(d[0]))) return std::nullopt;
  }
  return d[0];
}

bool is_scalar_near(const Graph& g, ValueId v, double want, double rel_tol) {
  auto s = scalar_constant(g, v);
  if (!s) return false;
  return std::abs(*s - want) <= rel_tol * std::max(1.0, std::abs(want));
}

ValueId other_operand(const Node& n, ValueId known) {
  if (n.inputs.size() != 2) return kNoId;
  if (n.inputs[0] == known) return n.inputs[1];
  if (n.inputs[1] == known) return n.inputs[0];
  return kNoId;
}

bool uses_only_within(const Graph& g, ValueId v, const std::vector<NodeId>& nodes) {
  if (g.is_output(v)) return false;
  for (const Use& u : g.uses(v)) {
    if (std::find(nodes.begin(), nodes.end(), u.node) == nodes.end()) return false;
  }
  return true;
}

int trailing_reduce_count(const Graph& g, const Node& reduce) {
  int64_t rank = static_cast<int64_t>(g.value(reduce.inputs[0]).shape.size());
  std::vector<int64_t> axes = reduce.attrs.get_ints("axes");
  if (axes.empty()) return -1;
  std::vector<int64_t> norm;
  for (int64_t a : axes) norm.push_back(a < 0 ? a + rank : a);
  std::sort(norm.begin(), norm.end());
  for (size_t i = 0; i < norm.size(); ++i) {
    if (norm[i] != rank - static_cast<int64_t>(norm.size()) + static_cast<int64_t>(i)) return -1;
  }
  if (reduce.attrs.get_int("keepdims", 1) == 0) return -1;
  return static_cast<int>(norm.size());
}

}  // namespace oases::pattern
