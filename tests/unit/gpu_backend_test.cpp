// The GPU backend's logic that runs on the CPU (no GPU needed): the affine index maps every CUDA
// layout kernel walks, the dropout masks the CUDA kernels draw, the stream plan and its hazard
// check, loss scaling, the mixed-precision rewrite (trained on the CPU), and the CUDA kernel
// coverage of the ops the committed models train with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "executor/cpu/common.h"
#include "executor/device.h"
#include "executor/device_args.h"
#include "executor/executor.h"
#include "executor/loss_scaler.h"
#include "executor/stream_plan.h"
#include "executor/training.h"
#include "graph/op_registry.h"
#include "graph/passes/fusion.h"
#include "graph/passes/mixed_precision.h"
#include "graph/tiles.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layout.h"
#include "kernels/cuda/nd.h"
#include "kernels/cuda/random.h"
#include "tests/common/attention_graph.h"
#include "tests/common/loss_graph.h"
#include "tests/common/mlp_graph.h"
#include "tools/model_loader.h"

namespace fs = std::filesystem;

namespace oases {
namespace {

std::vector<float> iota_data(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f - 3.f;
  return v;
}

// --- affine maps vs the CPU layout kernels ------------------------------------------------------

TEST(CudaIndexMaps, TransposeMatchesCpu) {
  std::vector<int64_t> shape{2, 3, 4, 5};
  for (std::vector<int64_t> perm : {std::vector<int64_t>{0, 2, 1, 3}, {3, 2, 1, 0}, {1, 0, 3, 2}, {0, 1, 3, 2}}) {
    auto x = iota_data(120);
    std::vector<float> want(120), got(120, -1.f);
    kernels::transpose(x.data(), shape, perm, want.data(), sizeof(float));
    cuda::copy_host(cuda::transpose_plan(shape, perm), x.data(), got.data(), sizeof(float));
    EXPECT_EQ(got, want);
  }
}

// The copy kernel's 16-byte elements (widen_copy_plan): a transpose that keeps the last dim moves
// the same bytes as the element-wise plan; plans whose innermost walk is not whole vectors stay.
TEST(CudaIndexMaps, WideCopiesMoveTheSameBytes) {
  struct Case {
    std::vector<int64_t> shape, perm;
    size_t es;
    bool widens;
  };
  for (const Case& c : {Case{{2, 3, 4, 16}, {0, 2, 1, 3}, 2, true}, Case{{2, 5, 3, 8}, {0, 2, 1, 3}, 4, true},
                        Case{{3, 4, 8}, {1, 0, 2}, 2, true}, Case{{2, 3, 4, 12}, {0, 2, 1, 3}, 2, false},
                        Case{{4, 6}, {1, 0}, 2, false}, Case{{2, 3, 4, 16}, {0, 2, 1, 3}, 16, false}}) {
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    std::vector<unsigned char> x(static_cast<size_t>(n) * c.es), want(x.size(), 0), got(x.size(), 0);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<unsigned char>(i * 7 + 3);
    cuda::NdPlan p = cuda::transpose_plan(c.shape, c.perm), wide = p;
    cuda::copy_host(p, x.data(), want.data(), c.es);
    ASSERT_EQ(cuda::widen_copy_plan(wide, c.es), c.widens) << "shape " << c.shape.size() << "-d, es " << c.es;
    if (!c.widens) continue;
    EXPECT_EQ(wide.it.numel * 16, n * static_cast<int64_t>(c.es));
    cuda::copy_host(wide, x.data(), got.data(), 16);
    EXPECT_EQ(got, want);
  }
}

TEST(CudaIndexMaps, SliceAndScatterMatchCpu) {
  std::vector<int64_t> in{4, 6, 5}, starts{1, 5, 0}, steps{2, -2, 3}, out{2, 3, 2};
  auto x = iota_data(120);
  std::vector<float> want(12), got(12, -1.f);
  kernels::strided_slice(x.data(), in, starts, steps, want.data(), out, sizeof(float));
  cuda::copy_host(cuda::slice_plan(in, starts, steps, out), x.data(), got.data(), sizeof(float));
  EXPECT_EQ(got, want);
  // the same plan with its maps swapped scatters back (SliceGrad, Pad)
  std::vector<float> back_want(120, 0.f), back_got(120, 0.f);
  kernels::strided_scatter(want.data(), out, starts, steps, back_want.data(), in, sizeof(float));
  cuda::NdPlan p = cuda::slice_plan(in, starts, steps, out);
  std::swap(p.maps[0], p.maps[1]);
  cuda::copy_host(p, want.data(), back_got.data(), sizeof(float));
  EXPECT_EQ(back_got, back_want);
}

TEST(CudaIndexMaps, BoxRegionCopiesMatchTheTilesCopy) {
  // a Reshard's pack, unpack and local copies on the device (executor/cuda glue) against
  // graph/tiles.h copy_region on the host: a region of a [6, 7, 5] tensor between two boxes
  Box from{{1, 0, 1}, {5, 7, 4}}, to{{2, 3, 0}, {4, 4, 5}};
  for (const Box& region : {Box{{2, 3, 1}, {3, 4, 4}}, Box{{3, 4, 2}, {1, 2, 3}}, Box{{2, 3, 1}, {1, 1, 1}}}) {
    auto x = iota_data(static_cast<size_t>(from.numel()));
    std::vector<float> want(static_cast<size_t>(to.numel()), -1.f), got = want;
    copy_region(region, from, reinterpret_cast<const char*>(x.data()), to, reinterpret_cast<char*>(want.data()), sizeof(float));
    cuda::copy_host(cuda::box_copy_plan(region.offset, region.extent, from.offset, from.extent, to.offset, to.extent), x.data(), got.data(),
                    sizeof(float));
    EXPECT_EQ(got, want) << region.to_string();
  }
}

TEST(CudaIndexMaps, ConcatBroadcastTileAndRankMajorMatchCpu) {
  std::vector<int64_t> a{2, 3, 4}, b{2, 5, 4}, o{2, 8, 4};
  auto xa = iota_data(24), xb = iota_data(40);
  std::vector<float> want(64), got(64, -1.f);
  kernels::concat({xa.data(), xb.data()}, {a, b}, 1, want.data(), sizeof(float));
  cuda::copy_host(cuda::concat_part_plan(a, o, 1, 0), xa.data(), got.data(), sizeof(float));
  cuda::copy_host(cuda::concat_part_plan(b, o, 1, 3), xb.data(), got.data(), sizeof(float));
  EXPECT_EQ(got, want);

  std::vector<int64_t> s{3, 1, 4}, t{2, 3, 5, 4};
  auto xs = iota_data(12);
  std::vector<float> bw(120), bg(120, -1.f);
  kernels::broadcast_to(xs.data(), s, bw.data(), t);
  cuda::copy_host(cuda::broadcast_plan(t, {s}), xs.data(), bg.data(), sizeof(float));  // maps: out, in
  EXPECT_EQ(bg, bw);

  std::vector<float> rm(96), rg(96, -1.f), fm(96), fg(96, -1.f);
  auto xr = iota_data(96);
  kernels::to_rank_major(xr.data(), rm.data(), 2, 3, 4, 4 * sizeof(float));
  cuda::copy_host(cuda::to_rank_major_plan(2, 3, 4, 4), xr.data(), rg.data(), sizeof(float));
  EXPECT_EQ(rg, rm);
  kernels::from_rank_major(xr.data(), fm.data(), 2, 3, 4, 4 * sizeof(float));
  cuda::copy_host(cuda::from_rank_major_plan(2, 3, 4, 4), xr.data(), fg.data(), sizeof(float));
  EXPECT_EQ(fg, fm);

  std::vector<int64_t> ti{2, 3}, to{4, 9};
  auto xt = iota_data(6);
  std::vector<float> tw(36), tg(36, -1.f);
  kernels::tile(xt.data(), ti, tw.data(), to, sizeof(float));
  // the CUDA Tile glue's plan: [repeat, n] pairs, the input broadcast over the repeats
  std::vector<int64_t> shape, ost, ist, is = cuda::row_major_strides(ti), os = cuda::row_major_strides(to);
  for (size_t d = 0; d < ti.size(); ++d) {
    shape.insert(shape.end(), {to[d] / ti[d], ti[d]});
    ost.insert(ost.end(), {ti[d] * os[d], os[d]});
    ist.insert(ist.end(), {0, is[d]});
  }
  cuda::copy_host(cuda::make_plan(shape, {ost, ist}, {}), xt.data(), tg.data(), sizeof(float));
  EXPECT_EQ(tg, tw);
}

TEST(CudaIndexMaps, CoalescesAndRejectsTooManyDims) {
  cuda::NdPlan p = cuda::broadcast_plan({2, 3, 4, 5}, {{2, 3, 4, 5}});
  EXPECT_EQ(p.it.rank, 1);  // contiguous walk: one dim
  EXPECT_EQ(p.it.numel, 120);
  std::vector<int64_t> many(10, 2), perm(10);
  for (int i = 0; i < 10; ++i) perm[static_cast<size_t>(i)] = 9 - i;
  EXPECT_THROW(cuda::transpose_plan(many, perm), std::runtime_error);
}

// --- dropout masks: the CUDA kernels' map draws the CPU kernel's mask ---------------------------

TEST(CudaDropout, MasksMatchCpuKernelUnderChunkOffsets) {
  Graph g;
  Shape local{2, 3, 8};
  ValueId x = g.add_input("x", DType::kF32, local);
  ValueId y = g.add_value("y", DType::kF32, local, true), m = g.add_value("m", DType::kBool, local, true);
  AttrMap attrs{{"ratio", Attribute::of_float(0.3f)},
                {"training_mode", Attribute::of_int(1)},
                {"mask_shape", Attribute::of_ints({4, 3, 8})},
                {"mask_offsets", Attribute::of_ints({2, 0, 0})},
                {"key_node", Attribute::of_string("layer.0/drop")}};
  NodeId id = g.add_node("Dropout", {x}, {y, m}, attrs, "drop_chunk1");
  RunState st;
  st.seed = 77;
  st.step = 5;
  st.training = true;
  auto data = iota_data(48);
  std::vector<float> out(48);
  std::vector<uint8_t> mask(48);
  KernelContext c;
  c.graph = &g;
  c.node = &g.node(id);
  c.state = &st;
  c.in.push_back(TensorView{DType::kF32, local, data.data()});
  c.out.push_back(TensorView{DType::kF32, local, out.data()});
  c.out.push_back(TensorView{DType::kBool, local, mask.data()});
  const CpuKernelFn* fn = CpuKernelRegistry::global().find("", "Dropout");
  ASSERT_NE(fn, nullptr);
  (*fn)(c);
  cuda::DropoutArgs a = make_dropout_args(c, 0.3f);
  int kept = 0;
  for (int64_t i = 0; i < 48; ++i) {
    bool keep = cuda::dropout_keep(a, i);
    EXPECT_EQ(keep, mask[static_cast<size_t>(i)] != 0) << "element " << i;
    if (keep) {
      EXPECT_FLOAT_EQ(out[static_cast<size_t>(i)], data[static_cast<size_t>(i)] * a.scale);
    }
    kept += keep;
  }
  EXPECT_GT(kept, 20);
  EXPECT_LT(kept, 45);
}

// --- stream plan --------------------------------------------------------------------------------

// x -> MatMul(w1) -> h -> AllReduce -> r -> Add(r, h2), with h2 = MatMul(x, w2) computed while the
// all-reduce flies: start, compute, wait.
Program overlapped_program() {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {4, 8});
  Tensor w(DType::kF32, {8, 8});
  for (int64_t i = 0; i < 64; ++i) w.mutable_data<float>()[i] = 0.01f * static_cast<float>(i % 7);
  ValueId w1 = g.add_initializer("w1", w), w2 = g.add_initializer("w2", w);
  ValueId h = g.add_value("h", DType::kF32, {4, 8}, true), r = g.add_value("r", DType::kF32, {4, 8}, true);
  ValueId h2 = g.add_value("h2", DType::kF32, {4, 8}, true), o = g.add_value("o", DType::kF32, {4, 8}, true);
  NodeId mm1 = g.add_node("MatMul", {x, w1}, {h}, {}, "mm1");
  NodeId ar = g.add_node("AllReduce", {h}, {r}, AttrMap{{"mesh_axis", Attribute::of_int(0)}}, "ar", "oases");
  NodeId mm2 = g.add_node("MatMul", {x, w2}, {h2}, {}, "mm2");
  NodeId add = g.add_node("Add", {r, h2}, {o}, {}, "add");
  g.set_outputs({o});
  ExecOptions eo;
  eo.device = "cuda";  // a stream plan is for device programs (no CPU fusion); compiling needs no GPU
  eo.order = {{ScheduledOp::Kind::kCompute, mm1},
              {ScheduledOp::Kind::kCommStart, ar},
              {ScheduledOp::Kind::kCompute, mm2},
              {ScheduledOp::Kind::kCommWait, ar},
              {ScheduledOp::Kind::kCompute, add}};
  auto p = compile_program(std::move(g), eo);
  EXPECT_TRUE(p) << p.status().message();
  return std::move(*p);
}

TEST(StreamPlan, OneEventPerCrossStreamDependency) {
  Program p = overlapped_program();
  StreamPlan sp = build_stream_plan(p.instrs);
  EXPECT_EQ(sp.num_events, 2);  // inputs ready, collective done
  EXPECT_EQ(sp.launches[0], 3);
  EXPECT_EQ(sp.launches[1], 1);
  Status st = check_stream_plan(p, sp);
  EXPECT_TRUE(st.is_ok()) << st.message() << "\n" << describe(sp, p);
}

TEST(StreamPlan, ChannelTransfersRunOnTheirOwnStream) {
  // the same program with its collective on a channel (a Reshard's place): stream 2, not 1, and
  // the hazard check follows the third stream's events (dropping its wait is found)
  Program p = overlapped_program();
  StreamPlan sp = build_stream_plan(p.instrs, {false, true, false, false, false});
  EXPECT_EQ(sp.launches[0], 3);
  EXPECT_EQ(sp.launches[1], 0);
  EXPECT_EQ(sp.launches[2], 1);
  Status st = check_stream_plan(p, sp);
  EXPECT_TRUE(st.is_ok()) << st.message() << "\n" << describe(sp, p);
  EXPECT_NE(describe(sp, p).find("channel launch"), std::string::npos) << describe(sp, p);
  StreamPlan broken = sp;
  broken.ops.clear();
  for (const StreamOp& op : sp.ops) {
    if (!(op.kind == StreamOp::Kind::kWait && op.stream == 0)) broken.ops.push_back(op);
  }
  EXPECT_FALSE(check_stream_plan(p, broken).is_ok());
  // read from the nodes: a node without a channel attribute stays on stream 1
  EXPECT_EQ(build_stream_plan(p).launches[1], 1);
}

TEST(StreamPlan, HazardCheckFindsAMissingWait) {
  Program p = overlapped_program();
  StreamPlan sp = build_stream_plan(p.instrs);
  StreamPlan broken = sp;
  broken.ops.clear();
  for (const StreamOp& op : sp.ops) {
    if (!(op.kind == StreamOp::Kind::kWait && op.stream == 0)) broken.ops.push_back(op);
  }
  Status st = check_stream_plan(p, broken);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("unordered access"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'r'"), std::string::npos) << st.message();
  // and a collective launched before its inputs are ready
  StreamPlan early = sp;
  early.ops.clear();
  for (const StreamOp& op : sp.ops) {
    if (!(op.kind == StreamOp::Kind::kWait && op.stream == 1)) early.ops.push_back(op);
  }
  EXPECT_FALSE(check_stream_plan(p, early).is_ok());
}

// --- loss scaling -------------------------------------------------------------------------------

TEST(LossScaler, HalvesOnOverflowAndGrowsAfterAnInterval) {
  LossScalerConfig c;
  c.dynamic = true;
  c.init_scale = 1024;
  c.growth_interval = 3;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped(), 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024);  // three good steps in a row
  EXPECT_EQ(s.good_in_a_row(), 0);
  for (int i = 0; i < 40; ++i) s.update(false);
  EXPECT_EQ(s.scale(), c.min_scale);
  LossScaler r(c);
  ASSERT_TRUE(r.set_state(s.state()));
  EXPECT_EQ(r.scale(), s.scale());
  EXPECT_EQ(r.skipped(), s.skipped());
  EXPECT_FALSE(r.set_state("garbage"));
  LossScaler fixed(LossScalerConfig{});
  EXPECT_EQ(fixed.scale(), 1.0);
  EXPECT_FALSE(fixed.update(false));
  EXPECT_EQ(fixed.scale(), 1.0);
}

// --- mixed precision on the CPU ---------------------------------------------------------------

struct SmallModel {
  TrainingGraph tg;
  std::map<std::string, Tensor> feeds;
};

SmallModel load_small(const std::string& name, const std::string& dtype, bool loss_scale_input = false) {
  fs::path dir = fs::path(OASES_SOURCE_DIR) / "models" / "small" / name;
  fs::path data = dir / "test_data_set_0";
  SmallModel out;
  ImportOptions opts;
  for (int i = 0; fs::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i) {
    auto t = read_tensor_file((data / ("input_" + std::to_string(i) + ".pb")).string());
    EXPECT_TRUE(t) << t.status().message();
    out.feeds[t->first] = t->second;
    opts.input_shapes[t->first] = t->second.shape();
  }
  auto m = load_model((dir / "model.onnx").string(), opts);
  EXPECT_TRUE(m) << m.status().message();
  TrainingSpec spec;
  auto compute = compute_dtype_from_name(dtype);
  EXPECT_TRUE(compute);
  if (*compute != DType::kF32 || loss_scale_input) {
    DType c = *compute;
    spec.before_autodiff = [c, loss_scale_input](Graph g) -> Expected<Graph> {
      OASES_RETURN_IF_ERROR(apply_mixed_precision(g, c).status());
      if (loss_scale_input) OASES_RETURN_IF_ERROR(insert_loss_scale_input(g));
      return g;
    };
  }
  auto tg = build_training_graph(m->graph, spec);
  EXPECT_TRUE(tg) << tg.status().message();
  out.tg = std::move(*tg);
  if (out.tg.appended_loss) {
    auto roles = input_roles(out.tg.graph, out.tg.targets);
    for (const InputRole& r : *roles) {
      if (r.kind == InputRole::kTokens) out.feeds["oases_targets"] = shifted_targets(out.feeds.at(r.name), -100);
    }
  }
  return out;
}

double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.data<float>()[i], y = b.data<float>()[i];
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  return aa == 0 && bb == 0 ? 1.0 : ab / std::sqrt(aa * bb + 1e-30);
}

TEST(MixedPrecision, RejectsUnknownNames) {
  EXPECT_FALSE(compute_dtype_from_name("fp8"));
  EXPECT_EQ(*compute_dtype_from_name("bf16"), DType::kBF16);
}

class MixedPrecisionModels : public ::testing::TestWithParam<std::string> {};

// The rewritten graph computes its matrix products in the 16-bit type, keeps fp32 master weights
// and fp32 gradients, and its loss and gradients stay close to fp32's.
TEST_P(MixedPrecisionModels, TrainsCloseToFp32OnCpu) {
  const std::string dtype = GetParam();
  SmallModel ref = load_small("gpt2_tiny", "fp32"), mp = load_small("gpt2_tiny", dtype);
  DType compute = *compute_dtype_from_name(dtype);
  ASSERT_EQ(ref.tg.params.size(), mp.tg.params.size()) << "the same parameters train";
  int half_matmuls = 0, fp32_matmuls = 0;
  for (NodeId id : mp.tg.graph.nodes()) {
    const Node& n = mp.tg.graph.node(id);
    if (n.op_type != "MatMul" && n.op_type != "MatMulT") continue;
    (mp.tg.graph.value(n.outputs[0]).dtype == compute ? half_matmuls : fp32_matmuls)++;
  }
  EXPECT_GT(half_matmuls, 0);
  EXPECT_EQ(fp32_matmuls, 0) << "every matrix product runs in " << dtype;
  for (ValueId p : mp.tg.params) EXPECT_EQ(mp.tg.graph.value(p).dtype, DType::kF32);
  for (ValueId gv : mp.tg.grads) EXPECT_EQ(mp.tg.graph.value(gv).dtype, DType::kF32);
  EXPECT_EQ(mp.tg.graph.value(mp.tg.loss).dtype, DType::kF32);

  auto tr_ref = Trainer::create(ref.tg, OptimizerConfig{});
  auto tr_mp = Trainer::create(mp.tg, OptimizerConfig{});
  ASSERT_TRUE(tr_ref) << tr_ref.status().message();
  ASSERT_TRUE(tr_mp) << tr_mp.status().message();
  auto l_ref = (*tr_ref)->compute_gradients(ref.feeds);
  auto l_mp = (*tr_mp)->compute_gradients(mp.feeds);
  ASSERT_TRUE(l_ref) << l_ref.status().message();
  ASSERT_TRUE(l_mp) << l_mp.status().message();
  EXPECT_NEAR(*l_mp, *l_ref, 0.02 * std::abs(*l_ref)) << dtype << " loss vs fp32";
  double worst = 1;
  for (size_t i = 0; i < ref.tg.params.size(); ++i) {
    Tensor a = (*tr_ref)->gradient(i), b = (*tr_mp)->gradient(i);
    double norm = 0;
    for (int64_t j = 0; j < a.numel(); ++j) norm += double(a.data<float>()[j]) * a.data<float>()[j];
    if (norm < 1e-12) continue;  // gradients that are rounding noise in exact math
    worst = std::min(worst, cosine(a, b));
  }
  EXPECT_GT(worst, 0.98) << "the least aligned " << dtype << " gradient";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MixedPrecisionModels, ::testing::Values("bf16", "fp16"));

// The loss-gradient seed carries the loss scale; gradients are unscaled on the way out and a
// step with non-finite gradients leaves every parameter untouched.
TEST(LossScaling, ScaledGradientsMatchAndOverflowSkipsTheStep) {
  SmallModel m = load_small("gpt2_tiny", "fp32"), ms = load_small("gpt2_tiny", "fp32", true);
  auto a = Trainer::create(m.tg, OptimizerConfig{});
  auto b = Trainer::create(ms.tg, OptimizerConfig{});
  auto la = (*a)->compute_gradients(m.feeds);
  ASSERT_TRUE(a && b);
  (*b)->set_loss_scale(1024.0);
  auto lb = (*b)->compute_gradients(m.feeds);
  ASSERT_TRUE(la && lb);
  EXPECT_NEAR(*lb, *la, 1e-5 * std::abs(*la)) << "the reported loss is unscaled";
  // eval feeds no scale: the loss-scale input is fed 1
  auto ea = (*a)->eval_loss(m.feeds), eb = (*b)->eval_loss(m.feeds);
  ASSERT_TRUE(ea && eb);
  EXPECT_NEAR(*eb, *ea, 1e-6 * std::abs(*ea));
  for (size_t i = 0; i < m.tg.params.size(); ++i) {
    Tensor ga = (*a)->gradient(i), gb = (*b)->gradient(i);
    for (int64_t j = 0; j < ga.numel(); ++j) {
      ASSERT_NEAR(gb.data<float>()[j], ga.data<float>()[j], 1e-5 * (1 + std::abs(ga.data<float>()[j]))) << (*a)->param_name(i);
    }
  }
  (*b)->skip_nonfinite = true;
  (*b)->set_loss_scale(std::numeric_limits<double>::infinity());
  auto before = (*b)->parameters();
  std::map<std::string, Tensor> copy;
  for (auto& [k, v] : before) copy[k] = v.clone();
  auto st = (*b)->step({m.feeds});
  ASSERT_TRUE(st) << st.status().message();
  EXPECT_TRUE(st->skipped);
  EXPECT_EQ((*b)->optimizer().steps_taken(), 0);
  for (auto& [k, v] : (*b)->parameters()) {
    ASSERT_EQ(std::memcmp(v.raw(), copy.at(k).raw(), v.nbytes()), 0) << k << " changed in a skipped step";
  }
}

// --- CUDA kernel coverage -----------------------------------------------------------------------

TEST(CudaCoverage, EveryCpuOpHasACudaKernelOrAReason) {
  if (!cuda_built()) GTEST_SKIP() << "built without CUDA: no CUDA kernel registry to compare";
  std::set<std::string> cuda_ops;
  for (const std::string& op : cuda_kernel_ops()) cuda_ops.insert(op);
  for (const std::string& op : CpuKernelRegistry::global().ops()) {
    EXPECT_TRUE(cuda_ops.count(op) || cuda_exempt_ops().count(op)) << op << " has a CPU kernel, no CUDA kernel and no stated reason";
    EXPECT_FALSE(cuda_ops.count(op) && cuda_exempt_ops().count(op)) << op << " has a CUDA kernel and is still listed as exempt";
  }
  for (const auto& [op, why] : cuda_exempt_ops()) EXPECT_FALSE(why.empty()) << op;
}

// Every op of the committed models' training graphs (fp32 and bf16) has a CUDA kernel.
TEST(CudaCoverage, CommittedModelsTrainWithCudaKernelsOnly) {
  fs::path root = fs::path(OASES_SOURCE_DIR) / "models" / "small";
  int models = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!fs::exists(e.path() / "model.onnx") || !fs::exists(e.path() / "test_data_set_0")) continue;
    for (const char* dtype : {"fp32", "bf16"}) {
      SmallModel m = load_small(e.path().filename().string(), dtype);
      for (NodeId id : m.tg.graph.nodes()) {
        const Node& n = m.tg.graph.node(id);
        std::string key = n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "." + n.op_type;
        EXPECT_FALSE(cuda_exempt_ops().count(key))
            << e.path().filename().string() << " (" << dtype << ") trains with " << key << ", which has no CUDA kernel";
      }
    }
    ++models;
  }
  EXPECT_GT(models, 3);
}

// g and its fused copy f, each run by the CPU kernels as it stands (the executor's own fusion off)
// on `feeds`; null executors (with the failure reported) when either cannot be made or run.
struct RunPair {
  std::unique_ptr<Executor> ref, fused;
};
RunPair run_unfused_and_fused(const Graph& g, const Graph& f, const std::map<std::string, Tensor>& feeds) {
  ::setenv("OASES_NO_FUSION", "1", 1);
  auto ref = Executor::create(g, ExecOptions{});
  auto fused = Executor::create(f, ExecOptions{});
  ::unsetenv("OASES_NO_FUSION");
  EXPECT_TRUE(ref) << ref.status().message();
  EXPECT_TRUE(fused) << fused.status().message();
  if (!ref || !fused) return {};
  Status a = (*ref)->execute(feeds), b = (*fused)->execute(feeds);
  EXPECT_TRUE(a.is_ok()) << a.message();
  EXPECT_TRUE(b.is_ok()) << b.message();
  if (!a.is_ok() || !b.is_ok()) return {};
  return RunPair{std::move(*ref), std::move(*fused)};
}

// The largest |p - q| over two float32 tensors; *scale receives the largest |p|.
double max_abs_diff(const Tensor& p, const Tensor& q, double* scale) {
  double worst = 0;
  *scale = 0;
  for (int64_t i = 0; i < p.numel(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(p.data<float>()[i]) - q.data<float>()[i]));
    *scale = std::max(*scale, std::abs(static_cast<double>(p.data<float>()[i])));
  }
  return worst;
}

// The nodes of g with this domain and op type.
int count_ops(const Graph& g, const std::string& domain, const std::string& op) {
  int n = 0;
  for (NodeId id : g.nodes()) n += g.node(id).domain == domain && g.node(id).op_type == op;
  return n;
}

// Every oases.device node's shape rule gives the shapes its outputs have in f.
void expect_device_shapes(Graph& f) {
  for (NodeId id : f.nodes()) {
    const Node& n = f.node(id);
    if (n.domain != "oases.device") continue;
    std::vector<Shape> before;
    for (ValueId o : n.outputs) before.push_back(o == kNoId ? Shape{} : f.value(o).shape);
    InferContext ic(f, id);
    Status inf = find_schema(n)->infer(ic);
    ASSERT_TRUE(inf.is_ok()) << inf.message();
    for (size_t i = 0; i < before.size(); ++i) {
      if (n.outputs[i] != kNoId) EXPECT_EQ(f.value(n.outputs[i]).shape, before[i]) << n.describe();
    }
  }
}

// g and its fused copy f run by the CPU kernels: every float32 output of g (a training graph's
// loss and gradients) within 1e-5 of its largest magnitude. Returns the number compared.
int expect_same_float_outputs(const Graph& g, const Graph& f, const std::map<std::string, Tensor>& feeds) {
  RunPair r = run_unfused_and_fused(g, f, feeds);
  if (!r.ref || !r.fused) return 0;
  int compared = 0;
  for (ValueId v : g.outputs()) {
    Tensor p = r.ref->read(v), q = r.fused->read(v);
    EXPECT_EQ(p.shape(), q.shape()) << g.value(v).name;
    if (p.dtype() != DType::kF32 || p.shape() != q.shape()) continue;
    double scale = 0, worst = max_abs_diff(p, q, &scale);
    EXPECT_LE(worst, 1e-5 * std::max(scale, 1e-3)) << "'" << g.value(v).name << "' differs by " << worst << " (largest " << scale << ")";
    ++compared;
  }
  return compared;
}

// The CPU executor's fusion (oases.cpu ops, in-place outputs) is for the CPU kernels only: a
// program compiled for the GPU keeps the canonical graph and a plan without in-place outputs.
// A device program gets the products' fusion (oases.device.FusedMatMul, MatMulGeluGrad: cuBLASLt
// epilogues) and,
// in 16-bit programs, the loss reading the 16-bit logits; none of the CPU kernels' fused ops and no
// in-place outputs; OASES_NO_FUSION=1 leaves it as is.
TEST(CudaCoverage, DeviceProgramsFuseTheProductsAndTheLoss) {
  SmallModel m = load_small("gpt2_tiny", "fp32");
  auto count = [](const Program& p, const std::string& domain) {
    int n = 0;
    for (NodeId id : p.graph.nodes()) n += p.graph.node(id).domain == domain;
    return n;
  };
  ExecOptions cpu_opts;
  auto cpu = compile_program(m.tg.graph, cpu_opts);
  ASSERT_TRUE(cpu) << cpu.status().message();
  EXPECT_GT(count(*cpu, "oases.cpu"), 0) << "the CPU program should fuse something (else this test checks nothing)";
  EXPECT_EQ(count(*cpu, "oases.device"), 0);
  ExecOptions cuda_opts;
  cuda_opts.device = "cuda";
  auto dev = compile_program(m.tg.graph, cuda_opts);
  ASSERT_TRUE(dev) << dev.status().message();
  EXPECT_EQ(count(*dev, "oases.cpu"), 0);
  EXPECT_GT(count(*dev, "oases.device"), 0);
  for (NodeId id : dev->graph.nodes()) {
    const Node& n = dev->graph.node(id);
    if (n.domain == "oases.device") {
      EXPECT_TRUE(n.op_type == "FusedMatMul" || n.op_type == "MatMulGeluGrad" || n.op_type == "Attention" || n.op_type == "AttentionGrad")
          << n.describe();
    }
  }
  EXPECT_EQ(dev->memory.inplace, 0);
  EXPECT_EQ(dev->fusion.bias, cpu->fusion.bias) << "fp32: the device fuses the same biases as the CPU";
  ::setenv("OASES_NO_FUSION", "1", 1);
  auto plain = compile_program(m.tg.graph, cuda_opts);
  ::unsetenv("OASES_NO_FUSION");
  ASSERT_TRUE(plain) << plain.status().message();
  EXPECT_EQ(plain->graph.num_nodes(), m.tg.graph.num_nodes());
  // 16-bit programs fuse on the device (the CPU's epilogues are fp32/fp64 only)
  SmallModel b = load_small("gpt2_tiny", "bf16");
  auto dev16 = compile_program(b.tg.graph, cuda_opts);
  ASSERT_TRUE(dev16) << dev16.status().message();
  EXPECT_GT(dev16->fusion.bias, 0);
  // the loss and its gradient read the bf16 logits: the Cast to float32 and the one back are gone
  EXPECT_EQ(dev16->fusion.loss_casts, 3);
  std::set<std::string> device_ops;
  for (NodeId id : dev16->graph.nodes()) {
    const Node& n = dev16->graph.node(id);
    if (n.domain == "oases.device") device_ops.insert(n.op_type);
    if (n.domain == "oases.device" && n.op_type == "SoftmaxCrossEntropyGrad") {
      EXPECT_EQ(n.attrs.get_int("half_output", 0), 1);
      EXPECT_EQ(dev16->graph.value(n.outputs[0]).dtype, DType::kBF16);
    }
    if (n.domain == "oases.device" && n.op_type == "SoftmaxCrossEntropyLoss") {
      EXPECT_EQ(dev16->graph.value(n.inputs[0]).dtype, DType::kBF16);
    }
  }
  EXPECT_EQ(device_ops,
            (std::set<std::string>{"FusedMatMul", "MatMulGeluGrad", "Attention", "AttentionGrad", "SoftmaxCrossEntropyLoss",
                                   "SoftmaxCrossEntropyGrad"}));
  EXPECT_EQ(dev->fusion.loss_casts, 0) << "fp32 has no casts around the loss";
}

// The fused loss gives the unfused chain's values bit for bit: Cast → SoftmaxCrossEntropyLoss and
// SoftmaxCrossEntropyGrad → Cast (mean over the counted labels, one ignored) against the same
// graph after fuse_for_device, both run by the CPU kernels (which have the oases.device ops).
TEST(CudaCoverage, FusedLossMatchesTheCastsBitForBit) {
  for (DType half : {DType::kBF16, DType::kF16}) {
    const int64_t N = 6, C = 37;
    test::LossGraph lg = test::cast_loss_graph(half, N, C);
    const Graph& g = lg.g;
    const ValueId loss = lg.loss, d16 = lg.dscores;
    Graph f = g;
    std::vector<NodeId> order = f.nodes();
    FusionStats st = fuse_for_device(f, order, {});
    EXPECT_EQ(st.loss_casts, 3);
    EXPECT_EQ(order.size(), 2u);
    for (NodeId id : order) EXPECT_EQ(f.node(id).domain, "oases.device") << f.node(id).describe();
    std::map<std::string, Tensor> feeds;
    Tensor xs(half, {N, C}), ls = Tensor::from_int64({3, -100, 0, 36, 5, 5}, {N});
    for (int64_t i = 0; i < xs.numel(); ++i) store_from_double(xs.raw_mutable(), half, i, 0.37 * static_cast<double>((i * 29) % 17) - 2.5);
    feeds["x"] = xs;
    feeds["labels"] = ls;
    RunPair r = run_unfused_and_fused(g, f, feeds);
    ASSERT_TRUE(r.ref && r.fused);
    for (ValueId v : {loss, d16}) {
      Tensor p = r.ref->read(v), q = r.fused->read(v);
      ASSERT_EQ(p.nbytes(), q.nbytes());
      EXPECT_EQ(std::memcmp(p.raw(), q.raw(), p.nbytes()), 0) << dtype_name(half) << ": '" << g.value(v).name << "' differs";
    }
    EXPECT_GT(std::abs(load_as_double(r.ref->read(loss).raw(), DType::kF32, 0)), 0.1) << "a loss that checks something";
  }
}

// A device program's attention reads q, k, v where the projections left them and writes its
// gradients into the projections' gradient (oases.device.Attention / AttentionGrad): the head
// transposes, the qkv Split and the Concat of its gradient no longer run. The fused training graph,
// run by the CPU kernels (the references of the device ops), gives the unfused graph's loss and
// gradients: fused qkv (GPT-2, TorchScript and dynamo exports), separate projections with rotary
// embeddings and grouped-query heads (LLaMA), and a padding mask (BERT).
TEST(CudaCoverage, StridedAttentionMatchesTheTransposes) {
  for (const char* name : {"gpt2_tiny", "gpt2_dynamo", "llama_gqa", "llama_dynamo_dynamic", "bert_mask"}) {
    SCOPED_TRACE(name);
    SmallModel m = load_small(name, "fp32");
    const Graph& g = m.tg.graph;
    Graph f = g;
    std::vector<NodeId> order = f.nodes();
    FusionStats st = fuse_for_device(f, order, {});
    const int layers = count_ops(g, "oases", "Attention");
    ASSERT_GT(layers, 0) << "no fused attention to check";
    EXPECT_EQ(count_ops(f, "oases", "Attention") + count_ops(f, "oases", "AttentionGrad"), 0);
    EXPECT_EQ(count_ops(f, "oases.device", "Attention"), layers);
    EXPECT_EQ(count_ops(f, "oases.device", "AttentionGrad"), count_ops(g, "oases", "AttentionGrad"));
    EXPECT_EQ(st.attention, count_ops(f, "oases.device", "Attention") + count_ops(f, "oases.device", "AttentionGrad"));
    auto head_transposes = [](const Graph& h) {
      int n = 0;
      for (NodeId id : h.nodes()) {
        const Node& t = h.node(id);
        n += t.domain.empty() && t.op_type == "Transpose" && t.attrs.get_ints("perm") == std::vector<int64_t>{0, 2, 1, 3};
      }
      return n;
    };
    const int transposes = head_transposes(g), after = head_transposes(f);
    // each layer: at least v's transpose, the output's, dO's and dv's
    EXPECT_LE(after, transposes - 4 * layers) << transposes << " head transposes before fusion";
    if (std::string(name).rfind("gpt2", 0) == 0) {
      // fused qkv: every head transpose, the Split and the Concat of its gradient
      EXPECT_EQ(after, 0) << transposes << " head transposes before fusion";
      EXPECT_EQ(count_ops(f, "", "Split"), count_ops(g, "", "Split") - layers);
      EXPECT_EQ(count_ops(f, "", "Concat"), count_ops(g, "", "Concat") - layers);
      for (NodeId id : f.nodes()) {
        const Node& n = f.node(id);
        if (n.domain == "oases.device" && n.op_type == "AttentionGrad") {
          EXPECT_EQ(n.attrs.get_ints("packed_shape").size(), 3u) << n.describe();
        }
      }
    }
    ASSERT_TRUE(f.validate().is_ok()) << f.validate().message();
    expect_device_shapes(f);  // the fused ops' shape rules give the values they write
    EXPECT_GT(expect_same_float_outputs(g, f, m.feeds), 4) << "the loss and the gradients";
  }
}

// The same on the hand-built chain (tests/common/attention_graph.h): grouped-query heads, odd
// sizes, causal or not. Every head transpose, the Split and the Concat are gone; y and dx match.
TEST(CudaCoverage, StridedAttentionOverAFusedQkv) {
  struct Case {
    int64_t B, T, H, Hkv, D;
    bool causal;
  };
  for (const Case& k : {Case{2, 5, 4, 2, 3, true}, Case{1, 17, 2, 2, 8, false}, Case{3, 4, 6, 1, 5, true}}) {
    SCOPED_TRACE(::testing::Message() << "B" << k.B << " T" << k.T << " H" << k.H << "/" << k.Hkv << " D" << k.D);
    test::AttentionGraph a = test::fused_qkv_attention_graph(DType::kF32, k.B, k.T, k.H, k.Hkv, k.D, k.causal);
    Graph f = a.g;
    std::vector<NodeId> order = f.nodes();
    FusionStats st = fuse_for_device(f, order, {});
    EXPECT_EQ(st.attention, 2);
    std::map<std::string, int> ops;
    for (NodeId id : order) ops[f.node(id).domain + ":" + f.node(id).op_type]++;
    EXPECT_EQ(ops, (std::map<std::string, int>{{"oases.device:Attention", 1}, {"oases.device:AttentionGrad", 1}, {":Reshape", 2}}));
    std::map<std::string, Tensor> feeds;
    uint32_t seed = 3;
    for (auto [name, shape] : std::vector<std::pair<std::string, Shape>>{{"x", {k.B, k.T, (k.H + 2 * k.Hkv) * k.D}}, {"dy", {k.B, k.T, k.H * k.D}}}) {
      Tensor x(DType::kF32, shape);
      for (int64_t i = 0; i < x.numel(); ++i) {
        seed = seed * 1664525u + 1013904223u;
        x.mutable_data<float>()[i] = static_cast<float>(seed >> 8) / 8388608.f - 1.f;
      }
      feeds[name] = x;
    }
    RunPair r = run_unfused_and_fused(a.g, f, feeds);
    ASSERT_TRUE(r.ref && r.fused);
    for (ValueId v : {a.y, a.dx}) {
      Tensor p = r.ref->read(v), q = r.fused->read(v);
      ASSERT_EQ(p.shape(), q.shape());
      double scale = 0, worst = max_abs_diff(p, q, &scale);
      EXPECT_GT(scale, 0.01) << "'" << a.g.value(v).name << "' is all but zero: the test would check nothing";
      EXPECT_LE(worst, 1e-6 * scale) << "'" << a.g.value(v).name << "' differs by " << worst;
    }
  }
}

// A device program's MLP in training runs the GELU in the products' epilogues (cuBLASLt's
// GELU_AUX_BIAS and DGELU_BGRAD): the forward product writes the GELU and its input, which the
// gradient reads; the backward product writes the GELU's gradient and the bias gradient. The fused
// graph, run by the CPU kernels (the references of the device ops), gives the unfused graph's
// values: the hand-built MLP (tests/common/mlp_graph.h) with and without the bias, fp32 and bf16
// (where the fused ops round once where the chain rounded twice: the file's bf16 tolerance), and
// every committed GPT-2 export's training graph (the tanh GELU; loss and gradients within 1e-5).
TEST(CudaCoverage, GeluEpiloguesMatchTheUnfusedSteps) {
  auto ops_of = [](const Graph& f, const std::vector<NodeId>& order) {
    std::map<std::string, int> ops;
    for (NodeId id : order) ops[f.node(id).domain + ":" + f.node(id).op_type]++;
    return ops;
  };
  for (bool bias : {true, false}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << (bias ? " with the bias" : " without the bias"));
      const int64_t B = 2, T = 5, C = 16, F = 24;
      test::MlpGraph m = test::gelu_mlp_graph(t, B, T, C, F, bias);
      Graph f = m.g;
      std::vector<NodeId> order = f.nodes();
      FusionStats st = fuse_for_device(f, order, {});
      EXPECT_EQ(st.gelu_aux, 1);
      EXPECT_EQ(st.gelu_grad, 1);
      std::map<std::string, int> want{{"oases.device:FusedMatMul", 1}, {":MatMul", 1}, {"oases.device:MatMulGeluGrad", 1}, {"oases:MatMulT", 1}};
      if (bias) want[":Reshape"] = 1;
      EXPECT_EQ(ops_of(f, order), want);
      for (NodeId id : order) {
        const Node& n = f.node(id);
        if (n.op_type == "MatMulGeluGrad") EXPECT_EQ(n.outputs.size(), bias ? 2u : 1u) << n.describe();
        if (n.op_type == "FusedMatMul") EXPECT_EQ(n.outputs.size(), 2u) << n.describe();
      }
      ASSERT_TRUE(f.validate().is_ok()) << f.validate().message();
      expect_device_shapes(f);
      std::map<std::string, Tensor> feeds;
      uint32_t seed = 5;
      std::vector<std::pair<std::string, Shape>> ins{{"x", {B, T, C}}, {"w1", {C, F}}, {"w2", {F, C}}, {"dy", {B, T, C}}};
      if (bias) ins.push_back({"b1", {F}});
      for (auto [name, shape] : ins) {
        Tensor x(t, shape);
        for (int64_t i = 0; i < x.numel(); ++i) {
          seed = seed * 1664525u + 1013904223u;
          store_from_double(x.raw_mutable(), t, i, static_cast<double>(seed >> 8) / 8388608.0 - 1.0);
        }
        feeds[name] = x;
      }
      RunPair r = run_unfused_and_fused(m.g, f, feeds);
      ASSERT_TRUE(r.ref && r.fused);
      const double tol = t == DType::kF32 ? 1e-5 : 2e-2;
      for (ValueId v : {m.y, m.dx, m.db1}) {
        if (v == kNoId) continue;
        Tensor p = r.ref->read(v), q = r.fused->read(v);
        ASSERT_EQ(p.shape(), q.shape());
        double scale = 0, worst = 0;
        for (int64_t i = 0; i < p.numel(); ++i) {
          double a = load_as_double(p.raw(), t, i), b = load_as_double(q.raw(), t, i);
          worst = std::max(worst, std::abs(a - b));
          scale = std::max(scale, std::abs(a));
        }
        EXPECT_GT(scale, 0.01) << "'" << m.g.value(v).name << "' is all but zero: the test would check nothing";
        EXPECT_LE(worst, tol * scale) << "'" << m.g.value(v).name << "' differs by " << worst << " (largest " << scale << ")";
      }
    }
  }
  // the committed GPT-2 exports in training: every MLP's GELU and its gradient run in the products
  int fused_models = 0;
  for (const char* name : {"gpt2_tiny", "gpt2_dynamo", "gpt2_ts_opset20"}) {
    SCOPED_TRACE(name);
    SmallModel sm = load_small(name, "fp32");
    const Graph& g = sm.tg.graph;
    Graph f = g;
    std::vector<NodeId> order = f.nodes();
    FusionStats st = fuse_for_device(f, order, {});
    int gelus = 0;
    for (NodeId id : g.nodes()) {
      const Node& n = g.node(id);
      gelus += n.domain.empty() && n.op_type == "Gelu" && n.attrs.get_string("approximate", "none") == "tanh";
    }
    if (gelus == 0) continue;  // an export whose GELU is not the tanh form: nothing to fuse
    ++fused_models;
    EXPECT_EQ(st.gelu_aux, gelus);
    EXPECT_EQ(st.gelu_grad, count_ops(g, "oases", "GeluGrad"));
    EXPECT_EQ(count_ops(f, "", "Gelu"), 0);
    EXPECT_EQ(count_ops(f, "oases", "GeluGrad"), 0);
    ASSERT_TRUE(f.validate().is_ok()) << f.validate().message();
    expect_device_shapes(f);
    EXPECT_GT(expect_same_float_outputs(g, f, sm.feeds), 4) << "the loss and the gradients";
  }
  EXPECT_GT(fused_models, 0) << "no committed GPT-2 export has a tanh GELU to fuse";
  // OASES_NO_DEVICE_FUSION leaves the named device fusions out (bench/gpu/run.sh retries with it)
  SmallModel sm = load_small("gpt2_tiny", "fp32");
  for (const char* off : {"gelu", "attention", "gelu,attention"}) {
    ::setenv("OASES_NO_DEVICE_FUSION", off, 1);
    Graph f = sm.tg.graph;
    std::vector<NodeId> order = f.nodes();
    FusionStats st = fuse_for_device(f, order, {});
    ::unsetenv("OASES_NO_DEVICE_FUSION");
    const bool gelu_off = std::string(off).find("gelu") != std::string::npos, attention_off = std::string(off).find("attention") != std::string::npos;
    EXPECT_EQ(st.gelu_aux == 0, gelu_off) << off;
    EXPECT_EQ(st.gelu_grad == 0, gelu_off) << off;
    EXPECT_EQ(st.attention == 0, attention_off) << off;
    EXPECT_GT(st.bias, 0) << off << ": the products' bias epilogues stay";
  }
}

TEST(CudaDevice, UnusableDeviceIsAnError) {
  if (cuda_built() && cuda_usable().is_ok()) GTEST_SKIP() << "a CUDA device is present";
  Status st = cuda_usable();
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(st.message().find("built without CUDA") != std::string::npos ||
              st.message().find("no CUDA device found") != std::string::npos)
      << st.message();
  Program p = overlapped_program();
  ExecOptions eo;
  eo.device = "cuda";
  auto ex = Executor::create(p.graph, eo);
  EXPECT_FALSE(ex);
}

}  // namespace
}  // namespace oases
