// Finite-difference check of every gradient rule: each case builds a small float64 graph whose
// parameters are initializers, takes loss = Σ y ∘ R (R fixed random weights), and compares the
// gradients from build_backward with central differences of the forward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "executor/executor.h"
#include "graph/autodiff.h"
#include "graph/passes/pass.h"

namespace oases {
namespace {

struct Builder {
  Graph g;
  std::mt19937 rng{1234};
  std::vector<ValueId> params;
  Builder() { g.opset_imports[""] = 18; }

  Tensor random(const Shape& s, double lo = -1.0, double hi = 1.0) {
    Tensor t(DType::kF64, s);
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<double>()[i] = u(rng);
    return t;
  }
  // a differentiable parameter
  ValueId param(const Shape& s, double lo = -1.0, double hi = 1.0) {
    ValueId v = g.add_initializer(g.unique_name("p"), random(s, lo, hi));
    params.push_back(v);
    return v;
  }
  ValueId constant(Tensor t) { return g.add_constant("c", std::move(t)); }
  ValueId ints(const std::vector<int64_t>& v, Shape s) { return g.add_constant("i", Tensor::from_int64(v, std::move(s))); }
  std::vector<ValueId> op_n(const std::string& op, const std::vector<ValueId>& ins, int n, AttrMap a = {}, const std::string& dom = "") {
    NodeId id = g.add_node_new_outputs(op, ins, n, std::move(a), "", dom);
    return g.node(id).outputs;
  }
  ValueId op(const std::string& op, const std::vector<ValueId>& ins, AttrMap a = {}, const std::string& dom = "") {
    return op_n(op, ins, 1, std::move(a), dom)[0];
  }
};

using BuildFn = std::function<ValueId(Builder&)>;

// loss = Σ y ∘ R; returns false if the graph could not be prepared.
double run_loss(const Graph& g, ValueId loss) {
  Graph h = g;
  h.set_outputs({loss});
  auto ex = Executor::create(h);
  EXPECT_TRUE(ex) << ex.status().message();
  auto out = (*ex)->run({});
  EXPECT_TRUE(out) << out.status().message();
  return (*out)[0].item();
}

void check_gradients(const std::string& name, const BuildFn& build, double tol = 1e-6) {
  SCOPED_TRACE(name);
  Builder b;
  ValueId y = build(b);
  // infer shapes of the forward graph
  InferShapesPass infer;
  auto r0 = infer.run(b.g);
  ASSERT_TRUE(r0) << r0.status().message();
  const Value yv = b.g.value(y);
  ASSERT_TRUE(is_floating(yv.dtype));
  ValueId R = b.constant(b.random(yv.shape));
  ValueId prod = b.op("Mul", {y, R});
  std::vector<int64_t> all;
  for (size_t i = 0; i < yv.shape.size(); ++i) all.push_back(static_cast<int64_t>(i));
  ValueId loss = b.op("ReduceSum", {prod}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}});
  auto r1 = infer.run(b.g);
  ASSERT_TRUE(r1) << r1.status().message();
  b.g.set_outputs({loss});

  Graph train = b.g;
  // parameters must be distinct storage from the FD graph's, which we perturb
  auto bw = build_backward(train, loss, b.params);
  ASSERT_TRUE(bw) << bw.status().message();
  std::vector<ValueId> outs{loss};
  for (ValueId p : b.params) {
    ASSERT_TRUE(bw->grads.count(p)) << "no gradient reaches " << b.g.value(p).name;
    outs.push_back(bw->grads.at(p));
  }
  train.set_outputs(outs);
  auto ex = Executor::create(train);
  ASSERT_TRUE(ex) << ex.status().message();
  auto res = (*ex)->run({});
  ASSERT_TRUE(res) << res.status().message();

  for (size_t pi = 0; pi < b.params.size(); ++pi) {
    ValueId p = b.params[pi];
    Tensor analytic = (*res)[pi + 1];
    ASSERT_EQ(analytic.shape(), b.g.value(p).shape);
    Tensor& t = b.g.value(p).constant;
    Tensor saved = t.clone();
    double* d = t.mutable_data<double>();
    double max_err = 0, max_ref = 1e-3;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double eps = 1e-6;
      double x0 = d[i];
      d[i] = x0 + eps;
      double lp = run_loss(b.g, loss);
      d[i] = x0 - eps;
      double lm = run_loss(b.g, loss);
      d[i] = x0;
      double num = (lp - lm) / (2 * eps);
      double ana = load_as_double(analytic.raw(), analytic.dtype(), i);
      max_err = std::max(max_err, std::abs(num - ana));
      max_ref = std::max(max_ref, std::abs(num));
    }
    EXPECT_LE(max_err / max_ref, tol) << "parameter " << pi << " (" << b.g.value(p).name << "): max abs error " << max_err
                                      << " against max |grad| " << max_ref;
  }
}

AttrMap attrs(std::initializer_list<std::pair<const std::string, Attribute>> a) {
  return AttrMap(a);
}
Attribute I(int64_t v) {
  return Attribute::of_int(v);
}
Attribute F(float v) {
  return Attribute::of_float(v);
}
Attribute Is(std::vector<int64_t> v) {
  return Attribute::of_ints(std::move(v));
}
Attribute S(std::string v) {
  return Attribute::of_string(std::move(v));
}

TEST(GradCheck, BinaryElementwiseWithBroadcasting) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    check_gradients(op, [op](Builder& b) { return b.op(op, {b.param({2, 3, 4}), b.param({3, 1}, 0.5, 1.5)}); });
    check_gradients(std::string(op) + " scalar", [op](Builder& b) {
      return b.op(op, {b.param({1}, 0.5, 1.5), b.param({2, 3}, 0.5, 1.5)});
    });
  }
  check_gradients("Pow const", [](Builder& b) {
    Tensor e(DType::kF64, {});
    *e.mutable_data<double>() = 3.0;
    return b.op("Pow", {b.param({2, 3}, 0.5, 1.5), b.constant(e)});
  });
  check_gradients("Pow both", [](Builder& b) { return b.op("Pow", {b.param({2, 3}, 0.5, 1.5), b.param({3}, 0.5, 2.0)}); });
  check_gradients("Max", [](Builder& b) { return b.op("Max", {b.param({2, 3}), b.param({2, 3})}); });
  check_gradients("Min", [](Builder& b) { return b.op("Min", {b.param({2, 3}), b.param({3})}); });
  check_gradients("Sum3", [](Builder& b) { return b.op("Sum", {b.param({2, 3}), b.param({3}), b.param({2, 1})}); });
  check_gradients("Mean2", [](Builder& b) { return b.op("Mean", {b.param({2, 3}), b.param({3})}); });
  check_gradients("Where", [](Builder& b) {
    Tensor c(DType::kBool, {2, 3});
    for (int i = 0; i < 6; ++i) c.mutable_data<uint8_t>()[i] = i % 2;
    return b.op("Where", {b.constant(c), b.param({2, 3}), b.param({3})});
  });
}

TEST(GradCheck, UnaryElementwise) {
  for (const char* op : {"Neg", "Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Sin", "Cos", "Abs", "Softplus", "Softsign", "Identity"}) {
    check_gradients(op, [op](Builder& b) { return b.op(op, {b.param({3, 5}, -2.0, 2.0)}); });
  }
  for (const char* op : {"Log", "Sqrt", "Reciprocal"}) {
    check_gradients(op, [op](Builder& b) { return b.op(op, {b.param({3, 5}, 0.5, 2.0)}); });
  }
  check_gradients("Clip", [](Builder& b) { return b.op("Clip", {b.param({4, 5}, -2, 2)}, attrs({{"min", F(-0.5f)}, {"max", F(0.7f)}})); });
  for (const char* op : {"LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish"}) {
    check_gradients(op, [op](Builder& b) { return b.op(op, {b.param({3, 5}, -2.0, 2.0)}); });
  }
  check_gradients("Gelu", [](Builder& b) { return b.op("Gelu", {b.param({3, 5}, -3, 3)}); });
  check_gradients("Gelu tanh", [](Builder& b) { return b.op("Gelu", {b.param({3, 5}, -3, 3)}, attrs({{"approximate", S("tanh")}})); });
  check_gradients("Silu", [](Builder& b) { return b.op("Silu", {b.param({3, 5}, -3, 3)}, {}, kOasesDomain); });
  check_gradients("SwiGLU", [](Builder& b) { return b.op("SwiGLU", {b.param({3, 5}, -3, 3), b.param({3, 5})}, {}, kOasesDomain); });
  check_gradients("PRelu", [](Builder& b) { return b.op("PRelu", {b.param({3, 5}, -2, 2), b.param({5})}); });
}

TEST(GradCheck, MatrixProducts) {
  check_gradients("MatMul 2D", [](Builder& b) { return b.op("MatMul", {b.param({3, 4}), b.param({4, 5})}); });
  check_gradients("MatMul weight", [](Builder& b) { return b.op("MatMul", {b.param({2, 3, 4}), b.param({4, 5})}); });
  check_gradients("MatMul batched broadcast", [](Builder& b) { return b.op("MatMul", {b.param({2, 1, 3, 4}), b.param({3, 4, 2})}); });
  check_gradients("MatMul vector left", [](Builder& b) { return b.op("MatMul", {b.param({4}), b.param({2, 4, 3})}); });
  check_gradients("MatMul vector right", [](Builder& b) { return b.op("MatMul", {b.param({2, 3, 4}), b.param({4})}); });
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      check_gradients("Gemm", [ta, tb](Builder& b) {
        Shape sa = ta ? Shape{4, 3} : Shape{3, 4}, sb = tb ? Shape{5, 4} : Shape{4, 5};
        return b.op("Gemm", {b.param(sa), b.param(sb), b.param({5})},
                    attrs({{"transA", I(ta)}, {"transB", I(tb)}, {"alpha", F(0.7f)}, {"beta", F(1.3f)}}));
      });
    }
  }
}

TEST(GradCheck, Reductions) {
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2"}) {
    check_gradients(op, [op](Builder& b) { return b.op(op, {b.param({2, 3, 4})}, attrs({{"axes", Is({1})}, {"keepdims", I(0)}})); });
    check_gradients(std::string(op) + " all", [op](Builder& b) { return b.op(op, {b.param({2, 3})}, attrs({{"keepdims", I(1)}})); });
  }
}

TEST(GradCheck, Normalisation) {
  check_gradients("Softmax", [](Builder& b) { return b.op("Softmax", {b.param({2, 3, 5}, -2, 2)}, attrs({{"axis", I(1)}})); });
  check_gradients("LogSoftmax", [](Builder& b) { return b.op("LogSoftmax", {b.param({3, 5}, -2, 2)}); });
  check_gradients("LayerNorm", [](Builder& b) {
    return b.op("LayerNormalization", {b.param({2, 3, 6}), b.param({6}), b.param({6})}, attrs({{"epsilon", F(1e-5f)}}));
  });
  check_gradients("LayerNorm 2 axes", [](Builder& b) {
    return b.op("LayerNormalization", {b.param({2, 3, 4}), b.param({3, 4})}, attrs({{"axis", I(1)}}));
  });
  check_gradients("RMSNorm", [](Builder& b) {
    return b.op("RMSNormalization", {b.param({2, 3, 6}), b.param({6})}, attrs({{"epsilon", F(1e-6f)}}), kOasesDomain);
  });
}

TEST(GradCheck, DataMovement) {
  check_gradients("Reshape", [](Builder& b) { return b.op("Reshape", {b.param({2, 6})}, attrs({{"shape", Is({3, 4})}})); });
  check_gradients("Transpose", [](Builder& b) { return b.op("Transpose", {b.param({2, 3, 4})}, attrs({{"perm", Is({2, 0, 1})}})); });
  check_gradients("Squeeze", [](Builder& b) { return b.op("Squeeze", {b.param({2, 1, 3})}, attrs({{"axes", Is({1})}})); });
  check_gradients("Unsqueeze", [](Builder& b) { return b.op("Unsqueeze", {b.param({2, 3})}, attrs({{"axes", Is({0, 2})}})); });
  check_gradients("Flatten", [](Builder& b) { return b.op("Flatten", {b.param({2, 3, 2})}, attrs({{"axis", I(2)}})); });
  check_gradients("Expand", [](Builder& b) { return b.op("Expand", {b.param({3, 1})}, attrs({{"shape", Is({2, 3, 4})}})); });
  check_gradients("Concat", [](Builder& b) { return b.op("Concat", {b.param({2, 3}), b.param({2, 2})}, attrs({{"axis", I(1)}})); });
  check_gradients("Split", [](Builder& b) {
    auto o = b.op_n("Split", {b.param({2, 7})}, 3, attrs({{"axis", I(1)}, {"split", Is({2, 4, 1})}}));
    return b.op("Mul", {o[1], o[1]});  // outputs 0 and 2 get no gradient: zeros fill in
  });
  check_gradients("Slice steps", [](Builder& b) {
    return b.op("Slice", {b.param({4, 7})},
                attrs({{"starts", Is({1, 6})}, {"ends", Is({4, 0})}, {"axes", Is({0, 1})}, {"steps", Is({2, -2})}}));
  });
  check_gradients("Pad", [](Builder& b) { return b.op("Pad", {b.param({2, 3})}, attrs({{"pads", Is({1, 0, 0, 2})}})); });
  check_gradients("Gather", [](Builder& b) {
    return b.op("Gather", {b.param({5, 3}), b.ints({4, 0, 4, 2, -1, 1}, {2, 3})});  // repeated rows accumulate
  });
  check_gradients("Gather axis 1", [](Builder& b) {
    return b.op("Gather", {b.param({2, 5, 3}), b.ints({3, 1}, {2})}, attrs({{"axis", I(1)}}));
  });
  check_gradients("GatherElements", [](Builder& b) {  // rotate-half style reads, repeated and negative indices
    return b.op("GatherElements", {b.param({3, 4}), b.ints({1, 1, 0, 3, -1, 2, 2, 0, 0, 3, 1, 1, 2, 2, 0}, {3, 5})},
                attrs({{"axis", I(1)}}));
  });
  check_gradients("GatherElements axis 0", [](Builder& b) {
    return b.op("GatherElements", {b.param({4, 2}), b.ints({3, 0, 3, 3, 1, 2}, {3, 2})});
  });
  check_gradients("GatherND", [](Builder& b) {  // slices of rows, one read twice
    return b.op("GatherND", {b.param({3, 4, 2}), b.ints({0, 1, 2, 3, 0, 1, -1, 0}, {2, 2, 2})});
  });
  check_gradients("GatherND whole rows", [](Builder& b) { return b.op("GatherND", {b.param({4, 3}), b.ints({2, 0, 2}, {3, 1})}); });
  check_gradients("Trilu", [](Builder& b) { return b.op("Trilu", {b.param({2, 4, 4})}, attrs({{"upper", I(0)}})); });
  check_gradients("CumSum", [](Builder& b) { return b.op("CumSum", {b.param({3, 4})}, attrs({{"axis", I(1)}, {"exclusive", I(1)}})); });
}

TEST(GradCheck, Attention) {
  auto qkv = [](Builder& b, int64_t h, int64_t hk) {
    return std::vector<ValueId>{b.param({2, h, 3, 4}), b.param({2, hk, 5, 4}), b.param({2, hk, 5, 2})};
  };
  check_gradients("Attention", [&](Builder& b) { return b.op("Attention", qkv(b, 2, 2), {}, kOasesDomain); });
  check_gradients("Attention causal GQA", [&](Builder& b) {
    return b.op("Attention", qkv(b, 4, 2), attrs({{"causal", I(1)}, {"scale", F(0.3f)}}), kOasesDomain);
  });
  check_gradients("Attention additive mask", [&](Builder& b) {
    auto in = qkv(b, 2, 2);
    Tensor m(DType::kF32, {2, 1, 1, 5});
    for (int i = 0; i < 10; ++i) m.mutable_data<float>()[i] = i % 5 == 4 ? -1e9f : 0.1f * static_cast<float>(i);
    in.push_back(b.constant(m));
    return b.op("Attention", in, {}, kOasesDomain);
  });
  check_gradients("Attention bool mask", [&](Builder& b) {
    auto in = qkv(b, 2, 2);
    Tensor m(DType::kBool, {1, 1, 3, 5});
    for (int i = 0; i < 15; ++i) m.mutable_data<uint8_t>()[i] = (i % 3) != 1;
    in.push_back(b.constant(m));
    return b.op("Attention", in, attrs({{"causal", I(1)}}), kOasesDomain);
  });
}

TEST(GradCheck, Losses) {
  for (const char* red : {"mean", "sum", "none"}) {
    check_gradients(std::string("SCE ") + red, [red](Builder& b) {
      return b.op("SoftmaxCrossEntropyLoss", {b.param({4, 5}, -2, 2), b.ints({1, 0, 4, 2}, {4})}, attrs({{"reduction", S(red)}}));
    });
  }
  check_gradients("SCE ignore + weights + extra dims", [](Builder& b) {
    return b.op("SoftmaxCrossEntropyLoss",
                {b.param({2, 5, 3}, -2, 2), b.ints({1, -100, 4, 2, 0, 3}, {2, 3}), b.constant(b.random({5}, 0.5, 1.5))},
                attrs({{"ignore_index", I(-100)}}));
  });
  check_gradients("NLL", [](Builder& b) {
    return b.op("NegativeLogLikelihoodLoss", {b.param({4, 5}), b.ints({1, 0, 4, 2}, {4})}, attrs({{"reduction", S("mean")}}));
  });
}

TEST(GradCheck, FanOutAndTiedWeightsAccumulate) {
  // one table used by a Gather (embedding) and a MatMul (tied head)
  check_gradients("tied", [](Builder& b) {
    ValueId w = b.param({6, 4});
    ValueId e = b.op("Gather", {w, b.ints({1, 5, 1}, {3})});
    ValueId wt = b.op("Transpose", {w}, attrs({{"perm", Is({1, 0})}}));
    ValueId logits = b.op("MatMul", {e, wt});
    return b.op("Add", {logits, b.op("Mul", {logits, logits})});
  });
}

TEST(GradCheck, IntegerInputsAreNotDifferentiated) {
  Builder b;
  ValueId w = b.param({5, 3});
  ValueId idx = b.g.add_input("ids", DType::kI64, {4});
  ValueId y = b.op("Gather", {w, idx});
  std::vector<int64_t> axes{0, 1};
  ValueId l = b.op("ReduceSum", {y}, attrs({{"axes", Is(axes)}, {"keepdims", I(0)}}));
  InferShapesPass infer;
  ASSERT_TRUE(infer.run(b.g));
  auto bw = build_backward(b.g, l, {w, idx});
  ASSERT_TRUE(bw) << bw.status().message();
  EXPECT_TRUE(bw->grads.count(w));
  EXPECT_FALSE(bw->grads.count(idx));
}

}  // namespace
}  // namespace oases
