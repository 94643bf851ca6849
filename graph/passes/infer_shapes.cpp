#include <algorithm>
#include <optional>
#include <set>

#include "graph/op_registry.h"
#include "graph/passes/pass.h"

namespace oases {

Status check_supported(const Graph& g) {
  const OpRegistry& reg = OpRegistry::global();
  std::vector<std::string> bad;
  std::set<std::string> domains;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    const OpSchema* s = reg.find(n.domain, n.op_type);
    if (!s) {
      bad.push_back(n.describe());
      if (!is_default_domain(n.domain) && n.domain != kOasesDomain) domains.insert(n.domain);
      continue;
    }
    int ni = n.num_inputs(), no = static_cast<int>(n.outputs.size());
    while (ni > 0 && n.inputs[ni - 1] == kNoId) --ni;
    if (ni < s->min_inputs || ni > s->max_inputs) {
      return error("{} has {} inputs, the op takes {} to {}", n.describe(), ni, s->min_inputs,
                   s->max_inputs == INT_MAX ? std::string("any number") : std::to_string(s->max_inputs));
    }
    for (int i = 0; i < s->min_inputs; ++i) {
      if (n.inputs[i] == kNoId) return error("{}: input {} is required but omitted (empty name)", n.describe(), i);
    }
    while (no > 0 && n.outputs[no - 1] == kNoId) --no;
    if (no < s->min_outputs || no > s->max_outputs) {
      return error("{} has {} outputs, the op gives {} to {}", n.describe(), no, s->min_outputs,
                   s->max_outputs == INT_MAX ? std::string("any number") : std::to_string(s->max_outputs));
    }
  }
  if (!bad.empty()) {
    std::string msg = fmt::format("{} unsupported node{}: {}", bad.size(), bad.size() == 1 ? "" : "s", fmt::join(bad, ", "));
    if (!domains.empty()) msg += fmt::format(" (unsupported domain{}: {})", domains.size() == 1 ? "" : "s", fmt::join(domains, ", "));
    return Status::error(msg);
  }
  return Status::ok();
}

namespace {

// A float initializer that may be trained, so folding must not freeze it. Single-element ones are
// not: the dynamo exporter stores every scalar constant (fill values such as -3.4e38 for causal
// masks, 1/sqrt(d) scales) as an initializer, and those must fold like Constant nodes do.
bool is_parameter(const Value& v) {
  return v.is_initializer && is_floating(v.dtype) && v.numel() > 1;
}

// Brings node `id` into canonical form and sets its outputs' types.
Status normalize_and_infer(Graph& g, NodeId id, const OpSchema* s) {
  const OpRegistry& reg = OpRegistry::global();
  Node* n = &g.node(id);
  InferContext ctx(g, id);
  if (s->normalize) {
    OASES_RETURN_IF_ERROR(s->normalize(ctx));
    // normalisation may rewrite the op into another (CastLike -> Cast)
    const OpSchema* s2 = reg.find(n->domain, n->op_type);
    if (s2 != s) {
      s = s2;
      if (!s) return error("{}: unsupported op after normalisation", n->describe());
      if (s->normalize) OASES_RETURN_IF_ERROR(s->normalize(ctx));
    }
  }
  for (int i = 0; i < s->min_inputs && i < n->num_inputs(); ++i) {
    if (n->inputs[i] == kNoId) return error("{}: input {} is required but omitted", n->describe(), i);
  }
  return s->infer(ctx);
}

}  // namespace

Expected<PassReport> InferShapesPass::run(Graph& g) {
  const OpRegistry& reg = OpRegistry::global();
  PassReport rep{name()};
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    if (!val.has_shape) return error("graph input '{}' has no shape", val.name);
    for (int64_t d : val.shape) {
      if (d < 0) return error("graph input '{}' has an unknown dimension in {}", val.name, shape_str(val.shape));
    }
  }
  int folded = 0;
  uint64_t folded_bytes = 0;
  for (NodeId id : order) {
    Node* n = &g.node(id);
    const OpSchema* s = reg.find(n->domain, n->op_type);
    if (!s) return error("{}: unsupported op", n->describe());
    for (int i = 0; i < n->num_inputs(); ++i) {
      if (n->inputs[i] == kNoId) continue;
      const Value& in = g.value(n->inputs[i]);
      if (!in.has_shape) return error("{}: input '{}' has no known shape", n->describe(), in.name);
      if (in.producer == kNoId && !in.is_input && !in.is_constant()) {
        return error("{}: input '{}' is produced by no node and is neither a graph input nor an initializer", n->describe(), in.name);
      }
    }
    // A rule that throws (an operand it did not expect, say) is reported against the node; bad
    // input must never take the tool down.
    Status st;
    try {
      st = normalize_and_infer(g, id, s);
    } catch (const std::exception& e) {
      st = error("{}: shape inference failed: {}", n->describe(), e.what());
    }
    if (!st.is_ok()) return st;
    for (ValueId o : n->outputs) {
      if (o == kNoId) continue;
      const Value& ov = g.value(o);
      if (!ov.has_shape) return error("{}: output '{}' got no shape", n->describe(), ov.name);
      if (std::any_of(ov.shape.begin(), ov.shape.end(), [](int64_t d) { return d < 0; })) {
        return error("{}: output '{}' would have a negative dimension in {}", n->describe(), ov.name, shape_str(ov.shape));
      }
      std::optional<uint64_t> nbytes = checked_nbytes(ov.shape, ov.dtype);
      if (!nbytes || *nbytes > max_inferred_bytes()) {
        std::string size = nbytes ? fmt::format("{} bytes", *nbytes) : std::string("more than 2^64 bytes");
        return error("{}: output '{}' would be {} {} ({}), over the limit of {} bytes per tensor (--max-memory)", n->describe(), ov.name,
                     dtype_name(ov.dtype), shape_str(ov.shape), size, max_inferred_bytes());
      }
    }

    // --- constant folding -------------------------------------------------------------
    bool fold = false;
    if (n->op_type == "Constant" && is_default_domain(n->domain)) {
      fold = true;  // infer already attached the constant
    } else if (op_has_trait(*n, kTraitShapeOnly)) {
      const Shape& in = g.value(n->inputs[0]).shape;
      Tensor t;
      if (n->op_type == "Shape") {
        int64_t start = n->attrs.get_int("start", 0), end = n->attrs.get_int("end", static_cast<int64_t>(in.size()));
        t = Tensor::from_int64(std::vector<int64_t>(in.begin() + start, in.begin() + end), {end - start});
      } else {
        t = Tensor::from_int64({shape_numel(in)}, {});
      }
      g.set_constant(n->outputs[0], t);
      fold = true;
    } else if (s->foldable && opts_.evaluator) {
      bool all_const = true;
      for (ValueId v : n->inputs) {
        if (v == kNoId) continue;
        const Value& in = g.value(v);
        if (!in.is_constant() || is_parameter(in)) all_const = false;
      }
      int64_t out_elems = 0;
      uint64_t out_bytes = 0;
      for (ValueId o : n->outputs) {
        if (o != kNoId) out_elems += g.value(o).numel();
        if (o != kNoId) out_bytes += g.value(o).nbytes();
      }
      // Folded constants are held for the graph's lifetime: past a quarter of the memory limit in
      // all, nodes stay computed at run time, where the activation arena's limit applies.
      if (folded_bytes + out_bytes > max_memory_bytes() / 4) all_const = false;
      bool any_output_is_graph_output = false;
      for (ValueId o : n->outputs) {
        if (o != kNoId && g.is_output(o)) any_output_is_graph_output = true;
      }
      if (all_const && out_elems <= opts_.max_elements && !any_output_is_graph_output) {
        std::vector<Tensor> ins;
        for (ValueId v : n->inputs) ins.push_back(v == kNoId ? Tensor() : g.value(v).constant);
        Expected<std::vector<Tensor>> outs = Status::error("no result");
        try {
          outs = opts_.evaluator->evaluate(g, *n, ins);
        } catch (const std::exception& e) {
          outs = Status::error(e.what());
        }
        if (!outs) return error("{}: constant folding failed: {}", n->describe(), outs.status().message());
        for (size_t i = 0; i < n->outputs.size() && i < outs->size(); ++i) {
          if (n->outputs[i] != kNoId) g.set_constant(n->outputs[i], (*outs)[i]);
        }
        folded_bytes += out_bytes;
        fold = true;
      }
    }
    if (fold) {
      // graph outputs keep their producer so that they stay computed
      bool keep = false;
      for (ValueId o : n->outputs) {
        if (o != kNoId && g.is_output(o)) keep = true;
      }
      if (!keep) {
        g.remove_node(id);
        ++folded;
      }
    }
  }
  rep.count = folded;
  rep.changed = folded > 0;
  rep.found = fmt::format("{} nodes folded into constants, shapes of {} values known", folded, g.num_values());
  return rep;
}

Expected<PassReport> DeadCodePass::run(Graph& g) {
  PassReport rep{name()};
  std::vector<char> live(static_cast<size_t>(g.max_node_id()), 0);
  std::vector<NodeId> stack;
  for (ValueId o : g.outputs()) {
    NodeId p = g.value(o).producer;
    if (p != kNoId && !live[p]) {
      live[p] = 1;
      stack.push_back(p);
    }
  }
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    for (NodeId p : g.predecessors(n)) {
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
    }
  }
  int removed = 0;
  for (NodeId id : g.nodes()) {
    if (!live[id]) {
      g.remove_node(id);
      ++removed;
    }
  }
  int dropped = 0;
  std::vector<ValueId> inits = g.initializers();
  for (ValueId v : inits) {
    if (g.uses(v).empty() && !g.is_output(v)) {
      g.remove_initializer(v);
      g.value(v).constant = Tensor();
      ++dropped;
    }
  }
  rep.count = removed + dropped;
  rep.changed = rep.count > 0;
  rep.found = fmt::format("{} dead nodes and {} unused initializers removed", removed, dropped);
  return rep;
}

}  // namespace oases
