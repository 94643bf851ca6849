// The ONNX importer: initializers of every dtype from raw_data and typed fields, external data
// (lazy, confined to the model's folder), IR versions and opsets, per-opset forms of the same op
// canonicalising alike, symbolic dimensions, model-local functions, and the errors on bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/passes/pass.h"
#include "tests/unit/onnx_test_util.h"

namespace oases {
namespace {

using namespace testutil;
using onnx::TensorProto;

// --- initializers: every dtype, raw_data and typed fields -------------------------------------

struct DTypeCase {
  std::string what;
  DType dtype;
  TensorProto proto;  // named "w", dims [2, 2]
  std::vector<double> want;
};

std::vector<DTypeCase> dtype_cases() {
  std::vector<DTypeCase> cases;
  auto add = [&](std::string what, DType dt, TensorProto t, std::vector<double> want) {
    t.set_name("w");
    t.clear_dims();
    t.add_dims(2);
    t.add_dims(2);
    cases.push_back({std::move(what), dt, std::move(t), std::move(want)});
  };
  std::vector<float> f = {1.5f, -2.25f, 0.f, 3e38f};
  add("float32 raw_data", DType::kF32, f32_tensor("w", {}, f, true), {1.5, -2.25, 0, 3e38f});
  add("float32 float_data", DType::kF32, f32_tensor("w", {}, f, false), {1.5, -2.25, 0, 3e38f});
  // float16 bits: 1, -2, 0.5, 65504
  std::vector<uint16_t> h = {0x3C00, 0xC000, 0x3800, 0x7BFF};
  add("float16 raw_data", DType::kF16, raw_tensor("w", TensorProto::FLOAT16, {}, as_bytes(h)), {1, -2, 0.5, 65504});
  add("float16 int32_data", DType::kF16, int32_field_tensor("w", TensorProto::FLOAT16, {}, {0x3C00, 0xC000, 0x3800, 0x7BFF}),
      {1, -2, 0.5, 65504});
  // bfloat16 bits: 1, -2, 0.5, 3
  std::vector<uint16_t> bf = {0x3F80, 0xC000, 0x3F00, 0x4040};
  add("bfloat16 raw_data", DType::kBF16, raw_tensor("w", TensorProto::BFLOAT16, {}, as_bytes(bf)), {1, -2, 0.5, 3});
  add("bfloat16 int32_data", DType::kBF16, int32_field_tensor("w", TensorProto::BFLOAT16, {}, {0x3F80, 0xC000, 0x3F00, 0x4040}),
      {1, -2, 0.5, 3});
  std::vector<int64_t> l = {-1, int64_t{1} << 40, 0, 7};
  add("int64 raw_data", DType::kI64, i64_tensor("w", {}, l, true), {-1, std::ldexp(1.0, 40), 0, 7});
  add("int64 int64_data", DType::kI64, i64_tensor("w", {}, l, false), {-1, std::ldexp(1.0, 40), 0, 7});
  std::vector<int32_t> i = {-1, 2, 2147483647, -2147483647 - 1};
  add("int32 raw_data", DType::kI32, raw_tensor("w", TensorProto::INT32, {}, as_bytes(i)), {-1, 2, 2147483647, -2147483648.0});
  add("int32 int32_data", DType::kI32, int32_field_tensor("w", TensorProto::INT32, {}, i), {-1, 2, 2147483647, -2147483648.0});
  add("bool raw_data", DType::kBool, raw_tensor("w", TensorProto::BOOL, {}, std::string("\1\0\1\1", 4)), {1, 0, 1, 1});
  add("bool int32_data", DType::kBool, int32_field_tensor("w", TensorProto::BOOL, {}, {1, 0, 1, 1}), {1, 0, 1, 1});
  return cases;
}

TEST(ImporterInitializers, EveryDTypeFromRawDataAndTypedFields) {
  for (const DTypeCase& c : dtype_cases()) {
    SCOPED_TRACE(c.what);
    TempDir d;
    ModelBuilder b(17);
    b.initializer(c.proto);
    b.output("w", c.proto.data_type());
    auto g = import_built(b, d);
    ASSERT_TRUE(g) << g.status().message();
    ValueId v = g->find_value("w");
    ASSERT_NE(v, kNoId);
    const Value& val = g->value(v);
    EXPECT_TRUE(val.is_initializer);
    EXPECT_EQ(val.dtype, c.dtype);
    EXPECT_EQ(val.shape, (Shape{2, 2}));
    EXPECT_EQ(val.constant.to_double(), c.want);
  }
}

TEST(ImporterInitializers, FloatsSurviveTheCanonicalPipelineAndExecution) {
  // f16 and bf16 weights feed a Cast to float32; the result equals the float32 weights.
  TempDir d;
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 2});
  std::vector<uint16_t> h = {0x3C00, 0xC000, 0x3800, 0x4200};  // 1, -2, 0.5, 3
  b.initializer(raw_tensor("wh", TensorProto::FLOAT16, {2, 2}, as_bytes(h)));
  b.initializer(int32_field_tensor("wb", TensorProto::BFLOAT16, {2, 2}, {0x3F80, 0xC000, 0x3F00, 0x4040}));
  b.node("Cast", {"wh"}, {"wh32"}, "cast_h", {attr_int("to", TensorProto::FLOAT)});
  b.node("Cast", {"wb"}, {"wb32"}, "cast_b", {attr_int("to", TensorProto::FLOAT)});
  b.node("Add", {"x", "wh32"}, {"s"}, "add_h");
  b.node("Add", {"s", "wb32"}, {"y"}, "add_b");
  b.output("y");
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  Tensor x = Tensor::from_f32({0.f, 1.f, 2.f, 3.f}, {2, 2});
  auto out = run_graph(m->graph, {{"x", x}});
  ASSERT_EQ(out.size(), 1u);
  expect_near(to_floats(out[0]), {2.f, -3.f, 3.f, 9.f});
}

TEST(ImporterInitializers, DataThatDoesNotFitTheShapeIsAnErrorNamingIt) {
  struct Bad {
    std::string what;
    TensorProto proto;
    std::vector<std::string> needles;
  };
  std::vector<Bad> bad = {
      {"raw_data too short",
       raw_tensor("short_w", TensorProto::FLOAT, {3, 4}, std::string(10, '\0')),
       {"short_w", "raw_data", "10 bytes", "48"}},
      {"raw_data too long", raw_tensor("long_w", TensorProto::FLOAT, {2}, std::string(12, '\0')), {"long_w", "12 bytes"}},
      {"float_data count", f32_tensor("count_w", {2, 2}, {1, 2, 3}, false), {"count_w", "3 values", "4"}},
      {"int64_data count", i64_tensor("count_i", {3}, {1, 2}, false), {"count_i", "2 values"}},
      {"int32_data count (bool)", int32_field_tensor("count_b", TensorProto::BOOL, {2}, {1, 0, 1}), {"count_b", "3 values"}},
      {"negative dim", raw_tensor("neg_w", TensorProto::FLOAT, {2, -3}, ""), {"neg_w", "negative"}},
      {"2^40 elements",
       raw_tensor("huge_w", TensorProto::FLOAT, {int64_t{1} << 20, int64_t{1} << 20}, std::string(16, '\0')),
       {"huge_w", "limit"}},
      {"dims overflow int64", raw_tensor("overflow_w", TensorProto::FLOAT, {int64_t{1} << 40, int64_t{1} << 40}, ""), {"overflow_w"}},
      {"string dtype", raw_tensor("string_w", TensorProto::STRING, {1}, "a"), {"string_w", "data type 8"}},
      {"undefined dtype", raw_tensor("undef_w", 0, {1}, "a"), {"undef_w", "data type 0"}},
      {"unnamed", raw_tensor("", TensorProto::FLOAT, {1}, std::string(4, '\0')), {"no name"}},
  };
  for (const Bad& c : bad) {
    SCOPED_TRACE(c.what);
    TempDir d;
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {1});
    b.initializer(c.proto);
    b.node("Relu", {"x"}, {"y"}, "relu");
    b.output("y");
    auto g = import_built(b, d);
    EXPECT_FALSE(g);
    for (const auto& n : c.needles) EXPECT_TRUE(fails_naming(g.status(), {n}));
  }
}

TEST(ImporterInitializers, TooShortDataOfABigShapeFailsWithoutAllocating) {
  // 2^33 float32 = 32 GiB is under the tensor size limit (raised here to its ceiling, 64 GiB,
  // above the default of half the machine's RAM): only checking the data before allocating keeps
  // this from taking the machine's memory. (A regression would OOM or be slow.)
  set_max_memory_bytes(kMaxTensorBytes);
  struct Restore {
    ~Restore() { set_max_memory_bytes(0); }
  } restore;
  TempDir d;
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {1});
  b.initializer(raw_tensor("big_w", TensorProto::FLOAT, {int64_t{1} << 33}, std::string(16, '\0')));
  b.initializer(f32_tensor("big_typed", {int64_t{1} << 33}, {1.f}, false));
  b.node("Relu", {"x"}, {"y"}, "relu");
  b.output("y");
  auto g = import_built(b, d);
  EXPECT_TRUE(fails_naming(g.status(), {"big_w", "raw_data"}));
  ModelBuilder b2(17);
  b2.input("x", TensorProto::FLOAT, {1});
  b2.initializer(f32_tensor("big_typed", {int64_t{1} << 33}, {1.f}, false));
  b2.node("Relu", {"x"}, {"y"}, "relu");
  b2.output("y");
  auto g2 = import_built(b2, d);
  EXPECT_TRUE(fails_naming(g2.status(), {"big_typed", "1 values"}));
}

TEST(ImporterInitializers, DuplicateInitializerIsAnError) {
  TempDir d;
  ModelBuilder b(17);
  b.init_f32("twice", {1}, {1.f});
  b.init_f32("twice", {1}, {2.f});
  b.output("twice");
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"twice", "defined twice"}));
}

// --- external data ----------------------------------------------------------------------------

// x[2,2] + w1[2,2] -> y ; w2 (int64[3]) is a second tensor of the same file.
ModelBuilder external_model(const std::string& location, int64_t offset1 = 16, int64_t length1 = 16, int64_t offset2 = 32) {
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 2});
  TensorProto t1 = f32_tensor("w1", {2, 2}, {});
  make_external(&t1, location, offset1, length1);
  b.initializer(t1);
  TensorProto t2 = i64_tensor("w2", {3}, {});
  make_external(&t2, location, offset2);
  b.initializer(t2);
  b.node("Add", {"x", "w1"}, {"y"}, "add");
  b.output("y");
  return b;
}

std::string external_bytes() {
  return std::string(16, 'x') + as_bytes(std::vector<float>{1.f, 2.f, 3.f, 4.f}) + as_bytes(std::vector<int64_t>{7, -8, int64_t{1} << 40});
}

TEST(ImporterExternalData, LoadsLazilyAtOffsetsAndRuns) {
  TempDir d;
  write_bytes(d / "weights.bin", external_bytes());
  auto g = import_built(external_model("weights.bin"), d);
  ASSERT_TRUE(g) << g.status().message();
  const Tensor& w1 = g->value(g->find_value("w1")).constant;
  const Tensor& w2 = g->value(g->find_value("w2")).constant;
  EXPECT_TRUE(w1.is_lazy());
  EXPECT_FALSE(w1.is_loaded());
  EXPECT_FALSE(w2.is_loaded());
  EXPECT_EQ(w2.to_int64(), (std::vector<int64_t>{7, -8, int64_t{1} << 40}));
  EXPECT_TRUE(w2.is_loaded());
  EXPECT_EQ(to_floats(w1), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));

  auto m = load_built(external_model("weights.bin"), d);
  ASSERT_TRUE(m) << m.status().message();
  auto out = run_graph(m->graph, {{"x", Tensor::from_f32({10.f, 20.f, 30.f, 40.f}, {2, 2})}});
  ASSERT_EQ(out.size(), 1u);
  expect_near(to_floats(out[0]), {11.f, 22.f, 33.f, 44.f});
}

TEST(ImporterExternalData, SubfolderAndSymlinkInsideTheFolderAreFine) {
  TempDir d;
  fs::create_directories(d / "data");
  write_bytes(d / "data" / "weights.bin", external_bytes());
  auto g = import_built(external_model("data/weights.bin"), d);
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(to_floats(g->value(g->find_value("w1")).constant), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  fs::create_symlink("data/weights.bin", d / "link.bin");
  auto g2 = import_built(external_model("link.bin"), d);
  ASSERT_TRUE(g2) << g2.status().message();
  EXPECT_EQ(to_floats(g2->value(g2->find_value("w1")).constant), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  // "./" and a detour through the folder itself stay inside.
  auto g3 = import_built(external_model("./data/../data/weights.bin"), d);
  EXPECT_TRUE(g3) << g3.status().message();
}

TEST(ImporterExternalData, MissingShortOrMisdescribedDataIsAnErrorNamingTheTensor) {
  TempDir d;
  write_bytes(d / "weights.bin", external_bytes());
  write_bytes(d / "short.bin", std::string(20, 'x'));
  EXPECT_TRUE(fails_naming(import_built(external_model("missing.bin"), d).status(), {"w1", "missing.bin", "does not exist"}));
  EXPECT_TRUE(fails_naming(import_built(external_model("short.bin"), d).status(), {"w1", "short.bin", "20 bytes"}));
  EXPECT_TRUE(fails_naming(import_built(external_model("weights.bin", 16, 12), d).status(), {"w1", "length 12"}));
  EXPECT_TRUE(fails_naming(import_built(external_model("weights.bin", 16, 16, 48), d).status(), {"w2", "offset 48"}));
  EXPECT_TRUE(fails_naming(import_built(external_model(""), d).status(), {"w1", "empty location"}));
  fs::create_directories(d / "a_folder");
  EXPECT_TRUE(fails_naming(import_built(external_model("a_folder"), d).status(), {"w1", "a_folder"}));

  ModelBuilder b = external_model("weights.bin");
  auto* kv = b.graph().mutable_initializer(0)->add_external_data();
  kv->set_key("offset");
  kv->set_value("sixteen");
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"w1", "offset", "sixteen"}));
  ModelBuilder b2 = external_model("weights.bin");
  kv = b2.graph().mutable_initializer(0)->add_external_data();
  kv->set_key("offset");
  kv->set_value("-16");
  EXPECT_TRUE(fails_naming(import_built(b2, d).status(), {"w1", "-16"}));
}

TEST(ImporterExternalData, PathsLeavingTheModelFolderAreErrors) {
  TempDir d;
  fs::create_directories(d / "model");
  fs::create_directories(d / "model_evil");
  write_bytes(d / "outside.bin", external_bytes());
  write_bytes(d / "model_evil" / "weights.bin", external_bytes());
  std::string outside_abs = fs::absolute(d / "outside.bin").string();
  fs::create_symlink(outside_abs, d / "model" / "link_out.bin");
  fs::create_symlink(fs::absolute(d.path()), d / "model" / "up");
  auto import_in_model = [&](const std::string& location) {
    return import_onnx_file(external_model(location).write(d / "model" / "m.onnx").string());
  };
  for (const std::string& loc : {std::string("../outside.bin"), std::string("sub/../../outside.bin"), outside_abs,
                                 std::string("link_out.bin"), std::string("up/outside.bin"), std::string("../model_evil/weights.bin")}) {
    SCOPED_TRACE(loc);
    auto g = import_in_model(loc);
    EXPECT_FALSE(g);
    EXPECT_TRUE(fails_naming(g.status(), {"w1", loc}));
  }
  EXPECT_TRUE(fails_naming(import_in_model(outside_abs).status(), {"absolute"}));
  EXPECT_TRUE(fails_naming(import_in_model("../outside.bin").status(), {"leaves the model's folder"}));
}

TEST(ImporterExternalData, NoFolderMeansNoExternalData) {
  ModelBuilder b = external_model("weights.bin");
  auto g = import_onnx_model(b.proto(), "");
  EXPECT_TRUE(fails_naming(g.status(), {"w1", "weights.bin"}));
}

TEST(ImporterExternalData, DataChangedAfterImportIsAnErrorOnLoad) {
  TempDir d;
  write_bytes(d / "weights.bin", external_bytes());
  auto g = import_built(external_model("weights.bin"), d);
  ASSERT_TRUE(g) << g.status().message();
  fs::resize_file(d / "weights.bin", 20);
  const Tensor& w1 = g->value(g->find_value("w1")).constant;
  EXPECT_TRUE(fails_naming(w1.load(), {"w1", "weights.bin"}));
  EXPECT_THROW(w1.raw(), OasesError);
}

TEST(ImporterExternalData, ConstantNodeTensorsMayBeExternalToo) {
  TempDir d;
  write_bytes(d / "weights.bin", external_bytes());
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 2});
  TensorProto t = f32_tensor("", {2, 2}, {});
  make_external(&t, "weights.bin", 16, 16);
  b.node("Constant", {}, {"c"}, "const", {attr_tensor("value", t)});
  b.node("Add", {"x", "c"}, {"y"}, "add");
  b.output("y");
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  auto out = run_graph(m->graph, {{"x", Tensor::from_f32({1.f, 1.f, 1.f, 1.f}, {2, 2})}});
  ASSERT_EQ(out.size(), 1u);
  expect_near(to_floats(out[0]), {2.f, 3.f, 4.f, 5.f});
  // ... and are confined like initializers.
  fs::create_directories(d / "m");
  make_external(&t, "../weights.bin", 16, 16);
  b.graph().mutable_node(0)->clear_attribute();
  *b.graph().mutable_node(0)->add_attribute() = attr_tensor("value", t);
  EXPECT_TRUE(fails_naming(import_onnx_file(b.write(d / "m" / "m.onnx").string()).status(), {"const", "../weights.bin"}));
}

// --- IR versions and opsets -------------------------------------------------------------------

ModelBuilder relu_model(int64_t opset, int64_t ir) {
  ModelBuilder b(opset, ir);
  b.input("x", TensorProto::FLOAT, {2, 3});
  b.node("Relu", {"x"}, {"y"}, "relu");
  b.output("y");
  return b;
}

TEST(ImporterVersions, IrVersions3To10AreAccepted) {
  for (int ir = 3; ir <= 10; ++ir) {
    SCOPED_TRACE(ir);
    TempDir d;
    auto m = load_built(relu_model(13, ir), d);
    EXPECT_TRUE(m) << m.status().message();
  }
}

TEST(ImporterVersions, Ir3InitializersListedAsInputsAreNotInputs) {
  TempDir d;
  ModelBuilder b(13, 3);
  b.input("x", TensorProto::FLOAT, {2});
  b.input("w", TensorProto::FLOAT, {2});
  b.init_f32("w", {2}, {1.f, 2.f});
  b.node("Add", {"x", "w"}, {"y"}, "add");
  b.output("y");
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  ASSERT_EQ(m->graph.inputs().size(), 1u);
  EXPECT_EQ(m->graph.value(m->graph.inputs()[0]).name, "x");
  auto out = run_graph(m->graph, {{"x", Tensor::from_f32({1.f, 1.f}, {2})}});
  ASSERT_EQ(out.size(), 1u);
  expect_near(to_floats(out[0]), {2.f, 3.f});
}

TEST(ImporterVersions, IrVersionsOutsideTheRangeAreErrors) {
  for (int ir : {0, 1, 2, 11, 12}) {
    SCOPED_TRACE(ir);
    TempDir d;
    EXPECT_TRUE(fails_naming(import_built(relu_model(17, ir), d).status(), {"model.onnx", fmt::format("IR version {}", ir)}));
  }
  ModelBuilder b = relu_model(17, 8);
  b.proto().clear_ir_version();
  TempDir d;
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"IR version"}));
}

TEST(ImporterVersions, Opsets13To21AreAcceptedAndOthersNamed) {
  for (int opset = 13; opset <= 21; ++opset) {
    SCOPED_TRACE(opset);
    TempDir d;
    auto m = load_built(relu_model(opset, 10), d);
    EXPECT_TRUE(m) << m.status().message();
  }
  for (int opset : {1, 11, 12, 22, 23}) {
    SCOPED_TRACE(opset);
    TempDir d;
    EXPECT_TRUE(fails_naming(import_built(relu_model(opset, 10), d).status(), {"model.onnx", fmt::format("opset {}", opset)}));
  }
}

TEST(ImporterVersions, TheAiOnnxSpellingOfTheDefaultDomainCounts) {
  TempDir d;
  ModelBuilder b = relu_model(17, 8);
  b.proto().mutable_opset_import(0)->set_domain("ai.onnx");
  auto m = load_built(b, d);
  EXPECT_TRUE(m) << m.status().message();
  b.proto().clear_opset_import();
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"opset"}));
}

// --- per-opset forms canonicalise alike -------------------------------------------------------

// Reductions: ReduceMean/ReduceMax axes are an attribute below opset 18 and an input from 18;
// ReduceSum's axes are an input from 13.
ModelBuilder reduce_model(int opset) {
  ModelBuilder b(opset, 8);
  b.input("x", TensorProto::FLOAT, {2, 3, 4});
  b.init_i64("sum_axes", {2}, {0, -1});
  b.node("ReduceSum", {"x", "sum_axes"}, {"s"}, "sum", {attr_int("keepdims", 0)});
  if (opset < 18) {
    b.node("ReduceMean", {"x"}, {"m"}, "mean", {attr_ints("axes", {-1}), attr_int("keepdims", 1)});
    b.node("ReduceMax", {"x"}, {"mx"}, "max", {attr_ints("axes", {1}), attr_int("keepdims", 0)});
  } else {
    b.init_i64("mean_axes", {1}, {-1});
    b.init_i64("max_axes", {1}, {1});
    b.node("ReduceMean", {"x", "mean_axes"}, {"m"}, "mean", {attr_int("keepdims", 1)});
    b.node("ReduceMax", {"x", "max_axes"}, {"mx"}, "max", {attr_int("keepdims", 0)});
  }
  b.output("s").output("m").output("mx");
  return b;
}

// Split: a `split` input (13+) or equal parts; from 18 also the `num_outputs` attribute.
ModelBuilder split_model(int opset, const std::string& form) {
  ModelBuilder b(opset, 8);
  b.input("x", TensorProto::FLOAT, {2, 6});
  std::vector<onnx::AttributeProto> attrs = {attr_int("axis", 1)};
  std::vector<std::string> ins = {"x"};
  if (form == "input") {
    b.init_i64("sizes", {2}, {3, 3});
    ins.push_back("sizes");
  } else if (form == "num_outputs") {
    attrs.push_back(attr_int("num_outputs", 2));
  }
  b.node("Split", ins, {"a", "b"}, "split", attrs);
  b.node("Sub", {"a", "b"}, {"y"}, "sub");
  b.output("y");
  return b;
}

// Squeeze/Unsqueeze take their axes as inputs from 13.
ModelBuilder squeeze_model(int opset) {
  ModelBuilder b(opset, 8);
  b.input("x", TensorProto::FLOAT, {2, 1, 3});
  b.init_i64("sq_axes", {1}, {1});
  b.init_i64("unsq_axes", {2}, {0, -1});
  b.node("Squeeze", {"x", "sq_axes"}, {"s"}, "squeeze");
  b.node("Unsqueeze", {"s", "unsq_axes"}, {"y"}, "unsqueeze");
  b.output("y");
  return b;
}

// Gelu is an op from 20; earlier exports write it out with Erf.
ModelBuilder gelu_model(int opset) {
  ModelBuilder b(opset, 8);
  b.input("x", TensorProto::FLOAT, {2, 5});
  if (opset >= 20) {
    b.node("Gelu", {"x"}, {"y"}, "gelu");
  } else {
    b.init_f32("sqrt2", {}, {1.41421356f});
    b.init_f32("one", {}, {1.f});
    b.init_f32("half", {}, {0.5f});
    b.node("Div", {"x", "sqrt2"}, {"d"}, "div");
    b.node("Erf", {"d"}, {"e"}, "erf");
    b.node("Add", {"e", "one"}, {"p"}, "add");
    b.node("Mul", {"x", "p"}, {"xp"}, "mul");
    b.node("Mul", {"xp", "half"}, {"y"}, "half");
  }
  b.output("y");
  return b;
}

struct Form {
  std::string what;
  ModelBuilder model;
};

// Every form loads, canonicalises to the signature of the first, and computes the same outputs.
void expect_same_canonical_graph(const std::vector<Form>& forms, const std::map<std::string, Tensor>& feeds) {
  std::string first_sig;
  std::vector<Tensor> first_out;
  for (const Form& f : forms) {
    SCOPED_TRACE(f.what);
    TempDir d;
    auto m = load_built(f.model, d);
    ASSERT_TRUE(m) << m.status().message();
    std::string sig = graph_signature(m->graph);
    auto out = run_graph(m->graph, feeds);
    ASSERT_FALSE(out.empty());
    if (first_sig.empty()) {
      first_sig = sig;
      first_out = out;
      continue;
    }
    EXPECT_EQ(sig, first_sig);
    ASSERT_EQ(out.size(), first_out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].shape(), first_out[i].shape());
      expect_near(to_floats(out[i]), to_floats(first_out[i]), 1e-6f);
    }
  }
}

TEST(ImporterOpsets, ReduceAxesAsAttributeOrInput) {
  std::vector<Form> forms;
  for (int opset : {13, 17, 18, 21}) forms.push_back({fmt::format("opset {}", opset), reduce_model(opset)});
  expect_same_canonical_graph(forms, {{"x", ramp({2, 3, 4})}});

  TempDir d;
  auto m = load_built(reduce_model(18), d);
  ASSERT_TRUE(m) << m.status().message();
  Tensor x = ramp({2, 3, 4});
  auto out = run_graph(m->graph, {{"x", x}});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].shape(), (Shape{3}));
  EXPECT_EQ(out[1].shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(out[2].shape(), (Shape{2, 4}));
  std::vector<float> xv = to_floats(x);
  float mean0 = (xv[0] + xv[1] + xv[2] + xv[3]) / 4;
  EXPECT_NEAR(to_floats(out[1])[0], mean0, 1e-6);
  float sum0 = 0;  // s[j] = sum over i, k of x[i, j, k]
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 4; ++k) sum0 += xv[i * 12 + k];
  }
  EXPECT_NEAR(to_floats(out[0])[0], sum0, 1e-5);
  // canonical form: axes live in the attribute, no axes input is left
  for (NodeId id : m->graph.nodes()) {
    const Node& n = m->graph.node(id);
    EXPECT_EQ(n.num_inputs(), 1) << n.describe();
    EXPECT_TRUE(n.attrs.has("axes")) << n.describe();
  }
}

TEST(ImporterOpsets, SplitSizesInputEqualPartsOrNumOutputs) {
  expect_same_canonical_graph({{"13 input", split_model(13, "input")},
                               {"13 equal", split_model(13, "equal")},
                               {"17 input", split_model(17, "input")},
                               {"18 num_outputs", split_model(18, "num_outputs")},
                               {"18 input", split_model(18, "input")},
                               {"21 num_outputs", split_model(21, "num_outputs")}},
                              {{"x", ramp({2, 6})}});
}

TEST(ImporterOpsets, SplitUnevenPartsFollowTheOpset) {
  // From 18, num_outputs splits 7 into 3, 3, 1; before 18 equal parts must divide evenly.
  auto model = [](int opset, bool num_outputs) {
    ModelBuilder b(opset, 8);
    b.input("x", TensorProto::FLOAT, {7});
    std::vector<onnx::AttributeProto> attrs = {attr_int("axis", 0)};
    if (num_outputs) attrs.push_back(attr_int("num_outputs", 3));
    b.node("Split", {"x"}, {"a", "b", "c"}, "uneven_split", attrs);
    b.output("a").output("b").output("c");
    return b;
  };
  TempDir d;
  auto m = load_built(model(18, true), d);
  ASSERT_TRUE(m) << m.status().message();
  std::vector<Shape> shapes;
  for (ValueId o : m->graph.outputs()) shapes.push_back(m->graph.value(o).shape);
  EXPECT_EQ(shapes, (std::vector<Shape>{{3}, {3}, {1}}));
  EXPECT_TRUE(fails_naming(load_built(model(17, false), d).status(), {"uneven_split", "7"}));
  // num_outputs is an opset-18 attribute; it must agree with the outputs.
  ModelBuilder b(18, 8);
  b.input("x", TensorProto::FLOAT, {6});
  b.node("Split", {"x"}, {"a", "b"}, "disagreeing_split", {attr_int("num_outputs", 3)});
  b.output("a").output("b");
  EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"disagreeing_split", "num_outputs"}));
}

TEST(ImporterOpsets, SqueezeUnsqueezeAxesInputs) {
  std::vector<Form> forms;
  for (int opset : {13, 17, 18, 21}) forms.push_back({fmt::format("opset {}", opset), squeeze_model(opset)});
  expect_same_canonical_graph(forms, {{"x", ramp({2, 1, 3})}});
  TempDir d;
  auto m = load_built(squeeze_model(13), d);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->graph.value(m->graph.outputs()[0]).shape, (Shape{1, 2, 3, 1}));
}

TEST(ImporterOpsets, GeluOpAtOpset20EqualsItsErfFormBefore) {
  expect_same_canonical_graph({{"opset 20 Gelu", gelu_model(20)},
                               {"opset 21 Gelu", gelu_model(21)},
                               {"opset 17 erf form", gelu_model(17)},
                               {"opset 13 erf form", gelu_model(13)}},
                              {{"x", ramp({2, 5})}});
  TempDir d;
  auto m = load_built(gelu_model(17), d);
  ASSERT_TRUE(m) << m.status().message();
  ASSERT_EQ(m->graph.num_nodes(), 1u);
  EXPECT_EQ(m->graph.node(m->graph.nodes()[0]).op_type, "Gelu");
  Tensor x = ramp({2, 5});
  auto out = run_graph(m->graph, {{"x", x}});
  ASSERT_EQ(out.size(), 1u);
  std::vector<float> xv = to_floats(x), yv = to_floats(out[0]);
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(yv[i], 0.5 * xv[i] * (1 + std::erf(xv[i] / std::sqrt(2.0))), 1e-6);
}

// --- symbolic dimensions ----------------------------------------------------------------------

ModelBuilder symbolic_model() {
  ModelBuilder b(17);
  b.input("ids", TensorProto::FLOAT, {"batch", "seq", 4});
  b.input("mask", TensorProto::FLOAT, {"batch", "seq", 1});
  b.node("Mul", {"ids", "mask"}, {"y"}, "mul");
  b.output("y");
  return b;
}

TEST(ImporterSymbolicDims, BoundByDimOrShape) {
  TempDir d;
  ImportOptions opts;
  ASSERT_TRUE(parse_dim_binding("batch=2", &opts).is_ok());
  ASSERT_TRUE(parse_dim_binding("seq=5", &opts).is_ok());
  auto m = load_built(symbolic_model(), d, opts);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->graph.value(m->graph.find_value("ids")).shape, (Shape{2, 5, 4}));
  EXPECT_EQ(m->graph.value(m->graph.find_value("ids")).dim_names, (std::vector<std::string>{"batch", "seq", ""}));
  EXPECT_EQ(m->graph.value(m->graph.outputs()[0]).shape, (Shape{2, 5, 4}));

  // --shape of one input binds its named dims for the others
  ImportOptions by_shape;
  ASSERT_TRUE(parse_shape_binding("ids=3,7,4", &by_shape).is_ok());
  auto m2 = load_built(symbolic_model(), d, by_shape);
  ASSERT_TRUE(m2) << m2.status().message();
  EXPECT_EQ(m2->graph.value(m2->graph.find_value("mask")).shape, (Shape{3, 7, 1}));
}

TEST(ImporterSymbolicDims, UnboundOrContradictoryBindingsAreNamed) {
  TempDir d;
  auto none = import_built(symbolic_model(), d);
  EXPECT_TRUE(fails_naming(none.status(), {"model.onnx", "'batch'", "'ids'", "--dim"}));
  ImportOptions only_batch;
  ASSERT_TRUE(parse_dim_binding("batch=2", &only_batch).is_ok());
  EXPECT_TRUE(fails_naming(import_built(symbolic_model(), d, only_batch).status(), {"'seq'", "'ids'"}));

  ImportOptions wrong_rank;
  ASSERT_TRUE(parse_shape_binding("ids=2,5", &wrong_rank).is_ok());
  EXPECT_TRUE(fails_naming(import_built(symbolic_model(), d, wrong_rank).status(), {"ids", "rank 2", "rank 3"}));
  ImportOptions fixed_dim;
  ASSERT_TRUE(parse_shape_binding("ids=2,5,3", &fixed_dim).is_ok());
  EXPECT_TRUE(fails_naming(import_built(symbolic_model(), d, fixed_dim).status(), {"ids", "4"}));
  ImportOptions unknown;
  ASSERT_TRUE(parse_shape_binding("nobody=2", &unknown).is_ok());
  EXPECT_TRUE(fails_naming(import_built(symbolic_model(), d, unknown).status(), {"nobody"}));
  ImportOptions conflict;
  ASSERT_TRUE(parse_shape_binding("ids=2,5,4", &conflict).is_ok());
  ASSERT_TRUE(parse_shape_binding("mask=2,6,1", &conflict).is_ok());
  EXPECT_TRUE(fails_naming(import_built(symbolic_model(), d, conflict).status(), {"'seq'", "5", "6"}));
  ImportOptions conflict_dim;
  ASSERT_TRUE(parse_dim_binding("seq=6", &conflict_dim).is_ok());
  ASSERT_TRUE(parse_shape_binding("ids=2,5,4", &conflict_dim).is_ok());
  EXPECT_TRUE(fails_naming(import_built(symbolic_model(), d, conflict_dim).status(), {"'seq'", "5", "6"}));

  // a dim with neither size nor name
  ModelBuilder b(17);
  b.input("anon", TensorProto::FLOAT, {2});
  b.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->clear_dim_value();
  b.node("Relu", {"anon"}, {"y"}, "relu");
  b.output("y");
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"'anon'", "dim 0"}));
}

TEST(ImporterSymbolicDims, InputWithoutAShapeNeedsShapeUnlessProbing) {
  TempDir d;
  ModelBuilder b = relu_model(17, 8);
  b.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"'x'", "--shape x="}));
  ImportOptions probe;
  probe.require_bound_dims = false;  // what oases-run does before it reads the data's shapes
  auto g = import_built(b, d, probe);
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_FALSE(g->value(g->find_value("x")).has_shape);
  ImportOptions shaped;
  ASSERT_TRUE(parse_shape_binding("x=4,5", &shaped).is_ok());
  auto m = load_built(b, d, shaped);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->graph.value(m->graph.outputs()[0]).shape, (Shape{4, 5}));
}

TEST(ImporterSymbolicDims, BindingSyntaxErrors) {
  ImportOptions o;
  EXPECT_TRUE(fails_naming(parse_dim_binding("batch", &o), {"batch", "NAME=N"}));
  EXPECT_TRUE(fails_naming(parse_dim_binding("=3", &o), {"NAME=N"}));
  EXPECT_TRUE(fails_naming(parse_dim_binding("batch=-1", &o), {"batch", "-1"}));
  EXPECT_TRUE(fails_naming(parse_dim_binding("batch=2x", &o), {"batch", "2x"}));
  EXPECT_TRUE(fails_naming(parse_dim_binding("batch=99999999999999999999999", &o), {"batch"}));
  EXPECT_TRUE(fails_naming(parse_shape_binding("x", &o), {"INPUT=d0,d1"}));
  EXPECT_TRUE(fails_naming(parse_shape_binding("x=2,,3", &o), {"x=2,,3"}));
  EXPECT_TRUE(fails_naming(parse_shape_binding("x=2,-3", &o), {"-3"}));
  EXPECT_TRUE(fails_naming(parse_shape_binding("x=2,", &o), {"x=2,"}));
  ASSERT_TRUE(parse_shape_binding("scalar=", &o).is_ok());
  EXPECT_EQ(o.input_shapes["scalar"], Shape{});
}

// --- model-local functions --------------------------------------------------------------------

TEST(ImporterFunctions, LocalFunctionsAreInlinedEvenWhenCalledTwiceUnnamed) {
  TempDir d;
  ModelBuilder b(17);
  b.opset("local", 1);
  b.input("x", TensorProto::FLOAT, {4});
  b.input("z", TensorProto::FLOAT, {4});
  // AddMul(a, b) = (a + b) * b ;  LeakyScale(a) = LeakyRelu(a, alpha=@alpha) via AddMul
  auto& f = b.function("local", "AddMul", {"a", "b"}, {"c"});
  function_node(f, "Add", {"a", "b"}, {"t"});
  function_node(f, "Mul", {"t", "b"}, {"c"});
  auto& g = b.function("local", "Leaky", {"a"}, {"c"});
  g.add_attribute("alpha");
  onnx::AttributeProto ref;
  ref.set_name("alpha");
  ref.set_type(onnx::AttributeProto::FLOAT);
  ref.set_ref_attr_name("alpha");
  function_node(g, "LeakyRelu", {"a"}, {"l"}, {ref});
  function_node(g, "AddMul", {"l", "a"}, {"c"}).set_domain("local");
  b.node("AddMul", {"x", "z"}, {"u"}, "", {}, "local");
  b.node("AddMul", {"u", "z"}, {"v"}, "", {}, "local");
  b.node("Leaky", {"v"}, {"y"}, "", {attr_float("alpha", 0.5f)}, "local");
  b.output("y");
  auto m = load_built(b, d);
  ASSERT_TRUE(m) << m.status().message();
  for (NodeId id : m->raw.nodes()) EXPECT_NE(m->raw.node(id).domain, "local") << m->raw.node(id).describe();
  std::vector<float> x = {1.f, -2.f, 3.f, -4.f}, z = {0.5f, 1.f, -1.f, 2.f};
  auto out = run_graph(m->graph, {{"x", Tensor::from_f32(x, {4})}, {"z", Tensor::from_f32(z, {4})}});
  ASSERT_EQ(out.size(), 1u);
  std::vector<float> want;
  for (int i = 0; i < 4; ++i) {
    float u = (x[i] + z[i]) * z[i];
    float v = (u + z[i]) * z[i];
    float l = v > 0 ? v : 0.5f * v;
    want.push_back((l + v) * v);
  }
  expect_near(to_floats(out[0]), want);
}

TEST(ImporterFunctions, RecursiveFunctionsAreAnError) {
  TempDir d;
  ModelBuilder b(17);
  b.opset("local", 1);
  b.input("x", TensorProto::FLOAT, {4});
  auto& f = b.function("local", "Forever", {"a"}, {"c"});
  function_node(f, "Forever", {"a"}, {"t"}).set_domain("local");
  function_node(f, "Forever", {"t"}, {"c"}).set_domain("local");
  b.node("Forever", {"x"}, {"y"}, "call_forever", {}, "local");
  b.output("y");
  EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"Forever"}));
}

// --- malformed files and graphs ---------------------------------------------------------------

TEST(ImporterErrors, FilesThatAreNotModels) {
  TempDir d;
  EXPECT_TRUE(fails_naming(import_onnx_file((d / "absent.onnx").string()).status(), {"absent.onnx", "no such file"}));
  write_bytes(d / "empty.onnx", "");
  EXPECT_TRUE(fails_naming(import_onnx_file((d / "empty.onnx").string()).status(), {"empty.onnx", "empty"}));
  write_bytes(d / "garbage.onnx", "GARBAGE\xff\xfe\x01 this is not protobuf");
  EXPECT_TRUE(fails_naming(import_onnx_file((d / "garbage.onnx").string()).status(), {"garbage.onnx"}));
  std::string good = relu_model(17, 8).serialize();
  write_bytes(d / "half.onnx", good.substr(0, good.size() / 2));
  EXPECT_TRUE(fails_naming(import_onnx_file((d / "half.onnx").string()).status(), {"half.onnx"}));
  EXPECT_TRUE(fails_naming(import_onnx_file(d.path().string()).status(), {d.path().string()}));
  // a valid protobuf of another kind: a TensorProto
  write_bytes(d / "tensor.onnx", f32_tensor("t", {2}, {1.f, 2.f}).SerializeAsString());
  EXPECT_TRUE(fails_naming(import_onnx_file((d / "tensor.onnx").string()).status(), {"tensor.onnx"}));
  // every prefix of a valid model is an error or a model, never a crash
  for (size_t n = 0; n < good.size(); ++n) {
    write_bytes(d / "prefix.onnx", good.substr(0, n));
    auto g = import_onnx_file((d / "prefix.onnx").string());
    if (!g) {
      EXPECT_NE(g.status().message().find("prefix.onnx"), std::string::npos) << g.status().message();
    }
  }
}

TEST(ImporterErrors, GraphErrorsNameTheNodeOrValue) {
  TempDir d;
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Add", {"x", "loop_b"}, {"loop_a"}, "cycle_add");
    b.node("Relu", {"loop_a"}, {"loop_b"}, "cycle_relu");
    b.output("loop_a");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"model.onnx", "cycle", "cycle_"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Add", {"x", "ghost"}, {"y"}, "reads_ghost");
    b.output("y");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"reads_ghost", "'ghost'"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"y"}, "first");
    b.node("Neg", {"x"}, {"y"}, "second");
    b.output("y");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"second", "'y'"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"x"}, "overwrites_input");
    b.output("x");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"overwrites_input", "'x'"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"y"}, "relu");
    b.output("not_there");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"'not_there'"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"y"}, "relu");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"no outputs"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.input("x", TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"y"}, "relu");
    b.output("y");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"'x'", "twice"}));
  }
  {
    ModelBuilder b(17);
    b.input("seq_input", TensorProto::FLOAT, {2});
    b.graph().mutable_input(0)->mutable_type()->clear_tensor_type();
    b.graph().mutable_input(0)->mutable_type()->mutable_sequence_type();
    b.node("Relu", {"seq_input"}, {"y"}, "relu");
    b.output("y");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"'seq_input'"}));
  }
  {
    ModelBuilder b(17);
    b.input("str_input", TensorProto::STRING, {2});
    b.node("Relu", {"str_input"}, {"y"}, "relu");
    b.output("y");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"'str_input'", "data type 8"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    onnx::AttributeProto sub;
    sub.set_name("then_branch");
    sub.set_type(onnx::AttributeProto::GRAPH);
    sub.mutable_g()->set_name("then");
    b.node("If", {"x"}, {"y"}, "branchy", {sub});
    b.output("y");
    // Control flow is listed as unsupported (with any other unsupported node), not rejected alone.
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"branchy", "If", "unsupported"}));
    // A graph attribute on an op Oases knows is an error naming it.
    b.graph().mutable_node(0)->set_op_type("Relu");
    b.graph().mutable_node(0)->set_name("relu_with_graph");
    EXPECT_TRUE(fails_naming(import_built(b, d).status(), {"relu_with_graph", "then_branch"}));
  }
}

TEST(ImporterErrors, UnsupportedOpsAndDomainsAreListedTogether) {
  TempDir d;
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 3});
  b.node("FrobnicateOp", {"x"}, {"a"}, "first_bad");
  b.node("Relu", {"a"}, {"b"}, "fine");
  b.node("WibbleOp", {"b"}, {"c"}, "second_bad");
  b.node("FusedThing", {"c"}, {"y"}, "foreign", {}, "com.example.unknown");
  b.output("y");
  auto m = load_built(b, d);
  EXPECT_TRUE(fails_naming(m.status(), {"model.onnx", "3 unsupported", "FrobnicateOp", "first_bad", "WibbleOp", "second_bad", "FusedThing",
                                        "foreign", "com.example.unknown"}));
  EXPECT_EQ(m.status().message().find("'fine'"), std::string::npos) << m.status().message();
}

TEST(ImporterErrors, ShapeErrorsNameTheNode) {
  TempDir d;
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_f32("w", {5, 4}, std::vector<float>(20, 1.f));
    b.node("MatMul", {"x", "w"}, {"y"}, "mismatched_matmul");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"model.onnx", "MatMul", "mismatched_matmul", "[2, 3]", "[5, 4]"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.input("z", TensorProto::FLOAT, {4, 3});
    b.node("Add", {"x", "z"}, {"y"}, "bad_broadcast");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"bad_broadcast", "[2, 3]", "[4, 3]"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_i64("shape", {2}, {4, 4});
    b.node("Reshape", {"x", "shape"}, {"y"}, "bad_reshape");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"bad_reshape", "[2, 3]"}));
  }
  {
    // found by the fuzzer: the product of the target dims overflowed int64 (undefined behaviour)
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_i64("shape", {3}, {34091302785, 536870911, -1});
    b.node("Reshape", {"x", "shape"}, {"y"}, "overflowing_reshape");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"overflowing_reshape", "overflow"}));
  }
  {
    // An omitted required operand is an error, not a read of a missing value.
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.node("MatMul", {"", "x"}, {"y"}, "missing_operand");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"missing_operand", "input 0"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.node("Relu", {"x", "x"}, {"y"}, "too_many");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"too_many", "2 inputs"}));
  }
}

TEST(ImporterErrors, TensorsTooLargeToAllocateAreNamedNotAllocated) {
  TempDir d;
  const int64_t big = int64_t{1} << 20;  // big · big float32 = 4 TiB
  {
    ModelBuilder b(17);
    b.input("huge_input", TensorProto::FLOAT, {big, big});
    b.node("Relu", {"huge_input"}, {"y"}, "relu");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"huge_input"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.init_i64("huge_shape", {2}, {big, big});
    b.node("ConstantOfShape", {"huge_shape"}, {"zeros"}, "huge_fill");
    b.node("Add", {"zeros", "x"}, {"y"}, "add");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"huge_fill"}));
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.init_i64("reps", {1}, {int64_t{1} << 62});
    b.node("Tile", {"x", "reps"}, {"y"}, "huge_tile");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"huge_tile"}));
  }
  for (float limit : {1e30f, NAN, INFINITY}) {
    SCOPED_TRACE(limit);
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2});
    b.init_i64("start", {}, {0});
    b.initializer(f32_tensor("limit", {}, {limit}));
    b.init_f32("delta", {}, {1.f});
    b.node("Cast", {"start"}, {"startf"}, "cast", {attr_int("to", TensorProto::FLOAT)});
    b.node("Range", {"startf", "limit", "delta"}, {"r"}, "huge_range");
    b.node("Add", {"r", "x"}, {"y"}, "add");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d).status(), {"huge_range"}));
  }
  {
    ImportOptions opts;
    ASSERT_TRUE(parse_dim_binding("n=4611686018427387904", &opts).is_ok());
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {"n", "n"});
    b.node("Relu", {"x"}, {"y"}, "relu");
    b.output("y");
    EXPECT_TRUE(fails_naming(load_built(b, d, opts).status(), {"'x'"}));
  }
}

}  // namespace
}  // namespace oases
