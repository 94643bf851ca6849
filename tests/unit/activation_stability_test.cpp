// Activations far into their tails (±20, ±100, ±1e4), forward and backward, against PyTorch's
// float32 values in tests/data/activation_refs.csv (written by tests/data/make_activation_refs.py).
// Each op runs as a float32 graph y = op(x), loss = Σ y, whose gradient build_backward generates,
// so the forward kernels and the gradient kernels the importer's fused ops use (GeluGrad,
// UnaryGrad, SwiGLUGrad) are the ones checked. 16 points: the 8-lane and the scalar paths both run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "executor/executor.h"
#include "graph/autodiff.h"
#include "graph/passes/pass.h"

namespace oases {
namespace {

struct RefRow {
  float x, y, dx;
};

std::map<std::string, std::vector<RefRow>> read_refs() {
  std::map<std::string, std::vector<RefRow>> refs;
  std::ifstream in(std::string(OASES_SOURCE_DIR) + "/tests/data/activation_refs.csv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::stringstream ss(line);
    std::string op, x, y, dx;
    std::getline(ss, op, ',');
    std::getline(ss, x, ',');
    std::getline(ss, y, ',');
    std::getline(ss, dx, ',');
    // strtod, not stof: stof throws on the subnormal values some tails have
    auto num = [](const std::string& t) { return static_cast<float>(std::strtod(t.c_str(), nullptr)); };
    refs[op].push_back({num(x), num(y), num(dx)});
  }
  return refs;
}

constexpr float kSwigluUp = 0.75f;  // as in make_activation_refs.py

// (op type, domain, attributes) of a reference name
struct OpUnderTest {
  std::string op, domain;
  AttrMap attrs;
};

OpUnderTest op_for(const std::string& name) {
  if (name == "GeluTanh") return {"Gelu", "", AttrMap{{"approximate", Attribute::of_string("tanh")}}};
  if (name == "Silu" || name == "SwiGLU") return {name, kOasesDomain, {}};
  return {name, "", {}};
}

TEST(ActivationStability, MatchesPyTorchInTheTails) {
  auto refs = read_refs();
  ASSERT_GE(refs.size(), 10u) << "tests/data/activation_refs.csv is missing or short";
  for (const auto& [name, rows] : refs) {
    SCOPED_TRACE(name);
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<float> xs;
    for (const RefRow& r : rows) xs.push_back(r.x);
    Graph g;
    g.opset_imports[""] = 20;
    ValueId x = g.add_initializer("x", Tensor::from_f32(xs, {n}));
    OpUnderTest t = op_for(name);
    std::vector<ValueId> ins{x};
    if (name == "SwiGLU") ins.push_back(g.add_constant("up", Tensor::from_f32(std::vector<float>(n, kSwigluUp), {n})));
    ValueId y = g.node(g.add_node_new_outputs(t.op, ins, 1, t.attrs, "", t.domain)).outputs[0];
    ValueId loss = g.node(g.add_node_new_outputs("ReduceSum", {y}, 1, AttrMap{{"keepdims", Attribute::of_int(0)}}, "", "")).outputs[0];
    InferShapesPass infer;
    auto inferred = infer.run(g);
    ASSERT_TRUE(inferred) << inferred.status().message();
    g.set_outputs({loss});
    auto bw = build_backward(g, loss, {x});
    ASSERT_TRUE(bw) << bw.status().message();
    g.set_outputs({y, bw->grads.at(x)});
    auto ex = Executor::create(g);
    ASSERT_TRUE(ex) << ex.status().message();
    auto out = (*ex)->run({});
    ASSERT_TRUE(out) << out.status().message();
    const float* got_y = (*out)[0].data<float>();
    const float* got_dx = (*out)[1].data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const RefRow& r = rows[i];
      // float32 kernels with their own polynomials: a few ulp-ish relative, 1e-6 absolute
      auto close = [](float got, float want) {
        if (std::isnan(want)) return std::isnan(got);
        if (std::isinf(want)) return got == want;
        return std::abs(got - want) <= 1e-6f + 2e-5f * std::abs(want);
      };
      EXPECT_TRUE(close(got_y[i], r.y)) << name << "(" << r.x << ") = " << got_y[i] << ", PyTorch " << r.y;
      EXPECT_TRUE(close(got_dx[i], r.dx)) << name << "'(" << r.x << ") = " << got_dx[i] << ", PyTorch " << r.dx;
    }
  }
}

}  // namespace
}  // namespace oases
