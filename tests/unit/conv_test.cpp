// Conv: the im2col + GEMM kernels (forward, input and weight gradients) against a direct loop
// over every output and kernel position, the shape rule (resolved attributes, auto_pad, the errors
// naming the node) and the opset versions read. Finite-difference gradients and the split states
// come from the op's registry examples (grad_check_test.cpp, op_registry_test.cpp).
// Also: an image classifier's inputs fed from token batches (InputRole::kImage).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "executor/training.h"
#include "graph/passes/pass.h"
#include "importer/onnx_import.h"
#include "kernels/cpu/conv.h"

namespace oases {
namespace {

using kernels::ConvShape;

ConvShape make_shape(int64_t n, int64_t c, int64_t m, std::vector<int64_t> in, std::vector<int64_t> k, std::vector<int64_t> st,
                     std::vector<int64_t> pads, std::vector<int64_t> dil) {
  ConvShape s;
  s.batch = n;
  s.in_channels = c;
  s.out_channels = m;
  s.in = in;
  s.kernel = k;
  s.strides = st;
  s.pads = pads;
  s.dilations = dil;
  size_t S = in.size();
  for (size_t d = 0; d < S; ++d) s.out.push_back((in[d] + pads[d] + pads[d + S] - dil[d] * (k[d] - 1) - 1) / st[d] + 1);
  return s;
}

std::vector<double> random_vector(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& e : v) e = u(g);
  return v;
}

// Calls f(n, m, c, out_index, kernel_index, in_index) for every pair of an output position and a
// kernel position whose input lies inside x (padding skipped): the definition of the convolution.
template <class F>
void for_each_tap(const ConvShape& s, F f) {
  const size_t S = s.in.size();
  const int64_t P = s.out_size(), K = s.kernel_size();
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t m = 0; m < s.out_channels; ++m) {
      for (int64_t c = 0; c < s.in_channels; ++c) {
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t k = 0; k < K; ++k) {
            int64_t pr = p, kr = k, in_off = 0, stride = 1;
            bool inside = true;
            for (size_t d = S; d-- > 0;) {
              int64_t o = pr % s.out[d], kk = kr % s.kernel[d];
              pr /= s.out[d];
              kr /= s.kernel[d];
              int64_t pos = o * s.strides[d] - s.pads[d] + kk * s.dilations[d];
              if (pos < 0 || pos >= s.in[d]) inside = false;
              in_off += pos * stride;
              stride *= s.in[d];
            }
            if (inside) f(n, m, c, p, k, in_off);
          }
        }
      }
    }
  }
}

void check_against_direct(const ConvShape& s, bool bias) {
  const int64_t D = s.in_size(), K = s.kernel_size(), P = s.out_size();
  auto x = random_vector(s.batch * s.in_channels * D, 1), w = random_vector(s.out_channels * s.in_channels * K, 2);
  auto b = random_vector(s.out_channels, 3), dy = random_vector(s.batch * s.out_channels * P, 4);
  std::vector<double> y(dy.size()), dx(x.size()), dw(w.size());
  kernels::conv_forward<double>(s, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
  kernels::conv_grad_input<double>(s, dy.data(), w.data(), dx.data());
  kernels::conv_grad_weight<double>(s, dy.data(), x.data(), dw.data());
  std::vector<double> ry(y.size(), 0.0), rdx(x.size(), 0.0), rdw(w.size(), 0.0);
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t m = 0; m < s.out_channels; ++m) {
      for (int64_t p = 0; p < P; ++p) ry[static_cast<size_t>((n * s.out_channels + m) * P + p)] = bias ? b[static_cast<size_t>(m)] : 0.0;
    }
  }
  for_each_tap(s, [&](int64_t n, int64_t m, int64_t c, int64_t p, int64_t k, int64_t i) {
    size_t yi = static_cast<size_t>((n * s.out_channels + m) * P + p);
    size_t xi = static_cast<size_t>((n * s.in_channels + c) * D + i);
    size_t wi = static_cast<size_t>((m * s.in_channels + c) * K + k);
    ry[yi] += w[wi] * x[xi];
    rdx[xi] += w[wi] * dy[yi];
    rdw[wi] += x[xi] * dy[yi];
  });
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ry[i], 1e-12) << "y[" << i << "]";
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(dx[i], rdx[i], 1e-12) << "dx[" << i << "]";
  for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(dw[i], rdw[i], 1e-12) << "dw[" << i << "]";
}

TEST(ConvKernel, PatchEmbeddingMatchesTheDirectSum) {
  check_against_direct(make_shape(2, 3, 5, {8, 8}, {4, 4}, {4, 4}, {0, 0, 0, 0}, {1, 1}), true);
}

TEST(ConvKernel, PaddedStridedDilatedMatchesTheDirectSum) {
  check_against_direct(make_shape(2, 2, 3, {7, 6}, {3, 2}, {2, 1}, {1, 0, 2, 1}, {1, 2}), true);
  check_against_direct(make_shape(1, 3, 2, {9}, {3}, {2}, {2, 1}, {2}), false);
  check_against_direct(make_shape(2, 2, 2, {4, 3, 3}, {2, 2, 1}, {1, 2, 1}, {1, 0, 0, 0, 1, 1}, {1, 1, 1}), true);
}

// --- the op in a graph --------------------------------------------------------------------------

onnx::ModelProto conv_model(int64_t opset, std::vector<int64_t> x, std::vector<int64_t> w,
                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& ints, const std::string& auto_pad = "") {
  onnx::ModelProto m;
  m.set_ir_version(7);
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* n = g->add_node();
  n->set_op_type("Conv");
  n->set_name("patch");
  for (const auto& [name, shape] : {std::pair{std::string("x"), x}, std::pair{std::string("w"), w}}) {
    n->add_input(name);
    auto* vi = g->add_input();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  for (const auto& [name, v] : ints) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t e : v) a->add_ints(e);
  }
  if (!auto_pad.empty()) {
    auto* a = n->add_attribute();
    a->set_name("auto_pad");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(auto_pad);
  }
  n->add_output("y");
  g->add_output()->set_name("y");
  return m;
}

// Imports the model and runs shape inference (the op's rule), as the tools do.
Expected<Graph> import_and_infer(const onnx::ModelProto& m, bool older = false) {
  ImportOptions o;
  o.allow_older_opsets = older;
  OASES_ASSIGN_OR_RETURN(Graph g, import_onnx_model(m, "", o));
  auto changed = InferShapesPass().run(g);
  if (!changed) return changed.status();
  return g;
}

Shape output_shape(const Graph& g) {
  return g.value(g.outputs().at(0)).shape;
}

TEST(ConvOp, EveryOpsetReadsTheSameOp) {
  for (int64_t opset : {11, 13, 17, 20, 21}) {
    auto g = import_and_infer(conv_model(opset, {2, 3, 16, 16}, {16, 3, 4, 4}, {{"strides", {4, 4}}}), true);
    ASSERT_TRUE(g) << "opset " << opset << ": " << g.status().message();
    EXPECT_EQ(output_shape(*g), (Shape{2, 16, 4, 4})) << "opset " << opset;
  }
}

TEST(ConvOp, AutoPadIsResolvedIntoPads) {
  auto g = import_and_infer(conv_model(17, {1, 2, 7, 6}, {3, 2, 3, 2}, {{"strides", {2, 2}}}, "SAME_LOWER"));
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(output_shape(*g), (Shape{1, 3, 4, 3}));
  for (NodeId id : g->nodes()) {
    const Node& n = g->node(id);
    if (n.op_type != "Conv") continue;
    // total padding: dim 0 (4-1)·2+3-7 = 2 -> 1,1; dim 1 (3-1)·2+2-6 = 0; the odd one first for LOWER
    EXPECT_EQ(n.attrs.get_ints("pads"), (std::vector<int64_t>{1, 0, 1, 0}));
    EXPECT_FALSE(n.attrs.has("auto_pad"));
  }
}

TEST(ConvOp, WhatIsNotSupportedIsAnErrorNamingTheNode) {
  struct Case {
    onnx::ModelProto model;
    std::string words;
  };
  std::vector<Case> cases = {
      {conv_model(17, {1, 4, 8, 8}, {4, 2, 3, 3}, {}), "reads 2 input channels"},
      {conv_model(17, {1, 2, 2, 2}, {3, 2, 3, 3}, {}), "too small for kernel"},
      {conv_model(17, {0, 2, 4, 4}, {3, 2, 3, 3}, {}), "zero-size"},
      {conv_model(17, {1, 2, 8, 8}, {3, 2, 3, 3}, {{"strides", {1}}}), "strides has 1 values for 2 spatial dims"},
      {conv_model(17, {1, 2, 8}, {3, 2, 3, 3}, {}), "must have the rank of X"},
  };
  // group 2 (an int attribute)
  {
    onnx::ModelProto m = conv_model(17, {1, 4, 8, 8}, {4, 2, 3, 3}, {});
    auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
    a->set_name("group");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(2);
    cases.push_back({m, "group 2 is not supported"});
  }
  for (const Case& c : cases) {
    auto g = import_and_infer(c.model);
    ASSERT_FALSE(g) << c.words;
    const std::string& msg = g.status().message();
    EXPECT_NE(msg.find("[Conv] node 'patch'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.words), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace oases

namespace oases {
namespace {

// An image classifier fed from token batches (--synthetic, --data): pixels standard normal, drawn
// per batch row from the row's tokens (the same batch gives the same images), one label per row.
TEST(ImageInputs, ImagesAndLabelsFromATokenBatch) {
  Graph g;
  ValueId px = g.add_input("pixel_values", DType::kF32, {2, 3, 8, 8});
  ValueId targets = g.add_input("oases_targets", DType::kI64, {2});
  auto roles = input_roles(g, targets);
  ASSERT_TRUE(roles) << roles.status().message();
  ASSERT_EQ(roles->size(), 2u);
  EXPECT_EQ((*roles)[0].kind, InputRole::kImage);
  EXPECT_EQ((*roles)[1].kind, InputRole::kTargets);
  (void)px;
  Batch b;
  b.batch = 2;
  b.seq = 3;
  b.inputs = {1, 2, 3, 4, 5, 6};
  b.targets = {7, 8, 9, 2, 1, 0};
  auto f1 = feeds_for_batch(g, *roles, b);
  auto f2 = feeds_for_batch(g, *roles, b);
  const Tensor& img = f1.at("pixel_values");
  ASSERT_EQ(img.shape(), (Shape{2, 3, 8, 8}));
  EXPECT_EQ(std::memcmp(img.raw(), f2.at("pixel_values").raw(), img.nbytes()), 0);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < img.numel(); ++i) {
    double v = img.data<float>()[i];
    sum += v;
    sq += v * v;
  }
  double mean = sum / static_cast<double>(img.numel()), var = sq / static_cast<double>(img.numel()) - mean * mean;
  EXPECT_LT(std::fabs(mean), 0.15);
  EXPECT_NEAR(var, 1.0, 0.2);
  // rows differ (their tokens do), and a row's pixels depend only on its own tokens
  EXPECT_NE(std::memcmp(img.raw(), img.data<float>() + 192, 192 * sizeof(float)), 0);
  Batch other = b;
  other.inputs[5] = 9;
  auto f3 = feeds_for_batch(g, *roles, other);
  EXPECT_EQ(std::memcmp(img.raw(), f3.at("pixel_values").raw(), 192 * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(img.data<float>() + 192, f3.at("pixel_values").data<float>() + 192, 192 * sizeof(float)), 0);
  const Tensor& labels = f1.at("oases_targets");
  EXPECT_EQ(labels.data<int64_t>()[0], 7);
  EXPECT_EQ(labels.data<int64_t>()[1], 2);
}

}  // namespace
}  // namespace oases
