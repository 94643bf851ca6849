// Issue 17 (hostile inputs): conversions with defined results, limits checked where they are set,
// shape rules that refuse what a kernel would read past its buffer for, memory limits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "executor/emulated_link.h"
#include "executor/executor.h"
#include "graph/passes/pass.h"
#include "kernels/cpu/parallel.h"
#include "tools/model_loader.h"

namespace oases {
namespace {

TEST(Conversions, FloatToIntegerTruncatesAndSaturates) {
  int16_t i16[6];
  const double in[6] = {1e9, -1e9, std::nan(""), 2.9, -2.9, INFINITY};
  for (int i = 0; i < 6; ++i) store_from_double(i16, DType::kI16, i, in[i]);
  EXPECT_EQ(i16[0], 32767);
  EXPECT_EQ(i16[1], -32768);
  EXPECT_EQ(i16[2], 0);
  EXPECT_EQ(i16[3], 2);
  EXPECT_EQ(i16[4], -2);
  EXPECT_EQ(i16[5], 32767);
  int64_t i64[3];
  store_from_double(i64, DType::kI64, 0, 1e30);
  store_from_double(i64, DType::kI64, 1, -1e30);
  store_from_double(i64, DType::kI64, 2, 9223372036854775808.0);  // 2^63: one past the largest
  EXPECT_EQ(i64[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64[1], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i64[2], std::numeric_limits<int64_t>::max());
  uint8_t u8[2];
  store_from_double(u8, DType::kU8, 0, -3.0);
  store_from_double(u8, DType::kU8, 1, 300.0);
  EXPECT_EQ(u8[0], 0);
  EXPECT_EQ(u8[1], 255);
}

TEST(Conversions, IndicesReadExactly) {
  const int64_t big[2] = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  EXPECT_EQ(load_as_int64(big, DType::kI64, 0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(load_as_int64(big, DType::kI64, 1), std::numeric_limits<int64_t>::min());
  const float f[2] = {1e30f, std::nanf("")};
  EXPECT_EQ(load_as_int64(f, DType::kF32, 0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(load_as_int64(f, DType::kF32, 1), 0);
}

TEST(CastKernel, FloatToInt16Saturates) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_constant("x", Tensor::from_f32({1e6f, -1e6f, 12.7f, -12.7f}, {4}));
  ValueId y = g.node(g.add_node_new_outputs("Cast", {x}, 1, AttrMap{{"to", Attribute::of_int(5)}}, "", "")).outputs[0];  // int16
  InferShapesPass infer;  // folds the Cast, with no evaluator it stays a node
  ASSERT_TRUE(infer.run(g));
  g.set_outputs({y});
  auto ex = Executor::create(g);
  ASSERT_TRUE(ex) << ex.status().message();
  auto out = (*ex)->run({});
  ASSERT_TRUE(out) << out.status().message();
  const int16_t* v = (*out)[0].data<int16_t>();
  EXPECT_EQ(v[0], 32767);
  EXPECT_EQ(v[1], -32768);
  EXPECT_EQ(v[2], 12);
  EXPECT_EQ(v[3], -12);
}

// GatherElements: output position i reads data at i off the axis, so larger indices there are refused.
TEST(ShapeRules, GatherElementsIndicesLargerThanDataOffTheAxis) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {2, 3});
  ValueId idx = g.add_constant("idx", Tensor::from_int64({0, 1, 2, 2, 1, 0, 0, 0, 0}, {3, 3}));
  NodeId n = g.add_node_new_outputs("GatherElements", {x, idx}, 1, AttrMap{{"axis", Attribute::of_int(1)}}, "gather_rows", "");
  g.set_outputs({g.node(n).outputs[0]});
  InferShapesPass infer;
  auto r = infer.run(g);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("gather_rows"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("axis 0"), std::string::npos) << r.status().message();
}

TEST(ShapeRules, SplitSizesMayNotBeNegative) {
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {2, 6});
  ValueId sizes = g.add_constant("sizes", Tensor::from_int64({-2, 8}, {2}));
  NodeId n = g.add_node_new_outputs("Split", {x, sizes}, 2, AttrMap{{"axis", Attribute::of_int(1)}}, "negative_split", "");
  g.set_outputs(g.node(n).outputs);
  InferShapesPass infer;
  auto r = infer.run(g);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("negative_split"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("-2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("negative"), std::string::npos) << r.status().message();
  // sizes whose sum would overflow int64
  Graph h;
  h.opset_imports[""] = 17;
  ValueId hx = h.add_input("x", DType::kF32, {2, 6});
  ValueId hs = h.add_constant("sizes", Tensor::from_int64({std::numeric_limits<int64_t>::max(), 7}, {2}));
  NodeId hn = h.add_node_new_outputs("Split", {hx, hs}, 2, AttrMap{{"axis", Attribute::of_int(1)}}, "huge_split", "");
  h.set_outputs(h.node(hn).outputs);
  auto rh = infer.run(h);
  ASSERT_FALSE(rh);
  EXPECT_NE(rh.status().message().find("huge_split"), std::string::npos) << rh.status().message();
}

TEST(Limits, LinkModelBounds) {
  EXPECT_TRUE(parse_link_model("bw=10,latency=50"));
  for (const char* bad : {"bw=10,latency=1e12", "bw=10,latency=-1", "bw=10,latency=nan", "bw=0", "bw=nan", "bw=inf", "bw=1e-300"}) {
    auto m = parse_link_model(bad);
    EXPECT_FALSE(m) << bad;
    if (!m) {
      EXPECT_NE(m.status().message().find(bad), std::string::npos) << m.status().message();
    }
  }
}

TEST(Limits, ThreadCountRange) {
  EXPECT_THROW(kernels::set_num_threads(100000), std::invalid_argument);
  EXPECT_THROW(kernels::set_num_threads(-1), std::invalid_argument);
  kernels::set_num_threads(2);
  EXPECT_EQ(kernels::num_threads(), 2);
  kernels::set_num_threads(0);
}

TEST(Limits, ByteSizes) {
  EXPECT_EQ(*parse_byte_size("512"), 512u);
  EXPECT_EQ(*parse_byte_size("64K"), 64u << 10);
  EXPECT_EQ(*parse_byte_size("1.5G"), 3u << 29);
  EXPECT_EQ(*parse_byte_size("2GiB"), uint64_t{2} << 30);
  for (const char* bad : {"", "lots", "-5", "0", "nan", "1e30", "5Q"}) EXPECT_FALSE(parse_byte_size(bad)) << bad;
}

TEST(Limits, MemoryLimitFollowsTheMachine) {
  uint64_t ram = physical_memory_bytes();
  ASSERT_GT(ram, 0u);
  EXPECT_LE(max_memory_bytes(), ram);
  EXPECT_LE(max_tensor_bytes(), kMaxTensorBytes);
}

// Untrusted dims (a model's initializer, found by the importer's fuzz target): an empty tensor is
// empty whatever its other dims, and a count past 64 bits is an error, never an overflow.
TEST(Limits, HugeDimsNeitherOverflowNorAllocate) {
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_EQ(shape_numel({huge, 2, 0}), 0);
  EXPECT_EQ(shape_numel({huge, 4}), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(shape_numel({3, 5}), 15);
  Tensor empty(DType::kF32, {huge, 2, 0});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_THROW(Tensor(DType::kF32, {huge, huge}), OasesError);
  EXPECT_THROW(Tensor(DType::kF32, {huge / 2, 3}), OasesError);
}

// A restoring guard: the limit is process-wide.
struct MemoryLimit {
  explicit MemoryLimit(uint64_t bytes) { set_max_memory_bytes(bytes); }
  ~MemoryLimit() { set_max_memory_bytes(0); }
};

TEST(Limits, TensorsAndArenaOverTheLimitAreErrors) {
  MemoryLimit limit(100 << 10);
  EXPECT_THROW(Tensor(DType::kF32, {1 << 20}), OasesError);
  // two 64 KiB outputs live to the end: each fits, the arena (128 KiB) does not
  Graph g;
  g.opset_imports[""] = 17;
  ValueId x = g.add_input("x", DType::kF32, {128, 128});
  ValueId a = g.node(g.add_node_new_outputs("Relu", {x}, 1, {}, "relu", "")).outputs[0];
  ValueId b = g.node(g.add_node_new_outputs("Neg", {x}, 1, {}, "neg", "")).outputs[0];
  g.set_outputs({a, b});
  InferShapesPass infer;
  ASSERT_TRUE(infer.run(g));
  auto ex = Executor::create(g);
  ASSERT_FALSE(ex);
  EXPECT_NE(ex.status().message().find("activation arena"), std::string::npos) << ex.status().message();
  EXPECT_NE(ex.status().message().find("102400"), std::string::npos) << ex.status().message();
}

TEST(Limits, ZeroSizedDimsFromTheCommandLineAreRefused) {
  ImportOptions opts;
  Status d = parse_dim_binding("sequence=0", &opts);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.message().find("sequence=0"), std::string::npos) << d.message();
  Status s = parse_shape_binding("input_ids=0,16", &opts);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("input_ids=0,16"), std::string::npos) << s.message();
  EXPECT_TRUE(parse_dim_binding("sequence=1", &opts).is_ok());
}

}  // namespace
}  // namespace oases
