#include "planner/collective_matmul.h"

#include "graph/autodiff.h"
#include "graph/op_registry.h"
#include "planner/hybrid.h"

namespace oases {

namespace {

// A product a · W whose rows (every dimension of a but the last) pass to the output: MatMul, or
// MatMulT without a transposed a, with a 2-D W.
bool row_product(const Graph& g, const Node& n) {
  bool mm = n.domain.empty() && n.op_type == "MatMul";
  bool mmt = n.domain == kOasesDomain && n.op_type == "MatMulT" && n.attrs.get_int("trans_a", 0) == 0;
  if (!(mm || mmt) || n.num_inputs() != 2 || !n.has_input(0) || !n.has_input(1)) return false;
  return g.value(n.inputs[0]).shape.size() >= 2 && g.value(n.inputs[1]).shape.size() == 2;
}

class Decomposer {
 public:
  Decomposer(Graph& g, std::vector<ShardingSpec>* specs, const std::function<bool(const std::string&)>& selected)
      : g_(g), specs_(specs), selected_(selected) {}

  Status run(CollectiveMatmulReport* rep) {
    rep_ = rep;
    for (NodeId id : g_.nodes()) {
      if (!g_.alive(id)) continue;
      const Node& n = g_.node(id);
      if (n.domain != kOasesDomain || n.attrs.get_int("segments", 1) != 1 || n.attrs.get_int("group_size", 1) < 2) continue;
      // (a rewrite removes the node: decide on a copy of its type)
      const std::string op = n.op_type;
      if (op == "AllGather") {
        OASES_RETURN_IF_ERROR(gather(id));
      } else if (op == "ReduceScatter") {
        OASES_RETURN_IF_ERROR(scatter(id));
      }
    }
    return Status::ok();
  }

 private:
  bool wanted(const Node& product, const Node& coll) {
    std::string part = part_of_scope(product.scope);
    if (part.empty()) part = part_of_scope(coll.scope);
    return !part.empty() && selected_(part);
  }

  // A new node like `like` (scope, phase, chunk, origin, opset), its one output shaped by its rule.
  Expected<ValueId> add(const std::string& op, const std::vector<ValueId>& ins, AttrMap attrs, const std::string& domain, const Node& like,
                        const std::string& base, ValueId spec_of, int ring_step = -1) {
    if (ring_step >= 0) attrs.set_int("ring_step", ring_step);
    NodeId id = g_.add_node_new_outputs(op, ins, 1, std::move(attrs), g_.unique_name(base), domain);
    Node& n = g_.node(id);
    n.scope = like.scope;
    n.phase = like.phase;
    n.chunk = like.chunk;
    n.origin = like.origin;
    n.opset = domain == like.domain ? like.opset : domain.empty() ? static_cast<int>(g_.default_opset()) : 1;
    OASES_RETURN_IF_ERROR(infer_node(g_, id));
    ValueId out = g_.node(id).outputs[0];
    if (specs_) {
      specs_->resize(g_.num_values());
      (*specs_)[static_cast<size_t>(out)] = (*specs_)[static_cast<size_t>(spec_of)];
    }
    return out;
  }

  AttrMap group_attrs(const Node& coll) {
    AttrMap a;
    a.set_int("mesh_axis", coll.attrs.get_int("mesh_axis", 0));
    a.set_int("group_size", coll.attrs.get_int("group_size", 1));
    return a;
  }

  // all-gather → products: every product reading the gathered value (as its rows) runs per ring step
  Status gather(NodeId ag) {
    const Node coll = g_.node(ag);
    ValueId x = coll.inputs[0], full = coll.outputs[0];
    int64_t n = coll.attrs.get_int("group_size", 1), d = coll.attrs.get_int("dim", 0);
    std::vector<Use> products;
    for (const Use& u : g_.uses(full)) {
      const Node& p = g_.node(u.node);
      if (u.slot == 0 && row_product(g_, p) && d < static_cast<int64_t>(g_.value(full).shape.size()) - 1 && wanted(p, coll))
        products.push_back(u);
    }
    if (products.empty()) return Status::ok();
    // the transfers belong to the part of the products (a backward gather has no scope of its own)
    Node like = coll;
    if (part_of_scope(like.scope).empty()) like.scope = g_.node(products[0].node).scope;
    std::vector<ValueId> parts{x};
    for (int64_t s = 1; s < n; ++s) {
      AttrMap a = group_attrs(coll);
      a.set_int("shift", 1);
      OASES_ASSIGN_OR_RETURN(ValueId v, add("RingShift", {parts.back()}, a, kOasesDomain, like, coll.name + "/ring_shift", x));
      parts.push_back(v);
      ++rep_->shifts;
    }
    AttrMap assemble = group_attrs(coll);
    assemble.set_int("dim", d);
    for (const Use& u : products) {
      const Node p = g_.node(u.node);
      std::vector<ValueId> ys;
      for (int64_t s = 0; s < n; ++s) {
        OASES_ASSIGN_OR_RETURN(ValueId y, add(p.op_type, {parts[static_cast<size_t>(s)], p.inputs[1]}, p.attrs, p.domain, p,
                                              p.name + "/ring" + std::to_string(s), p.outputs[0]));
        ys.push_back(y);
      }
      OASES_ASSIGN_OR_RETURN(ValueId y, add("RingAssemble", ys, assemble, kOasesDomain, p, p.name + "/ring_assemble", p.outputs[0]));
      g_.replace_all_uses(p.outputs[0], y);
      g_.remove_node(u.node);
      ++rep_->products;
    }
    if (!g_.uses(full).empty() || g_.is_output(full)) {
      OASES_ASSIGN_OR_RETURN(ValueId whole, add("RingAssemble", parts, assemble, kOasesDomain, coll, coll.name + "/ring_assemble", full));
      g_.replace_all_uses(full, whole);
    }
    g_.remove_node(ag);
    ++rep_->gathers;
    return Status::ok();
  }

  // The products summed into v (a MatMul, or an Add of such sums, each value read only by the sum).
  bool sum_of_products(ValueId v, int64_t d, std::vector<NodeId>* products, std::vector<NodeId>* adds) {
    NodeId p = g_.producer(v);
    if (p == kNoId || g_.is_output(v)) return false;
    const Node& n = g_.node(p);
    if (row_product(g_, n)) {
      if (d >= static_cast<int64_t>(g_.value(n.inputs[0]).shape.size()) - 1) return false;
      products->push_back(p);
      return true;
    }
    if (n.domain.empty() && n.op_type == "Add" && n.num_inputs() == 2) {
      for (ValueId in : n.inputs) {
        if (g_.value(in).shape != g_.value(v).shape || g_.uses(in).size() != 1) return false;
        if (!sum_of_products(in, d, products, adds)) return false;
      }
      adds->push_back(p);
      return true;
    }
    return false;
  }

  // products (+ sums) → reduce-scatter: rank r computes part (r + n-1-s) mod n at step s and adds it
  // to the running sum the previous rank passed on
  Status scatter(NodeId rs) {
    const Node coll = g_.node(rs);
    ValueId sum = coll.inputs[0], out = coll.outputs[0];
    int64_t n = coll.attrs.get_int("group_size", 1), d = coll.attrs.get_int("dim", 0);
    if (g_.uses(sum).size() != 1) return Status::ok();
    std::vector<NodeId> products, adds;
    if (!sum_of_products(sum, d, &products, &adds)) return Status::ok();
    for (NodeId p : products) {
      if (!wanted(g_.node(p), coll)) return Status::ok();
    }
    Node like = coll;
    if (part_of_scope(like.scope).empty()) like.scope = g_.node(products[0]).scope;
    ValueId acc = kNoId;
    for (int64_t s = 0; s < n; ++s) {
      int step = static_cast<int>(s);
      ValueId part = kNoId;
      for (NodeId pid : products) {
        const Node p = g_.node(pid);
        AttrMap a = group_attrs(coll);
        a.set_int("dim", d);
        a.set_int("segments", 1);
        a.set_int("offset", n - 1 - s);
        OASES_ASSIGN_OR_RETURN(ValueId rows, add("ShardSlice", {p.inputs[0]}, a, kOasesDomain, p, p.name + "/ring_rows", out, step));
        OASES_ASSIGN_OR_RETURN(ValueId y, add(p.op_type, {rows, p.inputs[1]}, p.attrs, p.domain, p, p.name + "/ring" + std::to_string(s), out,
                                              step));
        if (part == kNoId) {
          part = y;
        } else {
          OASES_ASSIGN_OR_RETURN(part, add("Add", {part, y}, {}, "", p, p.name + "/ring_sum", out, step));
        }
      }
      if (acc == kNoId) {
        acc = part;
        continue;
      }
      AttrMap a = group_attrs(coll);
      a.set_int("shift", 1);
      OASES_ASSIGN_OR_RETURN(ValueId passed, add("RingShift", {acc}, a, kOasesDomain, like, coll.name + "/ring_shift", out));
      ++rep_->shifts;
      OASES_ASSIGN_OR_RETURN(acc, add("Add", {passed, part}, {}, "", like, coll.name + "/ring_acc", out, step));
    }
    g_.replace_all_uses(out, acc);
    g_.remove_node(rs);
    for (auto it = adds.rbegin(); it != adds.rend(); ++it) g_.remove_node(*it);
    for (NodeId p : products) g_.remove_node(p);
    rep_->products += static_cast<int>(products.size());
    ++rep_->scatters;
    return Status::ok();
  }

  Graph& g_;
  std::vector<ShardingSpec>* specs_;
  const std::function<bool(const std::string&)>& selected_;
  CollectiveMatmulReport* rep_ = nullptr;
};

}  // namespace

Expected<CollectiveMatmulReport> decompose_collective_matmuls(Graph& g, std::vector<ShardingSpec>* specs,
                                                              const std::function<bool(const std::string& part)>& selected) {
  CollectiveMatmulReport rep;
  OASES_RETURN_IF_ERROR(Decomposer(g, specs, selected).run(&rep));
  OASES_RETURN_IF_ERROR(g.validate());
  return rep;
}

}  // namespace oases
