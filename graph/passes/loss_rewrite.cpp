// Rewrites mean-reduced cross-entropy losses as sum / count, count = the labels that are not
// ignored. The value is the same; the form splits over data-parallel ranks (a sum of partial sums
// over a global count) where a mean of means would be wrong whenever ranks ignore different numbers
// of labels.
#include "graph/op_registry.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

class LossSumOverCountPass : public Pass {
 public:
  std::string name() const override { return "loss-sum-over-count"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    for (NodeId id : g.nodes()) {
      if (!g.alive(id)) continue;
      Node n = g.node(id);
      if (!is_default_domain(n.domain) || (n.op_type != "SoftmaxCrossEntropyLoss" && n.op_type != "NegativeLogLikelihoodLoss")) continue;
      if (n.attrs.get_string("reduction", "mean") != "mean" || n.has_input(2)) continue;
      ValueId loss = n.outputs[0];
      DType dt = g.value(loss).dtype;
      ValueId labels = n.inputs[1];
      Shape ls = g.value(labels).shape;
      auto add = [&](const std::string& op, std::vector<ValueId> ins, AttrMap a, DType t, Shape s) {
        ValueId out = g.add_value(g.unique_name(n.name + "/" + op), t, s, true);
        NodeId nn = g.add_node(op, ins, {out}, std::move(a), g.unique_name(n.name + "/" + op));
        g.node(nn).scope = n.scope;
        g.node(nn).phase = n.phase;
        return out;
      };
      // the loss node now sums into a fresh value
      ValueId sum = g.add_value(g.unique_name(n.name + "/sum"), dt, {}, true);
      g.node(id).attrs.set_string("reduction", "sum");
      g.set_output(id, 0, sum);
      std::vector<int64_t> all;
      for (size_t d = 0; d < ls.size(); ++d) all.push_back(static_cast<int64_t>(d));
      ValueId count;
      if (n.attrs.has("ignore_index")) {
        Tensor ig(g.value(labels).dtype, {});
        store_from_double(ig.raw_mutable(), ig.dtype(), 0, static_cast<double>(n.attrs.get_int("ignore_index", -100)));
        ValueId igv = g.add_constant("ignore_index", ig);
        ValueId eq = add("Equal", {labels, igv}, {}, DType::kBool, ls);
        ValueId keep = add("Not", {eq}, {}, DType::kBool, ls);
        ValueId valid = add("Cast", {keep}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(dt))}}, dt, ls);
        count = add("ReduceSum", {valid}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt, {});
      } else {
        Tensor c(dt, {});
        store_from_double(c.raw_mutable(), dt, 0, static_cast<double>(shape_numel(ls)));
        count = g.add_constant("label_count", c);
      }
      ValueId div_out = g.add_value(g.unique_name(n.name + "/mean"), dt, {}, true);
      NodeId div = g.add_node("Div", {sum, count}, {div_out}, {}, g.unique_name(n.name + "/mean"));
      g.node(div).scope = n.scope;
      g.node(div).phase = n.phase;
      g.set_output(div, 0, loss);  // the loss keeps its name and id
      ++rep.count;
    }
    rep.changed = rep.count > 0;
    rep.found = fmt::format("{} mean cross-entropy losses written as sum / count", rep.count);
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_loss_sum_over_count_pass() {
  return std::make_unique<LossSumOverCountPass>();
}

}  // namespace oases
