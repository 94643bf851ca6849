#include "planner/propagation.h"

#include "graph/op_registry.h"

namespace oases {

Expected<ShardingResult> propagate_sharding(const Graph& g, const Mesh& mesh, const std::map<ValueId, ShardingSpec>& seeds,
                                            const std::map<size_t, ShardingSpec>& outputs, const std::map<ValueId, ShardingSpec>& pins) {
  ShardingResult res;
  res.mesh = mesh;
  res.specs.resize(g.num_values());
  for (size_t v = 0; v < g.num_values(); ++v) res.specs[v] = ShardingSpec::replicated(g.value(static_cast<ValueId>(v)).shape.size());
  for (const auto& [v, s] : seeds) {
    Status st = s.validate(g.value(v).shape, mesh);
    if (!st.is_ok()) return error("value '{}' {}: {}", g.value(v).name, shape_str(g.value(v).shape), st.message());
    res.specs[v] = s;
  }
  const OpRegistry& reg = OpRegistry::global();
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
  for (NodeId id : order) {
    const Node& n = g.node(id);
    std::vector<ShardingSpec> ins;
    bool all_replicated = true;
    for (ValueId v : n.inputs) {
      ins.push_back(v == kNoId ? ShardingSpec() : res.specs[v]);
      if (v != kNoId && !res.specs[v].is_replicated()) all_replicated = false;
    }
    ShardContext ctx(g, n, mesh, ins);
    // A partial sum read by several consumers is reduced once, where it forks, instead of each
    // consumer carrying it on and reducing its own derived value.
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      if (v == kNoId || !res.specs[v].any_partial()) continue;
      if (g.uses(v).size() > 1 || g.is_output(v)) ctx.require(static_cast<int>(i), res.specs[v].without_partial());
    }
    const OpSchema* s = reg.find(n.domain, n.op_type);
    if (s && s->shard) {
      OASES_RETURN_IF_ERROR(s->shard(ctx));
    } else if (!all_replicated) {
      return error("{}: no sharding rule for this op, and its inputs are split: {}", n.describe(), ctx.describe_inputs());
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      if (v == kNoId) continue;
      const ShardingSpec& want = ctx.in(static_cast<int>(i));
      if (want == res.specs[v]) continue;
      Status st = want.validate(g.value(v).shape, mesh);
      if (!st.is_ok())
        return error("{}: input {} '{}' is needed as {}: {}", n.describe(), i, g.value(v).name, want.to_string(&mesh), st.message());
      res.conversions.push_back(Conversion{id, static_cast<int>(i), v, res.specs[v], want});
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId o = n.outputs[k];
      if (o == kNoId) continue;
      const ShardingSpec& sp = ctx.outputs()[k];
      if (sp.rank() != g.value(o).shape.size()) {
        return error("{}: the sharding rule gave output {} the spec {} of rank {}, the value {} has rank {}", n.describe(), k,
                     sp.to_string(&mesh), sp.rank(), g.value(o).name, g.value(o).shape.size());
      }
      Status st = sp.validate(g.value(o).shape, mesh);
      if (!st.is_ok()) return error("{}: output '{}' would be {}: {}", n.describe(), g.value(o).name, sp.to_string(&mesh), st.message());
      res.specs[o] = sp;
      auto pin = pins.find(o);
      if (pin != pins.end() && pin->second != sp) {
        Status ps = pin->second.validate(g.value(o).shape, mesh);
        if (!ps.is_ok()) return error("value '{}' pinned to {}: {}", g.value(o).name, pin->second.to_string(&mesh), ps.message());
        res.conversions.push_back(Conversion{kNoId, -1, o, sp, pin->second});
        res.specs[o] = pin->second;
      }
    }
  }
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    ValueId v = g.outputs()[k];
    auto it = outputs.find(k);
    ShardingSpec want = it != outputs.end() ? it->second : ShardingSpec::replicated(g.value(v).shape.size());
    if (want != res.specs[v]) res.conversions.push_back(Conversion{kNoId, static_cast<int>(k), v, res.specs[v], want});
  }
  return res;
}

}  // namespace oases
