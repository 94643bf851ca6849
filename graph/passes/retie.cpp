// Restores ties the exporter folded away: PyTorch's newer exporters write a tied LM head
// (logits = h · Eᵀ with E the token embedding) as MatMul(h, C) with C = Eᵀ stored as an initializer
// of its own, named by the exporter ("onnx::MatMul_658", the dynamo exporter's "val_178"). Inference does not care; training does:
// C and E would train apart, where the model trained them as one. An exporter-named 2-D initializer
// whose contents are exactly the transpose of a named initializer becomes Transpose(that initializer),
// so the gradient sums both uses, as in PyTorch. Tensors of one repeated value (ones, zeros) are
// never taken for a tie.
#include <cstring>
#include <regex>

#include <fmt/format.h>

#include "graph/op_registry.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

// the TorchScript exporter's "onnx::MatMul_658", the dynamo exporter's "val_178"
bool exporter_named(const std::string& n) {
  static const std::regex kDynamo(R"(^val_[0-9]+$)");
  return n.rfind("onnx::", 0) == 0 || std::regex_match(n, kDynamo);
}

template <class T>
bool is_transpose_of(const T* c, const T* w, int64_t rows, int64_t cols) {  // c [cols, rows] == wᵀ, w [rows, cols]
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      if (std::memcmp(&c[j * rows + i], &w[i * cols + j], sizeof(T)) != 0) return false;
    }
  }
  return true;
}

template <class T>
bool one_value(const T* x, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    if (std::memcmp(&x[i], &x[0], sizeof(T)) != 0) return false;
  }
  return true;
}

class RetiePass : public Pass {
 public:
  std::string name() const override { return "retie-transposed-copies"; }
  Expected<PassReport> run(Graph& g) override {
    PassReport rep{name()};
    std::vector<ValueId> named, copies;
    for (ValueId v : g.initializers()) {
      const Value& val = g.value(v);
      // weights in external files are not read for this (planning reads shapes only)
      if (val.dtype != DType::kF32 || val.shape.size() != 2 || !val.is_constant() || val.constant.is_lazy()) continue;
      (exporter_named(val.name) ? copies : named).push_back(v);
    }
    std::vector<std::string> found;
    for (ValueId c : copies) {
      const Value& cv = g.value(c);
      if (g.is_output(c)) continue;
      for (ValueId w : named) {
        const Value& wv = g.value(w);
        if (wv.shape[0] != cv.shape[1] || wv.shape[1] != cv.shape[0]) continue;
        if (one_value(cv.constant.data<float>(), cv.numel())) break;
        if (!is_transpose_of(cv.constant.data<float>(), wv.constant.data<float>(), wv.shape[0], wv.shape[1])) continue;
        std::string copy_name = cv.name, weight_name = wv.name;
        Shape ts{wv.shape[1], wv.shape[0]};
        ValueId t = g.add_value(g.unique_name(weight_name + "_T"), DType::kF32, ts, true);
        g.add_node("Transpose", {w}, {t}, AttrMap{{"perm", Attribute::of_ints({1, 0})}}, g.unique_name(weight_name + "/retie"));
        g.replace_all_uses(c, t);
        g.remove_initializer(c);
        found.push_back(fmt::format("{} = {}ᵀ", copy_name, weight_name));
        break;
      }
    }
    rep.count = static_cast<int>(found.size());
    rep.changed = rep.count > 0;
    rep.found = found.empty() ? "no transposed copy of a weight" : fmt::format("re-tied {}", fmt::join(found, ", "));
    return rep;
  }
};

}  // namespace

std::unique_ptr<Pass> make_retie_pass() {
  return std::make_unique<RetiePass>();
}

}  // namespace oases
