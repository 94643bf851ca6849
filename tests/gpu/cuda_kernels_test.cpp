// The GPU suite: every CUDA kernel, forward and backward, against the CPU kernels, and training on
// the GPU against training on the CPU. Needs a CUDA device: on a machine without one every test
// reports itself SKIPPED (GTEST_SKIP, which CTest shows as skipped), never passed.
//
// Coverage by construction: each committed model's training graph (forward, loss, generated
// backward) runs on both devices with every intermediate value kept, and every float value is
// compared, so each op the models train with is checked forward and backward; targeted graphs add
// the cases the models do not reach (grouped-query and masked attention, ignored labels, odd sizes,
// 16-bit storage).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "executor/communicator.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/notes.h"
#include "executor/training.h"
#include "graph/passes/mixed_precision.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "tests/common/attention_graph.h"
#include "tests/common/loss_graph.h"
#include "tests/common/mlp_graph.h"
#include "tests/gpu/gpu_test_common.h"
#include "tools/model_loader.h"

namespace fs = std::filesystem;

namespace oases {
namespace {

using gpu_test::Loaded;
using gpu_test::source_dir;

Loaded load(const std::string& name, DType compute) {
  return gpu_test::load_small_model(name, compute);
}

// Runs g on the CPU and on the GPU keeping every value; compares every float value within `tol`
// of the largest magnitude of that value (per value). Returns the number compared.
int compare_devices(const Graph& g, const std::map<std::string, Tensor>& feeds, double tol) {
  ExecOptions cpu, gpu;
  for (size_t v = 0; v < g.num_values(); ++v) cpu.keep.insert(static_cast<ValueId>(v));
  gpu.keep = cpu.keep;
  gpu.device = "cuda";
  auto a = Executor::create(g, cpu);
  auto b = Executor::create(g, gpu);
  EXPECT_TRUE(a) << a.status().message();
  EXPECT_TRUE(b) << b.status().message();
  if (!a || !b) return 0;
  (*a)->state().training = (*b)->state().training = true;
  Status sa = (*a)->execute(feeds), sb = (*b)->execute(feeds);
  EXPECT_TRUE(sa.is_ok()) << sa.message();
  EXPECT_TRUE(sb.is_ok()) << sb.message();
  int compared = 0;
  const Graph& pg = (*a)->graph();
  for (NodeId id : pg.nodes()) {
    const Node& n = pg.node(id);
    for (ValueId v : n.outputs) {
      if (v == kNoId || !is_floating(pg.value(v).dtype)) continue;
      Tensor x = (*a)->read(v), y = (*b)->read(v);
      double scale = 1e-6, err = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        double p = load_as_double(x.raw(), x.dtype(), i), q = load_as_double(y.raw(), y.dtype(), i);
        scale = std::max(scale, std::abs(p));
        if (std::isfinite(p) || std::isfinite(q)) err = std::max(err, std::abs(p - q));
      }
      EXPECT_LE(err, tol * scale) << n.describe() << " output '" << pg.value(v).name << "' differs: max abs error " << err << ", max |cpu| "
                                  << scale;
      ++compared;
    }
  }
  return compared;
}

// The largest |cpu - gpu| of value v over its largest |cpu|, within `tol` of it; `nonzero` also
// asks that the value be more than all but zero (else the comparison would check nothing).
void expect_close(const Graph& g, ValueId v, const Executor& cpu, const Executor& gpu, double tol, bool nonzero) {
  Tensor x = cpu.read(v), y = gpu.read(v);
  double scale = 1e-6, err = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double p = load_as_double(x.raw(), x.dtype(), i), q = load_as_double(y.raw(), y.dtype(), i);
    scale = std::max(scale, std::abs(p));
    err = std::max(err, std::abs(p - q));
  }
  if (nonzero) EXPECT_GT(scale, 0.01) << "'" << g.value(v).name << "' is all but zero: the test would check nothing";
  EXPECT_LE(err, tol * scale) << "'" << g.value(v).name << "' differs: max abs error " << err << ", max |cpu| " << scale;
}

class CommittedModelsOnGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(CommittedModelsOnGpu, EveryForwardAndBackwardValueMatchesCpuFp32) {
  REQUIRE_GPU();
  Loaded m = load(GetParam(), DType::kF32);
  EXPECT_GT(compare_devices(m.tg.graph, m.feeds, 1e-4), 10);
}

TEST_P(CommittedModelsOnGpu, EveryValueMatchesCpuBf16) {
  REQUIRE_GPU();
  Loaded m = load(GetParam(), DType::kBF16);
  // both sides round to bf16 per op; the orders of their fp32 sums differ. Attention through both
  // 16-bit paths: cuDNN's fused kernels where they take the shape (the default; they round P and
  // dS to bf16 once), and the batched products (P and dS kept in fp32 as the CPU does). Run on an
  // H100 with cuDNN 9.14, 2026-11-26: both within the tolerance (docs/gpu-runs).
  const char* asked = std::getenv("OASES_CUDA_ATTENTION");
  for (const char* path : {"cudnn", "gemm"}) {
    ::setenv("OASES_CUDA_ATTENTION", path, 1);
    EXPECT_GT(compare_devices(m.tg.graph, m.feeds, 2e-2), 10) << "attention path " << path;
  }
  if (asked) {
    ::setenv("OASES_CUDA_ATTENTION", asked, 1);
  } else {
    ::unsetenv("OASES_CUDA_ATTENTION");
  }
}

std::vector<std::string> small_models() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(source_dir() / "models" / "small")) {
    if (fs::exists(e.path() / "model.onnx") && fs::exists(e.path() / "test_data_set_0")) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, CommittedModelsOnGpu, ::testing::ValuesIn(small_models()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Attention with grouped-query heads, a causal limit with Tq < Tk, an additive mask, and its
// backward pass through the generated gradient graph, on both CUDA paths (the batched products
// that runs take, and the own fused kernels), against the CPU.
struct AttentionCase {
  std::string path;  // OASES_CUDA_ATTENTION: "gemm" (the default) or "own"
  int64_t B, H, Hk, Tq, Tk, D;
};
class AttentionOnGpu : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionOnGpu, GqaCausalMaskForwardBackward) {
  REQUIRE_GPU();
  const AttentionCase& ac = GetParam();
  ::setenv("OASES_CUDA_ATTENTION", ac.path.c_str(), 1);
  Graph g;
  const int64_t B = ac.B, H = ac.H, Hk = ac.Hk, Tq = ac.Tq, Tk = ac.Tk, D = ac.D;
  ValueId q = g.add_input("q", DType::kF32, {B, H, Tq, D}), k = g.add_input("k", DType::kF32, {B, Hk, Tk, D});
  ValueId v = g.add_input("v", DType::kF32, {B, Hk, Tk, D}), dy = g.add_input("dy", DType::kF32, {B, H, Tq, D});
  Tensor mask(DType::kF32, {1, 1, Tq, Tk});
  for (int64_t i = 0; i < mask.numel(); ++i) mask.mutable_data<float>()[i] = (i % 3 == 0) ? -1.5f : 0.25f;
  ValueId mk = g.add_initializer("mask", mask);
  ValueId o = g.add_value("o", DType::kF32, {B, H, Tq, D}, true), lse = g.add_value("lse", DType::kF32, {B, H, Tq}, true);
  g.add_node("Attention", {q, k, v, mk}, {o, lse}, AttrMap{{"causal", Attribute::of_int(1)}}, "attn", "oases");
  ValueId dq = g.add_value("dq", DType::kF32, {B, H, Tq, D}, true), dk = g.add_value("dk", DType::kF32, {B, Hk, Tk, D}, true);
  ValueId dvv = g.add_value("dv", DType::kF32, {B, Hk, Tk, D}, true);
  g.add_node("AttentionGrad", {dy, q, k, v, o, lse, mk}, {dq, dk, dvv}, AttrMap{{"causal", Attribute::of_int(1)}}, "attn_grad", "oases");
  g.set_outputs({o, dq, dk, dvv});
  std::map<std::string, Tensor> feeds;
  uint32_t seed = 1;
  for (auto [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"q", {B, H, Tq, D}}, {"k", {B, Hk, Tk, D}}, {"v", {B, Hk, Tk, D}}, {"dy", {B, H, Tq, D}}}) {
    Tensor t(DType::kF32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      t.mutable_data<float>()[i] = static_cast<float>(seed >> 8) / 16777216.f - 0.5f;
    }
    feeds[name] = t;
  }
  EXPECT_EQ(compare_devices(g, feeds, 1e-4), 5);
  ::unsetenv("OASES_CUDA_ATTENTION");
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionOnGpu,
                         ::testing::Values(AttentionCase{"gemm", 2, 4, 2, 5, 7, 40}, AttentionCase{"own", 2, 4, 2, 5, 7, 40},
                                           AttentionCase{"gemm", 2, 8, 2, 64, 96, 64}, AttentionCase{"own", 2, 8, 2, 64, 96, 64},
                                           AttentionCase{"gemm", 1, 2, 2, 33, 33, 16}),
                         [](const ::testing::TestParamInfo<AttentionCase>& i) {
                           const AttentionCase& c = i.param;
                           return c.path + "_b" + std::to_string(c.B) + "h" + std::to_string(c.H) + "kv" + std::to_string(c.Hk) + "_q" +
                                  std::to_string(c.Tq) + "k" + std::to_string(c.Tk) + "d" + std::to_string(c.D);
                         });

// A device program's strided attention (graph/passes/fusion.h: oases.device.Attention and
// AttentionGrad read q, k, v from the fused projection and write dq, dk, dv into its gradient;
// tests/common/attention_graph.h) against the unfused chain on the CPU: bf16 and fp16 through
// cuDNN with strided tensors (the call counters must rise), fp32 and the other paths through
// contiguous copies. Only y and dx are compared: keeping every value would stop the fusion.
struct StridedCase {
  std::string name;
  DType type;
  std::string path;  // OASES_CUDA_ATTENTION: "" (cuDNN first), "gemm" or "own"
  int64_t B, T, H, Hkv, D;
  bool causal;
};
void PrintTo(const StridedCase& c, std::ostream* os) {
  *os << c.name;
}
class StridedAttentionOnGpu : public ::testing::TestWithParam<StridedCase> {};

TEST_P(StridedAttentionOnGpu, FusedQkvMatchesCpu) {
  REQUIRE_GPU();
  const StridedCase& c = GetParam();
  if (c.path.empty()) {
    ::unsetenv("OASES_CUDA_ATTENTION");
  } else {
    ::setenv("OASES_CUDA_ATTENTION", c.path.c_str(), 1);
  }
  set_verbose_notes(true);
  test::AttentionGraph a = test::fused_qkv_attention_graph(c.type, c.B, c.T, c.H, c.Hkv, c.D, c.causal);
  ExecOptions cpu, gpu;
  gpu.device = "cuda";
  auto prog = compile_program(a.g, gpu);
  ASSERT_TRUE(prog) << prog.status().message();
  EXPECT_EQ(prog->fusion.attention, 2) << "the device program should read and write the projections through strides";
  std::map<std::string, Tensor> feeds;
  uint32_t seed = 11;
  for (auto [name, shape] : std::vector<std::pair<std::string, Shape>>{{"x", {c.B, c.T, (c.H + 2 * c.Hkv) * c.D}}, {"dy", {c.B, c.T, c.H * c.D}}}) {
    Tensor x(c.type, shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      store_from_double(x.raw_mutable(), c.type, i, static_cast<double>(seed >> 8) / 8388608.0 - 1.0);
    }
    feeds[name] = x;
  }
  auto ca = Executor::create(a.g, cpu);
  auto gb = Executor::create(a.g, gpu);
  ASSERT_TRUE(ca) << ca.status().message();
  ASSERT_TRUE(gb) << gb.status().message();
  cuda::CudnnAttentionCalls before = cuda::cudnn_attention_calls();
  ASSERT_TRUE((*ca)->execute(feeds).is_ok());
  Status run = (*gb)->execute(feeds);
  ASSERT_TRUE(run.is_ok()) << run.message();
  cuda::CudnnAttentionCalls after = cuda::cudnn_attention_calls();
  set_verbose_notes(false);
  ::unsetenv("OASES_CUDA_ATTENTION");
  const double tol = c.type == DType::kF32 ? 1e-4 : 2e-2;  // the file's tolerances
  for (ValueId v : {a.y, a.dx}) expect_close(a.g, v, **ca, **gb, tol, false);
  if (c.type != DType::kF32 && c.path.empty()) {
    EXPECT_EQ(after.forward, before.forward + 1) << "the strided forward pass did not run on cuDNN (see the note above for why)";
    EXPECT_EQ(after.backward, before.backward + 1) << "the strided backward pass did not run on cuDNN (see the note above for why)";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, StridedAttentionOnGpu,
                         ::testing::Values(StridedCase{"bf16_cudnn_causal", DType::kBF16, "", 2, 128, 4, 4, 64, true},
                                           StridedCase{"bf16_cudnn_gqa", DType::kBF16, "", 2, 96, 8, 2, 64, false},
                                           StridedCase{"fp16_cudnn_causal_d128", DType::kF16, "", 1, 64, 2, 2, 128, true},
                                           StridedCase{"bf16_gemm_copies", DType::kBF16, "gemm", 2, 64, 4, 2, 64, true},
                                           StridedCase{"fp32_copies", DType::kF32, "", 2, 33, 4, 2, 40, true},
                                           StridedCase{"fp32_own_copies", DType::kF32, "own", 1, 17, 2, 1, 24, false}),
                         [](const ::testing::TestParamInfo<StridedCase>& i) { return i.param.name; });

// A training step's MLP with the GELU in the products' epilogues (graph/passes/fusion.h: the
// forward product writes the GELU and its input, cuBLASLt's GELU_AUX(_BIAS); the backward product
// writes the GELU's gradient and the bias gradient, DGELU(_BGRAD)) against the unfused chain on
// the CPU (tests/common/mlp_graph.h). Where the epilogues apply (16-bit, rows of a multiple of 8
// elements) the call counter must rise by two, so a silent fallback fails; where they do not (100
// columns), the kernels after the product must give the same values; fp32 prints which ran.
struct GeluCase {
  std::string name;
  DType type;
  int64_t B, T, C, F;
  bool bias;
  int epilogues;  // 1: cuBLASLt's epilogues must run, 0: must not (the kernels after the product), -1: either
};
class GeluEpiloguesOnGpu : public ::testing::TestWithParam<GeluCase> {};

TEST_P(GeluEpiloguesOnGpu, MatchTheCpu) {
  REQUIRE_GPU();
  const GeluCase& c = GetParam();
  test::MlpGraph m = test::gelu_mlp_graph(c.type, c.B, c.T, c.C, c.F, c.bias);
  ExecOptions cpu, gpu;
  gpu.device = "cuda";
  auto prog = compile_program(m.g, gpu);
  ASSERT_TRUE(prog) << prog.status().message();
  EXPECT_EQ(prog->fusion.gelu_aux, 1);
  EXPECT_EQ(prog->fusion.gelu_grad, 1);
  std::map<std::string, Tensor> feeds;
  uint32_t seed = 17;
  std::vector<std::pair<std::string, Shape>> ins{{"x", {c.B, c.T, c.C}}, {"w1", {c.C, c.F}}, {"w2", {c.F, c.C}}, {"dy", {c.B, c.T, c.C}}};
  if (c.bias) ins.push_back({"b1", {c.F}});
  for (auto [name, shape] : ins) {
    Tensor x(c.type, shape);
    const double scale = name[0] == 'w' ? 1.0 / std::sqrt(static_cast<double>(shape[0])) : 1.0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      store_from_double(x.raw_mutable(), c.type, i, scale * (static_cast<double>(seed >> 8) / 8388608.0 - 1.0));
    }
    feeds[name] = x;
  }
  auto ca = Executor::create(m.g, cpu);
  auto gb = Executor::create(m.g, gpu);
  ASSERT_TRUE(ca) << ca.status().message();
  ASSERT_TRUE(gb) << gb.status().message();
  const int64_t before = cuda::gelu_epilogue_calls();
  ASSERT_TRUE((*ca)->execute(feeds).is_ok());
  Status run = (*gb)->execute(feeds);
  ASSERT_TRUE(run.is_ok()) << run.message();
  const int64_t ran = cuda::gelu_epilogue_calls() - before;
  const double tol = c.type == DType::kF32 ? 1e-4 : 2e-2;  // the file's tolerances
  for (ValueId v : {m.y, m.dx, m.db1}) {
    if (v != kNoId) expect_close(m.g, v, **ca, **gb, tol, true);
  }
  if (c.epilogues >= 0) {
    EXPECT_EQ(ran, c.epilogues ? 2 : 0) << "cuBLASLt's GELU epilogues ran " << ran << " times (2: the forward and the backward product)";
  } else {
    std::printf("%s: cuBLASLt's GELU epilogues ran %lld of 2 times\n", c.name.c_str(), static_cast<long long>(ran));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GeluEpiloguesOnGpu,
                         ::testing::Values(GeluCase{"bf16_bias", DType::kBF16, 4, 64, 256, 1024, true, 1},
                                           GeluCase{"fp16_bias", DType::kF16, 2, 48, 128, 512, true, 1},
                                           GeluCase{"bf16_no_bias", DType::kBF16, 2, 32, 64, 256, false, 1},
                                           GeluCase{"fp32_bias", DType::kF32, 2, 33, 64, 96, true, -1},
                                           GeluCase{"bf16_odd_columns", DType::kBF16, 2, 16, 64, 100, true, 0}),
                         [](const ::testing::TestParamInfo<GeluCase>& i) { return i.param.name; });

// cuDNN's fused attention (kernels/cuda/attention_cudnn.cpp), forward and backward through the
// graph, in bf16 and fp16 against the CPU in the same type: head sizes 64 and 128, causal from the
// top-left (Tq = Tk) and from the bottom-right (Tq < Tk), grouped-query heads, additive masks read
// in place (broadcast over batch and heads) and converted (a key-padding mask broadcast over
// queries; 37 keys, whose fp32 rows are not 16-byte multiples). Each case checks the cuDNN call
// counter, so a silent fallback to the batched products fails; float32, which cuDNN refuses, must
// match through the fallback with the counter unchanged. --verbose's notes are on: the log says
// why cuDNN was not taken.
enum class MaskKind { kNone, kShared, kPerBatch, kKeyPadding };
struct CudnnCase {
  std::string name;
  DType type;
  int64_t B, H, Hk, Tq, Tk, D;
  bool causal;
  MaskKind mask;
};
void PrintTo(const CudnnCase& c, std::ostream* os) {
  *os << c.name;
}
class CudnnAttentionOnGpu : public ::testing::TestWithParam<CudnnCase> {};

TEST_P(CudnnAttentionOnGpu, ForwardAndBackwardMatchCpu) {
  REQUIRE_GPU();
  const CudnnCase& c = GetParam();
  ::unsetenv("OASES_CUDA_ATTENTION");
  set_verbose_notes(true);
  const int64_t B = c.B, H = c.H, Hk = c.Hk, Tq = c.Tq, Tk = c.Tk, D = c.D;
  const DType t = c.type;
  Graph g;
  ValueId q = g.add_input("q", t, {B, H, Tq, D}), k = g.add_input("k", t, {B, Hk, Tk, D});
  ValueId v = g.add_input("v", t, {B, Hk, Tk, D}), dy = g.add_input("dy", t, {B, H, Tq, D});
  std::vector<ValueId> fwd_in{q, k, v}, bwd_in{dy, q, k, v};
  if (c.mask != MaskKind::kNone) {
    Shape ms = c.mask == MaskKind::kShared ? Shape{1, 1, Tq, Tk} : c.mask == MaskKind::kPerBatch ? Shape{B, 1, Tq, Tk} : Shape{B, 1, 1, Tk};
    Tensor mask(DType::kF32, ms);
    float* m = mask.mutable_data<float>();
    for (int64_t i = 0; i < mask.numel(); ++i) {
      if (c.mask == MaskKind::kKeyPadding) {  // batch b > 0 cannot see its last 16·b keys
        int64_t b = i / Tk, j = i % Tk;
        m[i] = j >= Tk - 16 * b ? std::numeric_limits<float>::lowest() : 0.f;
      } else {
        m[i] = (i % 3 == 0) ? -1.5f : (i % 7 == 0) ? 0.75f : 0.25f;  // exact in bf16 and fp16
      }
    }
    ValueId mk = g.add_initializer("mask", mask);
    fwd_in.push_back(mk);
    bwd_in.push_back(mk);
  }
  AttrMap attrs{{"causal", Attribute::of_int(c.causal ? 1 : 0)}};
  ValueId o = g.add_value("o", t, {B, H, Tq, D}, true), lse = g.add_value("lse", DType::kF32, {B, H, Tq}, true);
  g.add_node("Attention", fwd_in, {o, lse}, attrs, "attn", "oases");
  bwd_in.insert(bwd_in.begin() + 4, {o, lse});  // dy, q, k, v, o, lse [, mask]
  ValueId dq = g.add_value("dq", t, {B, H, Tq, D}, true), dk = g.add_value("dk", t, {B, Hk, Tk, D}, true);
  ValueId dvv = g.add_value("dv", t, {B, Hk, Tk, D}, true);
  g.add_node("AttentionGrad", bwd_in, {dq, dk, dvv}, attrs, "attn_grad", "oases");
  g.set_outputs({o, dq, dk, dvv});
  std::map<std::string, Tensor> feeds;
  uint32_t seed = 7;
  for (auto [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"q", {B, H, Tq, D}}, {"k", {B, Hk, Tk, D}}, {"v", {B, Hk, Tk, D}}, {"dy", {B, H, Tq, D}}}) {
    Tensor x(t, shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      store_from_double(x.raw_mutable(), t, i, static_cast<double>(seed >> 8) / 8388608.0 - 1.0);  // [-1, 1)
    }
    feeds[name] = x;
  }
  const bool cudnn = t != DType::kF32;
  cuda::CudnnAttentionCalls before = cuda::cudnn_attention_calls();
  // the file's tolerances: 2e-2 of the largest magnitude in 16 bits (both sides round per op),
  // 1e-4 in fp32
  EXPECT_EQ(compare_devices(g, feeds, cudnn ? 2e-2 : 1e-4), 5);
  cuda::CudnnAttentionCalls after = cuda::cudnn_attention_calls();
  set_verbose_notes(false);
  if (cudnn) {
    EXPECT_EQ(after.forward, before.forward + 1) << "the forward pass did not run on cuDNN (see the note above for why)";
    EXPECT_EQ(after.backward, before.backward + 1) << "the backward pass did not run on cuDNN (see the note above for why)";
  } else {
    EXPECT_EQ(after.forward, before.forward) << "cuDNN took float32";
    EXPECT_EQ(after.backward, before.backward) << "cuDNN took float32";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudnnAttentionOnGpu,
    ::testing::Values(CudnnCase{"bf16_d64", DType::kBF16, 2, 4, 4, 128, 128, 64, false, MaskKind::kNone},
                      CudnnCase{"bf16_causal_d128", DType::kBF16, 2, 4, 4, 128, 128, 128, true, MaskKind::kNone},
                      CudnnCase{"bf16_gqa_causal", DType::kBF16, 2, 8, 2, 96, 96, 64, true, MaskKind::kNone},
                      CudnnCase{"bf16_gqa_causal_tq_lt_tk", DType::kBF16, 1, 4, 2, 64, 160, 64, true, MaskKind::kNone},
                      CudnnCase{"bf16_gqa_causal_shared_mask", DType::kBF16, 2, 4, 2, 64, 64, 64, true, MaskKind::kShared},
                      CudnnCase{"bf16_batch_mask_tq_ne_tk_d128", DType::kBF16, 2, 4, 4, 48, 96, 128, false, MaskKind::kPerBatch},
                      CudnnCase{"bf16_key_padding_mask", DType::kBF16, 2, 4, 4, 64, 64, 64, false, MaskKind::kKeyPadding},
                      CudnnCase{"bf16_causal_mask_37", DType::kBF16, 2, 2, 2, 37, 37, 64, true, MaskKind::kShared},
                      CudnnCase{"fp16_d64", DType::kF16, 2, 4, 4, 128, 128, 64, false, MaskKind::kNone},
                      CudnnCase{"fp16_causal_d128", DType::kF16, 2, 4, 4, 128, 128, 128, true, MaskKind::kNone},
                      CudnnCase{"fp16_gqa_causal_tq_lt_tk", DType::kF16, 1, 4, 2, 64, 160, 64, true, MaskKind::kNone},
                      CudnnCase{"fp16_gqa_shared_mask", DType::kF16, 2, 4, 2, 64, 64, 64, false, MaskKind::kShared},
                      CudnnCase{"fp32_refused_gqa_causal_mask", DType::kF32, 2, 4, 2, 64, 64, 64, true, MaskKind::kShared}),
    [](const ::testing::TestParamInfo<CudnnCase>& i) { return i.param.name; });

// GatherND (batch_dims 0 and 1, negative indices), ScatterND (none; add with a repeated index),
// CumSum (inclusive, exclusive and reverse), GatherElements and ScatterElements (add, repeated
// indices) on the GPU against the CPU; a bad index is reported.
Tensor ramp(DType t, const Shape& shape, double scale) {
  Tensor x(t, shape);
  for (int64_t i = 0; i < x.numel(); ++i) store_from_double(x.raw_mutable(), t, i, scale * static_cast<double>((i * 37) % 23) - 3.0);
  return x;
}
Tensor index_tensor(const Shape& shape, const std::vector<int64_t>& v) {
  Tensor x(DType::kI64, shape);
  for (size_t i = 0; i < v.size(); ++i) x.mutable_data<int64_t>()[i] = v[i];
  return x;
}

TEST(CudaKernels, GatherNdScatterNdCumSumMatchTheCpu) {
  REQUIRE_GPU();
  Graph g;
  ValueId data = g.add_input("data", DType::kF32, {2, 3, 4});
  ValueId i0 = g.add_initializer("i0", index_tensor({3, 2}, {0, 1, 1, -1, 0, 0}));
  ValueId i1 = g.add_initializer("i1", index_tensor({2, 2, 1}, {2, 0, -1, 1}));
  ValueId gn0 = g.add_value("gn0", DType::kF32, {3, 4}, true), gn1 = g.add_value("gn1", DType::kF32, {2, 2, 4}, true);
  g.add_node("GatherND", {data, i0}, {gn0}, AttrMap{}, "gnd0");
  g.add_node("GatherND", {data, i1}, {gn1}, AttrMap{{"batch_dims", Attribute::of_int(1)}}, "gnd1");
  ValueId si = g.add_initializer("si", index_tensor({3, 1}, {1, 0, 1}));
  ValueId upd = g.add_initializer("upd", ramp(DType::kF32, {3, 3, 4}, 0.5));
  ValueId sc0 = g.add_value("sc0", DType::kF32, {2, 3, 4}, true), sc1 = g.add_value("sc1", DType::kF32, {2, 3, 4}, true);
  ValueId si2 = g.add_initializer("si2", index_tensor({2, 1}, {1, 0}));
  ValueId upd2 = g.add_initializer("upd2", ramp(DType::kF32, {2, 3, 4}, 0.25));
  g.add_node("ScatterND", {data, si2, upd2}, {sc0}, AttrMap{}, "snd0");
  g.add_node("ScatterND", {data, si, upd}, {sc1}, AttrMap{{"reduction", Attribute::of_string("add")}}, "snd1");
  ValueId cs0 = g.add_value("cs0", DType::kF32, {2, 3, 4}, true), cs1 = g.add_value("cs1", DType::kF32, {2, 3, 4}, true);
  g.add_node("CumSum", {data}, {cs0}, AttrMap{{"axis", Attribute::of_int(1)}}, "cums0");
  g.add_node("CumSum", {data}, {cs1}, AttrMap{{"axis", Attribute::of_int(2)}, {"exclusive", Attribute::of_int(1)}, {"reverse", Attribute::of_int(1)}},
             "cums1");
  ValueId ge = g.add_initializer("ge", index_tensor({2, 2, 4}, {0, 2, 1, -1, 2, 2, 0, 1, 1, 0, 0, 2, -3, 1, 2, 0}));
  ValueId go = g.add_value("go", DType::kF32, {2, 2, 4}, true), so = g.add_value("so", DType::kF32, {2, 3, 4}, true);
  ValueId supd = g.add_initializer("supd", ramp(DType::kF32, {2, 2, 4}, 0.75));
  g.add_node("GatherElements", {data, ge}, {go}, AttrMap{{"axis", Attribute::of_int(1)}}, "gel");
  g.add_node("ScatterElements", {data, ge, supd}, {so}, AttrMap{{"axis", Attribute::of_int(1)}, {"reduction", Attribute::of_string("add")}},
             "sel");
  g.set_outputs({gn0, gn1, sc0, sc1, cs0, cs1, go, so});
  std::map<std::string, Tensor> feeds{{"data", ramp(DType::kF32, {2, 3, 4}, 1.0)}};
  EXPECT_EQ(compare_devices(g, feeds, 1e-6), 8);

  Graph bad;
  ValueId d2 = bad.add_input("data", DType::kF32, {2, 3, 4});
  ValueId ib = bad.add_initializer("ib", index_tensor({1, 2}, {0, 3}));
  ValueId ob = bad.add_value("ob", DType::kF32, {1, 4}, true);
  bad.add_node("GatherND", {d2, ib}, {ob}, AttrMap{}, "gnd_bad");
  bad.set_outputs({ob});
  ExecOptions gpu;
  gpu.device = "cuda";
  auto ex = Executor::create(bad, gpu);
  ASSERT_TRUE(ex) << ex.status().message();
  Status st = (*ex)->execute(feeds);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("gnd_bad"), std::string::npos) << st.message();
}

// Products whose rows are not 16-byte aligned (an odd vocabulary's logits, kernels/cuda/gemm_plan.h)
// run through padded copies: a misaligned result and weight (MatMul), a misaligned left operand
// (MatMul), a transposed misaligned left operand (MatMulT trans_a, the weight gradient) and a
// misaligned result of a transposed weight (MatMulT trans_b, tied logits), in fp32 and bf16,
// with the default scratch and with one small enough to split the results into blocks. The padded
// path's counter shows that it ran.
struct PaddedCase {
  DType type;
  size_t scratch;  // OASES_GEMM_PAD_SCRATCH; 0: the default
};
void PrintTo(const PaddedCase& c, std::ostream* os) {
  *os << dtype_name(c.type) << "_" << c.scratch;
}
class PaddedProductsOnGpu : public ::testing::TestWithParam<PaddedCase> {};

TEST_P(PaddedProductsOnGpu, MatchTheCpu) {
  REQUIRE_GPU();
  const PaddedCase& pc = GetParam();
  if (pc.scratch) ::setenv("OASES_GEMM_PAD_SCRATCH", std::to_string(pc.scratch).c_str(), 1);
  const DType t = pc.type;
  const int64_t M = 1024, K = 1024, V = 1027;  // m·n·k just over 2^30: padding pays
  Graph g;
  ValueId x = g.add_input("x", t, {M, K}), w = g.add_input("w", t, {K, V}), u = g.add_input("u", t, {V, K});
  ValueId wt = g.add_input("wt", t, {V, K});
  ValueId y = g.add_value("y", t, {M, V}, true), z = g.add_value("z", t, {M, K}, true);
  ValueId gw = g.add_value("gw", t, {V, K}, true), l = g.add_value("l", t, {M, V}, true);
  g.add_node("MatMul", {x, w}, {y}, AttrMap{}, "c_and_b_misaligned");
  g.add_node("MatMul", {y, u}, {z}, AttrMap{}, "a_misaligned");
  g.add_node("MatMulT", {y, x}, {gw}, AttrMap{{"trans_a", Attribute::of_int(1)}}, "a_transposed_misaligned", "oases");
  g.add_node("MatMulT", {x, wt}, {l}, AttrMap{{"trans_b", Attribute::of_int(1)}}, "c_misaligned", "oases");
  g.set_outputs({y, z, gw, l});
  std::map<std::string, Tensor> feeds;
  uint32_t seed = 7;
  for (auto [name, shape] : std::vector<std::pair<std::string, Shape>>{{"x", {M, K}}, {"w", {K, V}}, {"u", {V, K}}, {"wt", {V, K}}}) {
    Tensor v(t, shape);
    for (int64_t i = 0; i < v.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      store_from_double(v.raw_mutable(), t, i, static_cast<double>(seed >> 8) / 16777216.0 - 0.5);
    }
    feeds[name] = v;
  }
  const int64_t before = cuda::padded_gemm_calls();
  // fp32: sums in another order; bf16: one rounding of the result (2^-8) on both sides
  EXPECT_EQ(compare_devices(g, feeds, t == DType::kF32 ? 1e-4 : 1e-2), 4);
  EXPECT_EQ(cuda::padded_gemm_calls() - before, 4);
  if (pc.scratch) {  // the first product's result comes in blocks under this scratch
    cuda::GemmDesc d;
    d.m = M;
    d.n = V;
    d.k = K;
    d.lda = K;
    d.ldb = V;
    d.ldc = V;
    cuda::PaddedGemm p = cuda::plan_padded_gemm(dtype_size(t), d, 256, 256, 256, pc.scratch);
    EXPECT_TRUE(p.pad_b && p.pad_c);
    EXPECT_LT(p.block, M);
  }
  ::unsetenv("OASES_GEMM_PAD_SCRATCH");
}

INSTANTIATE_TEST_SUITE_P(Types, PaddedProductsOnGpu,
                         ::testing::Values(PaddedCase{DType::kF32, 0}, PaddedCase{DType::kBF16, 0}, PaddedCase{DType::kF32, size_t(6) << 20},
                                           PaddedCase{DType::kBF16, size_t(3) << 20}),
                         [](const ::testing::TestParamInfo<PaddedCase>& i) {
                           return std::string(dtype_name(i.param.type)) + (i.param.scratch ? "_blocks" : "_default");
                         });

// The device program's loss on 16-bit logits (graph/passes/fusion.h: the Casts around softmax
// cross-entropy folded into oases.device ops): the loss and the 16-bit gradient against the CPU's
// unfused chain, with ignored labels and scores that reach -inf; the GPU program must have fused.
TEST(CudaKernels, LossOnHalfLogitsMatchesTheCpu) {
  REQUIRE_GPU();
  for (DType half : {DType::kBF16, DType::kF16}) {
    const int64_t N = 64, C = 5003;
    test::LossGraph lg = test::cast_loss_graph(half, N, C);
    const Graph& g = lg.g;
    const ValueId loss = lg.loss, d16 = lg.dscores;
    Tensor xs(half, {N, C}), ls(DType::kI64, {N});
    uint32_t seed = 3;
    for (int64_t i = 0; i < xs.numel(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      double v = (static_cast<double>(seed >> 8) / 16777216.0 - 0.5) * 12.0;
      if (i % 997 == 5) v = -std::numeric_limits<double>::infinity();
      store_from_double(xs.raw_mutable(), half, i, v);
    }
    for (int64_t i = 0; i < N; ++i) ls.mutable_data<int64_t>()[i] = i % 9 == 4 ? -100 : (i * 131) % C;
    std::map<std::string, Tensor> feeds{{"x", xs}, {"labels", ls}};
    ExecOptions gpu;
    gpu.device = "cuda";
    auto a = Executor::create(g, ExecOptions{});
    auto b = Executor::create(g, gpu);
    ASSERT_TRUE(a) << a.status().message();
    ASSERT_TRUE(b) << b.status().message();
    EXPECT_EQ((*b)->program().fusion.loss_casts, 3) << "the GPU program should read the 16-bit logits";
    ASSERT_TRUE((*a)->execute(feeds).is_ok());
    Status st = (*b)->execute(feeds);
    ASSERT_TRUE(st.is_ok()) << st.message();
    double l0 = load_as_double((*a)->read(loss).raw(), DType::kF32, 0), l1 = load_as_double((*b)->read(loss).raw(), DType::kF32, 0);
    EXPECT_NEAR(l1, l0, 1e-5 * std::abs(l0)) << dtype_name(half);
    Tensor p = (*a)->read(d16), q = (*b)->read(d16);
    double scale = 0, err = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      double u = load_as_double(p.raw(), half, i), w = load_as_double(q.raw(), half, i);
      scale = std::max(scale, std::abs(u));
      err = std::max(err, std::abs(u - w));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(err, 1e-2 * scale) << dtype_name(half) << ": the gradient differs by " << err << " (largest " << scale << ")";
  }
}

// LayerNorm and RMSNorm forward and backward on rows the cached kernels take (n <= 2048: the row
// in registers, dx and the band's parameter sums in one pass; 37 rows leave a partial band) and on
// rows they do not (n = 3000), fp32 and bf16, against the CPU; GELU forward and backward on sizes
// with a tail after the 16-byte packs and on a misaligned view.
TEST(CudaKernels, NormsAndGeluMatchTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {int64_t(1024), int64_t(200), int64_t(3000)}) {
      const int64_t rows = 37;
      Graph g;
      ValueId x = g.add_input("x", t, {rows, n}), dy = g.add_input("dy", t, {rows, n});
      ValueId sc = g.add_initializer("scale", ramp(t, {n}, 0.125)), bi = g.add_initializer("bias", ramp(t, {n}, 0.25));
      ValueId y = g.add_value("y", t, {rows, n}, true), mean = g.add_value("mean", DType::kF32, {rows, 1}, true);
      ValueId rstd = g.add_value("rstd", DType::kF32, {rows, 1}, true);
      g.add_node("LayerNormalization", {x, sc, bi}, {y, mean, rstd}, AttrMap{{"axis", Attribute::of_int(-1)}}, "ln");
      ValueId dx = g.add_value("dx", t, {rows, n}, true), ds = g.add_value("ds", t, {n}, true), db = g.add_value("db", t, {n}, true);
      g.add_node("LayerNormGrad", {dy, x, sc, mean, rstd}, {dx, ds, db}, AttrMap{{"axis", Attribute::of_int(-1)}}, "ln_grad", "oases");
      ValueId ry = g.add_value("ry", t, {rows, n}, true), rr = g.add_value("rr", DType::kF32, {rows, 1}, true);
      g.add_node("RMSNormalization", {x, sc}, {ry, rr}, AttrMap{{"axis", Attribute::of_int(-1)}}, "rms", "oases");
      ValueId rdx = g.add_value("rdx", t, {rows, n}, true), rds = g.add_value("rds", t, {n}, true);
      g.add_node("RMSNormGrad", {dy, x, sc, rr}, {rdx, rds}, AttrMap{{"axis", Attribute::of_int(-1)}}, "rms_grad", "oases");
      ValueId gy = g.add_value("gy", t, {rows, n}, true), gdx = g.add_value("gdx", t, {rows, n}, true);
      g.add_node("Gelu", {x}, {gy}, AttrMap{{"approximate", Attribute::of_string("tanh")}}, "gelu");
      g.add_node("GeluGrad", {dy, x}, {gdx}, AttrMap{{"approximate", Attribute::of_string("tanh")}}, "gelu_grad", "oases");
      g.set_outputs({y, dx, ds, db, ry, rdx, rds, gy, gdx});
      std::map<std::string, Tensor> feeds{{"x", ramp(t, {rows, n}, 0.3)}, {"dy", ramp(t, {rows, n}, 0.05)}};
      // bf16: each side rounds its results once; fp32: sums in another order
      EXPECT_GE(compare_devices(g, feeds, t == DType::kF32 ? 1e-4 : 1e-2), 9) << dtype_name(t) << " n " << n;
    }
  }
}

// Casts among float32, float16 and bfloat16 (16-byte vectors of 8 elements and a tail; the
// mixed-precision parameters and gradients) give the CPU's bits, including values that round,
// overflow float16 and are infinite (NaN payloads may differ between the two conversions: none).
TEST(CudaKernels, CastsAmongFloatTypesMatchTheCpuBitForBit) {
  REQUIRE_GPU();
  const DType types[3] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType from : types) {
    for (DType to : types) {
      if (from == to) continue;
      for (int64_t n : {int64_t(8), int64_t(1037), int64_t(65536 + 5)}) {
        Graph g;
        ValueId x = g.add_input("x", from, {n});
        ValueId y = g.add_value("y", to, {n}, true);
        g.add_node("Cast", {x}, {y}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(to))}}, "cast");
        g.set_outputs({y});
        Tensor xs(from, {n});
        for (int64_t i = 0; i < n; ++i) {
          double v = (i % 97 == 0) ? 70000.0 * ((i % 2) ? 1 : -1) : 0.001 * static_cast<double>((i * 7919) % 20011) - 10.0;
          if (i % 1001 == 500) v = std::numeric_limits<double>::infinity();
          store_from_double(xs.raw_mutable(), from, i, v);
        }
        ExecOptions cpu, gpu;
        gpu.device = "cuda";
        auto a = Executor::create(g, cpu);
        auto b = Executor::create(g, gpu);
        ASSERT_TRUE(a && b);
        ASSERT_TRUE((*a)->execute({{"x", xs}}).is_ok());
        Status sb = (*b)->execute({{"x", xs}});
        ASSERT_TRUE(sb.is_ok()) << sb.message();
        Tensor p = (*a)->read(y), q = (*b)->read(y);
        ASSERT_EQ(p.nbytes(), q.nbytes());
        EXPECT_EQ(std::memcmp(p.raw(), q.raw(), p.nbytes()), 0) << dtype_name(from) << " -> " << dtype_name(to) << ", n " << n;
      }
    }
  }
}

// Training on the GPU follows training on the CPU step by step (AdamW, fp32).
TEST(CudaTraining, TwentyStepsFollowTheCpu) {
  REQUIRE_GPU();
  // two loads: a copied graph shares its parameters' storage, and each trainer updates its own
  Loaded m = load("gpt2_tiny", DType::kF32), m2 = load("gpt2_tiny", DType::kF32);
  ExecOptions gpu;
  gpu.device = "cuda";
  auto a = Trainer::create(m.tg, OptimizerConfig{});
  auto b = Trainer::create(m2.tg, OptimizerConfig{}, gpu);
  ASSERT_TRUE(a) << a.status().message();
  ASSERT_TRUE(b) << b.status().message();
  for (int s = 0; s < 20; ++s) {
    auto x = (*a)->step({m.feeds});
    auto y = (*b)->step({m.feeds});
    ASSERT_TRUE(x) << x.status().message();
    ASSERT_TRUE(y) << y.status().message();
    EXPECT_NEAR(y->loss, x->loss, 1e-3 * std::abs(x->loss)) << "step " << s + 1;
  }
}

}  // namespace
}  // namespace oases
