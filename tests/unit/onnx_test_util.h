// Helpers shared by the unit tests that go through the importer: import/load a built model from a
// temp folder, check an error names what it should, run a canonical graph, and compare two
// canonical graphs structurally (op, attributes, wiring, dtypes and shapes; names ignored).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "importer/onnx_import.h"
#include "tests/common/onnx_builder.h"
#include "tools/model_loader.h"

namespace oases::testutil {

inline Expected<Graph> import_built(const ModelBuilder& b, const TempDir& dir, const ImportOptions& opts = {},
                                    const std::string& file = "model.onnx") {
  return import_onnx_file(b.write(dir / file).string(), opts);
}

inline Expected<LoadedModel> load_built(const ModelBuilder& b, const TempDir& dir, const ImportOptions& opts = {},
                                        const std::string& file = "model.onnx") {
  return load_model(b.write(dir / file).string(), opts);
}

// Success when `s` is an error whose message contains every needle.
inline ::testing::AssertionResult fails_naming(const Status& s, std::initializer_list<std::string> needles) {
  if (s.is_ok()) return ::testing::AssertionFailure() << "succeeded; an error was expected";
  for (const auto& n : needles) {
    if (s.message().find(n) == std::string::npos) {
      return ::testing::AssertionFailure() << "error '" << s.message() << "' does not name '" << n << "'";
    }
  }
  if (s.message().find('\n') != std::string::npos) {
    return ::testing::AssertionFailure() << "error '" << s.message() << "' is not one line";
  }
  return ::testing::AssertionSuccess();
}

// Runs a canonical graph on the CPU; fails the test (and returns nothing) on an error.
inline std::vector<Tensor> run_graph(const Graph& g, const std::map<std::string, Tensor>& feeds) {
  auto ex = Executor::create(g);
  if (!ex) {
    ADD_FAILURE() << "Executor::create: " << ex.status().message();
    return {};
  }
  auto out = (*ex)->run(feeds);
  if (!out) {
    ADD_FAILURE() << "run: " << out.status().message();
    return {};
  }
  return *out;
}

inline std::vector<float> to_floats(const Tensor& t) {
  std::vector<float> v;
  for (double d : t.to_double()) v.push_back(static_cast<float>(d));
  return v;
}

// A deterministic float tensor 0.1·(i mod 7) - 0.3 with the given shape.
inline Tensor ramp(Shape shape) {
  Tensor t(DType::kF32, shape);
  float* p = t.mutable_data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.1f * static_cast<float>(i % 7) - 0.3f + 0.01f * static_cast<float>(i);
  return t;
}

// The graph as text without names: nodes in topological order with op, sorted attributes, the
// operands (graph inputs by name, constants by dtype/shape/contents, node outputs by position)
// and output types. Two forms of one model that canonicalise alike give equal signatures.
inline std::string graph_signature(const Graph& g) {
  auto order = g.topo_order();
  if (!order) return "cycle: " + order.status().message();
  std::map<ValueId, std::string> label;
  std::string sig;
  auto operand = [&](ValueId v) -> std::string {
    if (v == kNoId) return "_";
    auto it = label.find(v);
    if (it != label.end()) return it->second;
    const Value& val = g.value(v);
    if (val.is_input) return "in:" + val.name;
    if (val.is_constant()) {
      std::string s = fmt::format("const:{}{}", dtype_name(val.dtype), shape_str(val.shape));
      if (val.constant.numel() <= 16) s += fmt::format("={}", fmt::join(val.constant.to_double(), ","));
      return s;
    }
    return "?:" + val.name;
  };
  int idx = 0;
  for (NodeId id : *order) {
    const Node& n = g.node(id);
    std::vector<std::string> ins, attrs, outs;
    for (ValueId v : n.inputs) ins.push_back(operand(v));
    for (const auto& [k, a] : n.attrs) attrs.push_back(k + "=" + a.to_string());
    for (size_t s = 0; s < n.outputs.size(); ++s) {
      ValueId o = n.outputs[s];
      if (o == kNoId) {
        outs.push_back("_");
        continue;
      }
      label[o] = fmt::format("n{}.{}", idx, s);
      outs.push_back(fmt::format("{}{}", dtype_name(g.value(o).dtype), shape_str(g.value(o).shape)));
    }
    sig += fmt::format("n{}: {}{}({}) {{{}}} -> {}\n", idx, n.domain.empty() ? "" : n.domain + ".", n.op_type, fmt::join(ins, ", "),
                       fmt::join(attrs, ", "), fmt::join(outs, ", "));
    ++idx;
  }
  std::vector<std::string> outs;
  for (ValueId o : g.outputs()) outs.push_back(operand(o));
  sig += fmt::format("outputs: {}\n", fmt::join(outs, ", "));
  return sig;
}

inline void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace oases::testutil
