// oases_make_bad_inputs OUTDIR: writes the models and data sets tests/e2e/test_bad_inputs.sh feeds
// to the tools, one per way an input can be broken (plus a good model and data set to compare
// with). Each file is named after what is wrong with it; the names inside (nodes, values, dims)
// are the culprits the tools' error messages must name.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/common/onnx_builder.h"

using namespace oases::testutil;
namespace fs = std::filesystem;
using onnx::TensorProto;

namespace {

// x[2,3] · w[3,4] -> Relu -> y[2,4]
ModelBuilder good_model() {
  ModelBuilder b(17);
  b.input("x", TensorProto::FLOAT, {2, 3});
  b.init_f32("w", {3, 4}, {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12});
  b.node("MatMul", {"x", "w"}, {"xw"}, "matmul");
  b.node("Relu", {"xw"}, {"y"}, "relu");
  b.output("y");
  return b;
}

std::vector<float> good_output(const std::vector<float>& x) {
  const float w[12] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12};
  std::vector<float> y(8, 0.f);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      float s = 0;
      for (int k = 0; k < 3; ++k) s += x[i * 3 + k] * w[k * 4 + j];
      y[i * 4 + j] = s > 0 ? s : 0;
    }
  }
  return y;
}

void write_tensor(const fs::path& p, const TensorProto& t) {
  write_bytes(p, t.SerializeAsString());
}

void data_set(const fs::path& dir, const TensorProto& in, const TensorProto& out) {
  fs::create_directories(dir);
  write_tensor(dir / "input_0.pb", in);
  write_tensor(dir / "output_0.pb", out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  fs::path out(argv[1]);
  fs::create_directories(out);

  // --- a good model and data set ---------------------------------------------------------
  good_model().write(out / "good.onnx");
  std::vector<float> x = {0.5f, -1.f, 2.f, 1.5f, 0.25f, -0.75f};
  data_set(out / "good_data", f32_tensor("x", {2, 3}, x), f32_tensor("y", {2, 4}, good_output(x)));

  {
    // The input's type has no shape: oases-import needs --shape, oases-run takes it from the data.
    ModelBuilder b = good_model();
    b.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->clear_shape();
    b.write(out / "no_input_shape.onnx");
  }

  // --- files that are not models ----------------------------------------------------------
  write_bytes(out / "empty.onnx", "");
  {
    // A model with a larger weight so that the cut lands inside it.
    ModelBuilder b = good_model();
    b.init_f32("padding_weight", {256}, std::vector<float>(256, 1.f));
    std::string bytes = b.serialize();
    write_bytes(out / "truncated.onnx", bytes.substr(0, bytes.size() / 2));
  }
  {
    // 'G' is field 8 with wire type 7, which protobuf does not have: never parses by accident.
    std::string bytes = "GARBAGE";
    std::mt19937 rng(42);
    for (int i = 0; i < 4096; ++i) bytes.push_back(static_cast<char>(rng() & 0xff));
    write_bytes(out / "garbage.onnx", bytes);
  }

  // --- models with unsupported content ----------------------------------------------------
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.node("FrobnicateOp", {"x"}, {"a"}, "first_unsupported");
    b.node("Relu", {"a"}, {"b"}, "fine_relu");
    b.node("WibbleOp", {"b"}, {"c"}, "second_unsupported");
    b.node("FusedThing", {"c"}, {"d"}, "foreign_node", {}, "com.example.unknown");
    onnx::AttributeProto body;  // control flow: listed like any unsupported op
    body.set_name("then_branch");
    body.set_type(onnx::AttributeProto::GRAPH);
    body.mutable_g()->set_name("then");
    b.node("If", {"cond", "d"}, {"y"}, "branching_node", {body});
    b.init_f32("cond", {}, {1.f});
    b.output("y");
    b.write(out / "unsupported.onnx");
  }
  for (int opset : {12, 22}) {
    ModelBuilder b = good_model();
    b.opset("", opset);
    b.write(out / ("opset" + std::to_string(opset) + ".onnx"));
  }

  // --- broken graphs ----------------------------------------------------------------------
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.node("Add", {"x", "loop_b"}, {"loop_a"}, "cycle_add");
    b.node("Relu", {"loop_a"}, {"loop_b"}, "cycle_relu");
    b.node("Neg", {"loop_a"}, {"y"}, "after_cycle");
    b.output("y");
    b.write(out / "cycle.onnx");
  }
  {
    ModelBuilder b = good_model();
    b.initializer(raw_tensor("short_weight", TensorProto::FLOAT, {3, 4}, std::string(10, '\0')));
    b.node("Add", {"y", "short_weight"}, {"z"}, "uses_short");
    b.output("z");
    b.write(out / "short_initializer.onnx");
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.node("Add", {"x", "ghost_value"}, {"y"}, "reads_ghost");
    b.output("y");
    b.write(out / "undefined_value.onnx");
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_f32("w5", {5, 4}, std::vector<float>(20, 0.5f));
    b.node("MatMul", {"x", "w5"}, {"y"}, "mismatched_matmul");
    b.output("y");
    b.write(out / "matmul_mismatch.onnx");
  }
  {
    ModelBuilder b(17);
    b.input("tokens", TensorProto::FLOAT, {"batch", "seq_len"});
    b.node("Relu", {"tokens"}, {"y"}, "relu");
    b.output("y");
    b.write(out / "unbound_dim.onnx");
  }

  // --- external data leaving the model's folder --------------------------------------------
  {
    fs::path dir = out / "escape";
    fs::create_directories(dir / "model");
    write_bytes(dir / "outside.bin", std::string(48, '\0'));
    std::error_code ec;
    fs::remove(dir / "model" / "link.bin", ec);
    fs::create_symlink(fs::absolute(dir / "outside.bin"), dir / "model" / "link.bin");
    struct Case {
      const char* file;
      std::string location;
    };
    for (const Case& c : {Case{"dotdot.onnx", "../outside.bin"}, Case{"absolute.onnx", fs::absolute(dir / "outside.bin").string()},
                          Case{"symlink.onnx", "link.bin"}}) {
      ModelBuilder b = good_model();
      TensorProto t = f32_tensor("escaping_weight", {3, 4}, std::vector<float>(12, 0.f));
      make_external(&t, c.location);
      b.initializer(t);
      b.node("Add", {"y", "escaping_weight"}, {"z"}, "uses_escaping");
      b.output("z");
      b.write(dir / "model" / c.file);
    }
  }

  // --- tensors too large to allocate (2^40 elements, a few bytes of data) -----------------
  {
    ModelBuilder b = good_model();
    b.initializer(raw_tensor("huge_weight", TensorProto::FLOAT, {int64_t{1} << 20, int64_t{1} << 20}, std::string(16, '\0')));
    b.write(out / "huge_initializer.onnx");
  }
  {
    // 2^33 float32 elements = 32 GiB: under the 64 GiB ceiling (with --max-memory 64G), so only the data check stops it.
    ModelBuilder b = good_model();
    b.initializer(raw_tensor("big_short_weight", TensorProto::FLOAT, {int64_t{1} << 33}, std::string(16, '\0')));
    b.write(out / "big_short_initializer.onnx");
  }
  {
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.node("Constant", {}, {"huge_constant"}, "make_huge",
           {attr_tensor("value", raw_tensor("", TensorProto::FLOAT, {int64_t{1} << 20, int64_t{1} << 20}, std::string(16, '\0')))});
    b.node("Add", {"x", "huge_constant"}, {"y"}, "add_huge");
    b.output("y");
    b.write(out / "huge_constant.onnx");
  }
  {
    ModelBuilder b(17);
    b.input("huge_input", TensorProto::FLOAT, {int64_t{1} << 20, int64_t{1} << 20});
    b.node("Relu", {"huge_input"}, {"y"}, "relu");
    b.output("y");
    b.write(out / "huge_input.onnx");
  }
  {
    // The shape operand is tiny; the tensor it asks for is not.
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_i64("huge_shape", {2}, {int64_t{1} << 20, int64_t{1} << 20});
    b.node("ConstantOfShape", {"huge_shape"}, {"zeros"}, "huge_fill");
    b.node("Add", {"zeros", "x"}, {"y"}, "add_zeros");
    b.output("y");
    b.write(out / "huge_intermediate.onnx");
  }

  // --- shapes the rules must refuse before a kernel reads past a buffer --------------------
  {
    // indices [3, 3] on data [2, 3] along axis 1: row 2 of the output would read data row 2
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_i64("gather_idx", {3, 3}, {0, 1, 2, 2, 1, 0, 0, 0, 0});
    b.node("GatherElements", {"x", "gather_idx"}, {"y"}, "gather_rows", {attr_int("axis", 1)});
    b.output("y");
    b.write(out / "gather_elements_oob.onnx");
  }
  {
    // split sizes [-2, 8] add up to the dim 6, but one is negative
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 6});
    b.init_i64("split_sizes", {2}, {-2, 8});
    b.node("Split", {"x", "split_sizes"}, {"a", "c"}, "negative_split", {attr_int("axis", 1)});
    b.output("a");
    b.output("c");
    b.write(out / "negative_split.onnx");
  }
  {
    // 2^32 float32 zeros (16 GiB) from a model of a few hundred bytes
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {2, 3});
    b.init_i64("fill_shape", {1}, {int64_t{1} << 32});
    b.node("ConstantOfShape", {"fill_shape"}, {"zeros"}, "fill_16g");
    b.node("ReduceSum", {"zeros"}, {"s"}, "sum_zeros");
    b.node("Add", {"x", "s"}, {"y"}, "add_sum");
    b.output("y");
    b.write(out / "constant_of_shape_16g.onnx");
  }
  {
    // x [128, 128] (64 KiB) and two outputs of 64 KiB each: every tensor fits in 100 KiB, the
    // activation arena (both outputs live to the end) does not
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {128, 128});
    b.node("Relu", {"x"}, {"relu_out"}, "relu");
    b.node("Neg", {"x"}, {"neg_out"}, "neg");
    b.output("relu_out");
    b.output("neg_out");
    b.write(out / "two_outputs.onnx");
    fs::create_directories(out / "two_outputs_data");
    write_tensor(out / "two_outputs_data" / "input_0.pb", f32_tensor("x", {128, 128}, std::vector<float>(128 * 128, 1.f)));
  }

  {
    // empty tensors must run (zero rows through MatMul, a broadcast Add, Softmax, a mean) or be refused, never crash
    ModelBuilder b(17);
    b.input("x", TensorProto::FLOAT, {"rows", 3});
    b.init_f32("w", {3, 4}, {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12});
    b.init_f32("bias", {4}, {0.5f, -0.5f, 1.f, 0.f});
    b.node("MatMul", {"x", "w"}, {"xw"}, "matmul");
    b.node("Add", {"xw", "bias"}, {"xwb"}, "add_bias");
    b.node("Softmax", {"xwb"}, {"y"}, "softmax", {attr_int("axis", -1)});
    b.node("ReduceMean", {"xwb"}, {"m"}, "mean_rows", {attr_ints("axes", {0}), attr_int("keepdims", 0)});
    b.output("y");
    b.output("m");
    b.write(out / "empty_rows.onnx");
    fs::create_directories(out / "empty_rows_data");
    write_tensor(out / "empty_rows_data" / "input_0.pb", f32_tensor("x", {0, 3}, {}));
  }

  // --- bad data sets for oases-run (model: good.onnx) -------------------------------------
  std::vector<float> y = good_output(x);
  fs::create_directories(out / "data_garbage");
  write_bytes(out / "data_garbage" / "input_0.pb", "GARBAGE, not a TensorProto");
  data_set(out / "data_wrong_dtype", i64_tensor("x", {2, 3}, {1, 2, 3, 4, 5, 6}), f32_tensor("y", {2, 4}, y));
  data_set(out / "data_wrong_shape", f32_tensor("x", {3, 3}, std::vector<float>(9, 1.f)), f32_tensor("y", {2, 4}, y));
  data_set(out / "data_wrong_rank", f32_tensor("x", {6}, x), f32_tensor("y", {2, 4}, y));
  std::vector<float> wrong = y;
  wrong[3] += 1.f;
  data_set(out / "data_mismatch", f32_tensor("x", {2, 3}, x), f32_tensor("y", {2, 4}, wrong));
  data_set(out / "data_huge_input", raw_tensor("x", TensorProto::FLOAT, {int64_t{1} << 33}, std::string(8, '\0')),
           f32_tensor("y", {2, 4}, y));
  return 0;
}
