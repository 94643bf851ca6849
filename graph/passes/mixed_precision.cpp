#include "graph/passes/mixed_precision.h"

#include <algorithm>
#include <map>
#include <set>

#include "graph/op_registry.h"

namespace oases {

Expected<DType> compute_dtype_from_name(const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "float16") return DType::kF16;
  return error("unknown --dtype '{}' (fp32, bf16 or fp16)", name);
}

namespace {

bool is_loss_op(const Node& n) {
  return op_has_trait(n, kTraitLoss);
}

// Slots whose float operand keeps its own type (float32) inside the body (OpSchema::float32_inputs).
bool keeps_float32(const Node& n, int slot) {
  const OpSchema* s = find_schema(n);
  return s && std::find(s->float32_inputs.begin(), s->float32_inputs.end(), slot) != s->float32_inputs.end();
}

bool is_float_like(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

}  // namespace

Expected<int> apply_mixed_precision(Graph& g, DType compute) {
  if (compute == DType::kF32) return 0;
  if (compute != DType::kF16 && compute != DType::kBF16)
    return error("mixed precision computes in float16 or bfloat16, not {}", dtype_name(compute));
  if (g.outputs().empty()) return error("mixed precision needs the loss as output 0");
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
  // the body: ancestors of the loss ops' scores (or of the loss itself when the model computes it
  // with other ops), loss ops excluded
  std::vector<NodeId> roots;
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (is_loss_op(n) && n.inputs[0] != kNoId && g.producer(n.inputs[0]) != kNoId) roots.push_back(g.producer(n.inputs[0]));
  }
  bool cast_loss_back = roots.empty();
  if (roots.empty() && g.producer(g.outputs()[0]) != kNoId) roots.push_back(g.producer(g.outputs()[0]));
  std::set<NodeId> body;
  std::vector<NodeId> stack = roots;
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (!body.insert(id).second) continue;
    for (NodeId p : g.predecessors(id)) stack.push_back(p);
  }
  const OpRegistry& reg = OpRegistry::global();
  std::map<std::pair<ValueId, DType>, ValueId> casts;
  int inserted = 0;
  auto cast_to = [&](ValueId v, DType t) -> ValueId {
    auto key = std::make_pair(v, t);
    auto it = casts.find(key);
    if (it != casts.end()) return it->second;
    const Value& val = g.value(v);
    ValueId out = g.add_value(g.unique_name(val.name + (t == DType::kF32    ? "_fp32"
                                                        : t == DType::kBF16 ? "_bf16"
                                                                            : "_fp16")),
                              t, val.shape, true);
    g.add_node("Cast", {v}, {out}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(t))}}, g.unique_name("mp_cast"));
    ++inserted;
    casts[key] = out;
    return out;
  };
  for (NodeId id : order) {
    bool in_body = body.count(id) > 0;
    {
      Node& n = g.node(id);
      if (n.op_type == "Cast") {
        // integer or bool data turned float inside the body (positions, masks) lands in the compute type
        if (in_body && n.attrs.get_int("to", 0) == dtype_to_onnx(DType::kF32)) {
          n.attrs.set("to", Attribute::of_int(dtype_to_onnx(compute)));
        }
      } else {
        for (int i = 0; i < n.num_inputs(); ++i) {
          ValueId v = n.inputs[static_cast<size_t>(i)];
          if (v == kNoId || !is_float_like(g.value(v).dtype)) continue;
          DType want = in_body && !keeps_float32(n, i) ? compute : DType::kF32;
          if (keeps_float32(n, i) && g.value(v).dtype == DType::kF32) continue;
          if (g.value(v).dtype != want) g.set_input(id, i, cast_to(v, want));
        }
        if (in_body && n.op_type == "ConstantOfShape") {
          const Attribute* a = n.attrs.find("value");
          if (a && a->t.dtype() == DType::kF32) {
            Tensor t(compute, a->t.shape());
            store_from_double(t.raw_mutable(), compute, 0, load_as_double(a->t.raw(), DType::kF32, 0));
            Attribute na = *a;
            na.t = t;
            n.attrs.set("value", na);
          }
        }
      }
    }
    // the node's outputs take their types from its inputs again
    Node& n = g.node(id);
    const OpSchema* s = reg.find(n.domain, n.op_type);
    if (!s) return error("{}: unsupported op", n.describe());
    InferContext ctx(g, id);
    Status st;
    try {
      st = s->infer(ctx);
    } catch (const std::exception& e) {
      st = error("{}: {}", n.describe(), e.what());
    }
    if (!st.is_ok()) return error("mixed precision ({}): {}", dtype_name(compute), st.message());
  }
  if (cast_loss_back && g.value(g.outputs()[0]).dtype != DType::kF32) {
    std::vector<ValueId> outs = g.outputs();
    outs[0] = cast_to(outs[0], DType::kF32);
    g.set_outputs(outs);
  }
  return inserted;
}

Status insert_loss_scale_input(Graph& g) {
  if (g.outputs().empty()) return Status::error("loss scaling needs the loss as output 0");
  ValueId loss = g.outputs()[0];
  const Value& lv = g.value(loss);
  if (lv.dtype != DType::kF32) return error("loss scaling needs a float32 loss, '{}' is {}", lv.name, dtype_name(lv.dtype));
  ValueId s = g.add_input(kLossScaleInput, DType::kF32, {});
  ValueId scaled = g.add_value(g.unique_name(lv.name + "_scaled"), DType::kF32, lv.shape, true);
  g.add_node("Mul", {loss, s}, {scaled}, {}, g.unique_name("loss_scale"));
  std::vector<ValueId> outs = g.outputs();
  outs[0] = scaled;
  g.set_outputs(outs);
  return Status::ok();
}

}  // namespace oases
