#include "graph/autodiff.h"

#include <algorithm>
#include <limits>
#include <set>

namespace oases {

Status infer_node(Graph& g, NodeId n) {
  const OpRegistry& reg = OpRegistry::global();
  Node& node = g.node(n);
  const OpSchema* s = reg.find(node.domain, node.op_type);
  if (!s) return error("{}: unsupported op", node.describe());
  InferContext c(g, n);
  if (s->normalize) OASES_RETURN_IF_ERROR(s->normalize(c));
  return s->infer(c);
}

void GradContext::add_grad(int i, ValueId grad) {
  if (!needs(i) || grad == kNoId) return;
  grad_in_[i].push_back(grad);
}

std::vector<ValueId> GradContext::op_n(const std::string& type, const std::vector<ValueId>& ins, int n, AttrMap attrs,
                                       const std::string& domain) {
  const Node& fwd = node();
  std::string base = g_.unique_name(fwd.name + "/grad/" + type);
  std::vector<ValueId> outs;
  for (int i = 0; i < n; ++i) outs.push_back(g_.add_value(g_.unique_name(base + "_out")));
  NodeId id = g_.add_node(type, ins, outs, std::move(attrs), base, domain);
  Node& nn = g_.node(id);
  const Node& f = node();
  nn.phase = Node::Phase::kBackward;
  nn.origin = f.id;
  nn.scope = f.scope;
  nn.chunk = f.chunk;
  nn.opset = f.opset;
  ++emitted_;
  Status s = infer_node(g_, id);
  if (!s.is_ok() && status_.is_ok()) status_ = s;
  return outs;
}

ValueId GradContext::op(const std::string& type, const std::vector<ValueId>& ins, AttrMap attrs, const std::string& domain) {
  return op_n(type, ins, 1, std::move(attrs), domain)[0];
}

ValueId GradContext::scalar(double v, DType dt) {
  Tensor t(dt, {});
  store_from_double(t.raw_mutable(), dt, 0, v);
  return g_.add_constant("grad_const", t);
}

ValueId GradContext::zeros(const Shape& s, DType dt) {
  AttrMap a;
  Tensor v(dt, {1});
  a.set("value", Attribute::of_tensor(v));
  a.set_ints("shape", s);
  return op("ConstantOfShape", {}, a);
}

ValueId GradContext::unbroadcast(ValueId grad, const Shape& to) {
  const Shape& from = shape(grad);
  if (from == to) return grad;
  std::vector<int64_t> axes;
  size_t lead = from.size() - to.size();
  for (size_t i = 0; i < from.size(); ++i) {
    if (i < lead || (to[i - lead] == 1 && from[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  }
  ValueId r = grad;
  if (!axes.empty()) r = op("ReduceSum", {grad}, AttrMap{{"axes", Attribute::of_ints(axes)}, {"keepdims", Attribute::of_int(1)}});
  if (shape(r) != to) r = op("Reshape", {r}, AttrMap{{"shape", Attribute::of_ints(to)}});
  return r;
}

ValueId GradContext::ensure_output(int i, DType dt, const Shape& s) {
  Node& n = g_.node(node_id_);
  if (n.output(i) != kNoId) return n.outputs[i];
  ValueId v = g_.add_value(g_.unique_name(n.name + "_saved"), dt, s, true);
  g_.set_output(node_id_, i, v);
  return v;
}

namespace {

bool differentiable_type(DType t) {
  return is_floating(t);
}

}  // namespace

Expected<BackwardResult> build_backward(Graph& g, ValueId loss, const std::vector<ValueId>& wrt) {
  const OpRegistry& reg = OpRegistry::global();
  BackwardResult res;
  if (!is_floating(g.value(loss).dtype)) return error("loss '{}' is not floating-point", g.value(loss).name);
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());

  // Nodes on a path from some wrt value to the loss.
  std::vector<char> from_wrt(g.num_values(), 0), to_loss(g.num_values(), 0);
  for (ValueId w : wrt) from_wrt[w] = 1;
  std::vector<char> node_fwd(static_cast<size_t>(g.max_node_id()), 0);
  for (NodeId id : order) {
    const Node& n = g.node(id);
    bool any = false;
    for (ValueId v : n.inputs) any |= v != kNoId && from_wrt[v];
    if (!any) continue;
    node_fwd[id] = 1;
    for (ValueId o : n.outputs) {
      if (o != kNoId && differentiable_type(g.value(o).dtype)) from_wrt[o] = 1;
    }
  }
  to_loss[loss] = 1;
  std::vector<NodeId> relevant;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& n = g.node(*it);
    bool feeds = false;
    for (ValueId o : n.outputs) feeds |= o != kNoId && to_loss[o];
    if (!feeds) continue;
    for (ValueId v : n.inputs) {
      if (v != kNoId) to_loss[v] = 1;
    }
    if (node_fwd[*it]) relevant.push_back(*it);
  }

  // Gradient contributions per value, summed when the producer is processed.
  std::map<ValueId, std::vector<ValueId>> contrib;
  {
    const Value& l = g.value(loss);
    Tensor one(l.dtype, l.shape);
    for (int64_t i = 0; i < one.numel(); ++i) store_from_double(one.raw_mutable(), l.dtype, i, 1.0);
    contrib[loss].push_back(g.add_constant("loss_grad_seed", one));
  }
  int node_count_before = static_cast<int>(g.num_nodes());
  auto total = [&](ValueId v, std::string where) -> ValueId {
    auto it = contrib.find(v);
    if (it == contrib.end() || it->second.empty()) return kNoId;
    std::vector<ValueId>& c = it->second;
    if (c.size() == 1) return c[0];
    // Sum in a fixed order: by the micro-batch chunk that made each contribution (the order the
    // schedules run the chunks' backward passes), then as they were made. The reverse pass meets
    // the last chunk first; summing in that order kept every earlier chunk's weight gradient alive
    // until the last chunk's arrived (K copies of the gradients at the peak). Contributions of no
    // chunk come last: they are made once every chunk's backward has run (a tied head's gradient,
    // transposed once after its chunks are summed); first, they held every chunk's gradient of the
    // tied embedding until the end, and put the data-parallel reduction on each chunk's (a partial
    // sum added to a whole value is reduced before the add).
    auto chunk_of = [&](ValueId x) {
      NodeId p = g.value(x).producer;
      const int c = p == kNoId ? -1 : g.node(p).chunk;
      return c < 0 ? std::numeric_limits<int>::max() : c;
    };
    std::stable_sort(c.begin(), c.end(), [&](ValueId a, ValueId b) { return chunk_of(a) < chunk_of(b); });
    ValueId acc = c[0];
    for (size_t i = 1; i < c.size(); ++i) {
      std::string name = g.unique_name(where + "/grad/accumulate");
      ValueId out = g.add_value(g.unique_name(name + "_out"), g.value(acc).dtype, g.value(acc).shape, true);
      NodeId add = g.add_node("Add", {acc, c[i]}, {out}, {}, name);
      g.node(add).phase = Node::Phase::kBackward;
      NodeId p = g.value(v).producer;
      if (p != kNoId) {
        g.node(add).origin = p;
        g.node(add).scope = g.node(p).scope;
        g.node(add).chunk = g.node(p).chunk;
      }
      acc = out;
    }
    c.assign(1, acc);
    return acc;
  };

  for (NodeId id : relevant) {
    const Node& n = g.node(id);
    std::vector<ValueId> gout;
    bool any_grad = false;
    for (ValueId o : n.outputs) {
      ValueId gv = o == kNoId ? kNoId : total(o, n.name);
      gout.push_back(gv);
      any_grad |= gv != kNoId;
    }
    if (!any_grad) continue;
    const OpSchema* s = reg.find(n.domain, n.op_type);
    std::vector<bool> needs(n.inputs.size(), false);
    bool any_need = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      if (v == kNoId || !from_wrt[v] || !differentiable_type(g.value(v).dtype)) continue;
      if (s && std::find(s->non_differentiable_inputs.begin(), s->non_differentiable_inputs.end(), static_cast<int>(i)) !=
                   s->non_differentiable_inputs.end()) {
        continue;
      }
      needs[i] = true;
      any_need = true;
    }
    if (!any_need) continue;
    if (!s || !s->grad) return error("{}: no gradient rule for this op", n.describe());
    GradContext ctx(g, id, gout, needs);
    Status st = s->grad(ctx);
    if (!st.is_ok()) return st;
    if (!ctx.status().is_ok()) return error("{}: gradient: {}", g.node(id).describe(), ctx.status().message());
    const Node& n2 = g.node(id);
    for (size_t i = 0; i < n2.inputs.size(); ++i) {
      for (ValueId gv : ctx.grad_inputs()[i]) {
        if (g.value(gv).shape != g.value(n2.inputs[i]).shape) {
          return error("{}: gradient of input {} has shape {}, the input {}", n2.describe(), i, shape_str(g.value(gv).shape),
                       shape_str(g.value(n2.inputs[i]).shape));
        }
        contrib[n2.inputs[i]].push_back(gv);
      }
    }
  }
  for (ValueId w : wrt) {
    ValueId gv = total(w, g.value(w).name);
    if (gv != kNoId) res.grads[w] = gv;
  }
  res.nodes_added = static_cast<int>(g.num_nodes()) - node_count_before;
  return res;
}

}  // namespace oases
