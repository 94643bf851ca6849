// Restores a learned token the exporter copied across a static batch. ViT prepends its class token
// to the patch embeddings as cat(cls_token.expand(B, -1, -1), patches); with the batch fixed at
// export (the dynamo exporter's static shapes) the expand is folded, and the file holds B equal
// copies [B, 1, C] under a generated name ("expand"), read by a Concat. Trained as it is, each copy
// would get only its own row's gradient and the copies would drift apart, where PyTorch trains one
// token with the sum. An initializer [B, ...] (B > 1) whose B slices are bit-identical and whose
// every reader is a Concat along a non-batch axis beside an activation of batch B becomes
// Expand(its first slice [1, ...]) under its own name, so the gradient sums the rows as in PyTorch
// (graph/parameters.h then reads it as a learned token).
#include <cstring>

#include <fmt/format.h>

#include "graph/op_registry.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

bool slices_equal(const Value& v) {
  size_t row = v.constant.nbytes() / static_cast<size_t>(v.shape[0]);
  const char* p = static_cast<const char*>(v.constant.raw());
  for (int64_t b = 1; b < v.shape[0]; ++b) {
    if (std::memcmp(p, p + static_cast<size_t>(b) * row, row) != 0) return false;
  }
  return true;
}

class UnfoldBatchCopiesPass : public Pass {
 public:
  std::string name() const override { return "unfold-batch-copies"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    std::vector<std::string> found;
    std::vector<ValueId> inits(g.initializers().begin(), g.initializers().end());
    for (ValueId v : inits) {
      const Value& val = g.value(v);
      if (!is_floating(val.dtype) || val.shape.size() < 2 || val.shape[0] < 2 || !val.is_constant() || val.constant.is_lazy()) continue;
      if (g.is_output(v) || g.uses(v).empty()) continue;
      const int64_t batch = val.shape[0];
      bool token = true;
      for (const Use& u : g.uses(v)) {
        const Node& n = g.node(u.node);
        if (!is_default_domain(n.domain) || n.op_type != "Concat") {
          token = false;
          break;
        }
        int64_t axis = n.attrs.get_int("axis", 0);
        if (axis < 0) axis += static_cast<int64_t>(val.shape.size());
        bool beside_activation = false;
        for (int i = 0; i < n.num_inputs(); ++i) {
          if (i == u.slot || !n.has_input(i)) continue;
          const Value& other = g.value(n.inputs[static_cast<size_t>(i)]);
          if (!other.is_constant() && !other.shape.empty() && other.shape[0] == batch) beside_activation = true;
        }
        if (axis == 0 || !beside_activation) {
          token = false;
          break;
        }
      }
      if (!token || !slices_equal(val)) continue;
      std::string name = val.name;
      Shape full = val.shape, one = val.shape;
      one[0] = 1;
      Tensor first(val.dtype, one);
      std::memcpy(first.raw_mutable(), val.constant.raw(), first.nbytes());
      ValueId expanded = g.add_value(g.unique_name(name + "_batch"), val.dtype, full, true);
      g.replace_all_uses(v, expanded);
      g.remove_initializer(v);
      g.rename_value(v, g.unique_name(name + "_folded"));  // the name goes to the one token
      ValueId tok = g.add_initializer(name, first);
      g.add_node("Expand", {tok}, {expanded}, AttrMap{{"shape", Attribute::of_ints(full)}}, g.unique_name(name + "/unfold"));
      found.push_back(fmt::format("{} = {} copies of {}", name, batch, shape_str(one)));
    }
    rep.count = static_cast<int>(found.size());
    rep.changed = rep.count > 0;
    rep.found = found.empty() ? "no batch copies of a token" : fmt::format("unfolded {}", fmt::join(found, ", "));
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_unfold_batch_copies_pass() {
  return std::make_unique<UnfoldBatchCopiesPass>();
}

}  // namespace oases
