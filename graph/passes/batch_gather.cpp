// Rewrites a look-up into a batch-major tensor through flat indices into a per-row gather:
//   Gather(Flatten(x [B, T]) or Reshape(x, [B·T (, 1…)]), I, axis 0),  I constant, I[b, …] = b·T + J[…]
//     → Reshape(Gather(x, J, axis 1), shape of the result)
// Hugging Face's attention-mask helpers, traced by PyTorch's TorchScript exporter, read the padding
// mask this way (attention_mask.flatten()[batch_index·T + key_index]). The two forms are equal;
// the rewritten one keeps each batch row's result in its row, so the batch can be split (data
// parallelism, micro-batch chunks) without any rank needing the other rows of x.
#include <fmt/format.h>

#include "graph/op_registry.h"
#include "graph/passes/pass.h"
#include "graph/passes/pattern.h"

namespace oases {

namespace {

using pattern::producer_if;

class BatchGatherPass : public Pass {
 public:
  std::string name() const override { return "batch-row-gather"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      const Node& n = g.node(id);
      if (n.op_type != "Gather" || !is_default_domain(n.domain) || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
      ValueId data = n.inputs[0], idx = n.inputs[1], y = n.outputs[0];
      const Value& dv = g.value(data);
      const Value& iv = g.value(idx);
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += static_cast<int64_t>(dv.shape.size());
      if (axis != 0 || !iv.is_constant() || iv.shape.empty() || !is_integer(iv.dtype) || dv.shape.empty()) continue;
      const Node* flat = producer_if(g, data, "Flatten");
      if (!flat) flat = producer_if(g, data, "Reshape");
      if (!flat) continue;
      ValueId x = flat->inputs[0];
      const Shape& xs = g.value(x).shape;
      if (xs.size() != 2 || xs[0] < 1 || xs[1] < 1 || dv.shape[0] != xs[0] * xs[1]) continue;
      int64_t rest = 1;
      for (size_t d = 1; d < dv.shape.size(); ++d) rest *= dv.shape[d];
      if (rest != 1) continue;
      const int64_t B = xs[0], T = xs[1];
      if (iv.shape[0] != B) continue;
      std::vector<double> I = iv.constant.to_double();
      const int64_t per_row = static_cast<int64_t>(I.size()) / B;
      if (per_row < 1 || per_row * B != static_cast<int64_t>(I.size())) continue;
      // I[b, r] = b·T + J[r] with 0 <= J[r] < T for every row b (negative indices count from the end)
      Shape js(iv.shape.begin() + 1, iv.shape.end());
      Tensor J(DType::kI64, js);
      bool ok = true;
      for (int64_t b = 0; b < B && ok; ++b) {
        for (int64_t r = 0; r < per_row && ok; ++r) {
          double v = I[static_cast<size_t>(b * per_row + r)];
          if (v < 0) v += static_cast<double>(B * T);
          double j = v - static_cast<double>(b * T);
          if (j < 0 || j >= static_cast<double>(T)) {
            ok = false;
          } else if (b == 0) {
            J.mutable_data<int64_t>()[r] = static_cast<int64_t>(j);
          } else {
            ok = J.data<int64_t>()[r] == static_cast<int64_t>(j);
          }
        }
      }
      if (!ok) continue;
      std::string base = n.name;
      Shape out_shape = g.value(y).shape;
      Shape rows = iv.shape;  // [B, …J]
      DType dtype = dv.dtype;
      ValueId jv = g.add_constant(base + "_row_index", J);
      ValueId picked = g.add_value(g.unique_name(base + "_rows"), dtype, rows, true);
      g.remove_node(id);
      g.add_node("Gather", {x, jv}, {picked}, AttrMap{{"axis", Attribute::of_int(1)}}, g.unique_name(base + "_per_row"));
      Tensor shape_t(DType::kI64, {static_cast<int64_t>(out_shape.size())});
      for (size_t d = 0; d < out_shape.size(); ++d) shape_t.mutable_data<int64_t>()[d] = out_shape[d];
      ValueId sv = g.add_constant(base + "_shape", shape_t);
      g.add_node("Reshape", {picked, sv}, {y}, {}, g.unique_name(base + "_as_flat"));
      ++rep.count;
    }
    rep.changed = rep.count > 0;
    rep.found = fmt::format("{} look-ups into a flattened batch-major tensor made per-row", rep.count);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_batch_gather_pass() {
  return std::make_unique<BatchGatherPass>();
}

}  // namespace oases
