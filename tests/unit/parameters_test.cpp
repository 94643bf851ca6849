// Parameters told from buffers (graph/parameters.h): module-path names, and for generated names
// what reads the tensor; --train / --freeze overrides.
#include <gtest/gtest.h>

#include <map>

#include "graph/parameters.h"
#include "graph/passes/pass.h"
#include "graph/training_graph.h"

namespace oases {
namespace {

Tensor filled(const Shape& s, float v) {
  Tensor t(DType::kF32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = v + 0.01f * static_cast<float>(i);
  return t;
}

struct Net {
  Graph g;
  ValueId op(const std::string& type, const std::vector<ValueId>& ins, AttrMap a = {}) {
    return g.node(g.add_node_new_outputs(type, ins, 1, std::move(a))).outputs[0];
  }
  ValueId init(const std::string& name, const Shape& s) { return g.add_initializer(name, filled(s, 0.5f)); }
};

// A decoder layer as the dynamo exporter writes one: token embedding (generated name), a position
// table it sliced to the sequence, a transposed projection with its bias, a folded rotary table,
// fill scalars, a folded relative-position read (constant indices), and kept module paths.
std::map<std::string, InitializerRole> classify_example(const std::string& train = "", const std::string& freeze = "") {
  Net n;
  n.g.opset_imports[""] = 18;
  ValueId ids = n.g.add_input("input_ids", DType::kI64, {2, 4});
  ValueId e = n.op("Gather", {n.init("val_0", {8, 4}), ids});
  ValueId h = n.op("Add", {e, n.init("embedding_1", {1, 4, 4})});
  ValueId wt = n.op("Transpose", {n.init("val_110", {4, 4})}, AttrMap{{"perm", Attribute::of_ints({1, 0})}});
  ValueId m = n.op("MatMul", {h, wt});
  ValueId b = n.op("Add", {m, n.init("val_6", {4})});
  ValueId r = n.op("Mul", {b, n.init("unsqueeze_14", {1, 4, 4})});
  ValueId s = n.op("Mul", {r, n.init("full", {})});
  ValueId inv = n.op("Mul", {s, n.init("model.rotary_emb.inv_freq", {4})});
  ValueId w = n.op("Mul", {inv, n.init("model.norm.weight", {4})});
  ValueId bucket = n.g.add_constant("bucket", Tensor::from_int64({0, 1, 1, 0}, {4}));
  ValueId rel = n.op("Gather", {n.init("encoder.block.0.relative_attention_bias.weight", {2, 4}), bucket});
  ValueId folded = n.op("Gather", {n.init("val_9", {2, 4}), bucket});
  ValueId y = n.op("Add", {n.op("Add", {w, rel}), folded});
  n.g.set_outputs({y});
  InferShapesPass infer;
  auto st = infer.run(n.g);
  EXPECT_TRUE(st) << st.status().message();
  std::vector<InitializerRole> roles = classify_initializers(n.g);
  Status o = apply_parameter_overrides(n.g, roles, train, freeze);
  EXPECT_TRUE(o.is_ok()) << o.message();
  std::map<std::string, InitializerRole> by_name;
  for (const InitializerRole& role : roles) by_name[n.g.value(role.value).name] = role;
  return by_name;
}

TEST(Parameters, StructureDecidesGeneratedNamesAndModulePathsKeepTheirs) {
  auto r = classify_example();
  ASSERT_EQ(r.size(), 10u);
  EXPECT_TRUE(r["val_0"].trainable) << r["val_0"].reason;  // embedding table
  EXPECT_NE(r["val_0"].reason.find("embedding"), std::string::npos);
  EXPECT_TRUE(r["embedding_1"].trainable) << r["embedding_1"].reason;  // added to a token embedding
  EXPECT_TRUE(r["val_110"].trainable) << r["val_110"].reason;          // MatMul weight through a Transpose
  EXPECT_NE(r["val_110"].reason.find("MatMul"), std::string::npos);
  EXPECT_TRUE(r["val_6"].trainable) << r["val_6"].reason;  // bias of the projection
  EXPECT_FALSE(r["unsqueeze_14"].trainable);               // rotary table
  EXPECT_NE(r["unsqueeze_14"].reason.find("Mul"), std::string::npos) << r["unsqueeze_14"].reason;
  EXPECT_FALSE(r["full"].trainable);  // a fill scalar
  EXPECT_FALSE(r["model.rotary_emb.inv_freq"].trainable);
  EXPECT_TRUE(r["model.norm.weight"].trainable);
  EXPECT_TRUE(r["encoder.block.0.relative_attention_bias.weight"].trainable);  // constant indices, yet PyTorch's parameter
  EXPECT_FALSE(r["val_9"].trainable) << r["val_9"].reason;                     // a generated table read at constant places
}

TEST(Parameters, TrainAndFreezeOverride) {
  auto r = classify_example("unsqueeze|val_9", "norm");
  EXPECT_TRUE(r["unsqueeze_14"].trainable);
  EXPECT_NE(r["unsqueeze_14"].reason.find("--train"), std::string::npos);
  EXPECT_TRUE(r["val_9"].trainable);
  EXPECT_FALSE(r["model.norm.weight"].trainable);
  EXPECT_NE(r["model.norm.weight"].reason.find("--freeze"), std::string::npos);
  Net n;
  n.init("w", {2});
  std::vector<InitializerRole> roles = classify_initializers(n.g);
  Status bad = apply_parameter_overrides(n.g, roles, "(", "");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("--train '('"), std::string::npos) << bad.message();
}

TEST(Parameters, SplitIsDescribedWithEachBuffer) {
  Net n;
  ValueId x = n.g.add_input("x", DType::kF32, {2, 4});
  ValueId y = n.op("Add", {n.op("MatMul", {x, n.init("val_1", {4, 4})}), n.init("mask_table", {2, 4})});
  n.g.set_outputs({y});
  InferShapesPass infer;
  ASSERT_TRUE(infer.run(n.g));
  auto roles = classify_initializers(n.g);
  auto lines = describe_parameter_split(n.g, roles);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "1 parameter (16 elements), 1 buffer (8 elements)");
  EXPECT_NE(lines[1].find("buffer 'mask_table'"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("[2, 4]"), std::string::npos) << lines[1];
}

// A model with its own scalar loss: the vocabulary (what oases-train's token ids must stay below)
// is the rows of the table its Gather reads, not those of a table read by nothing the loss needs.
TEST(Parameters, AModelWithItsOwnLossTakesItsVocabularyFromTheGatheredTable) {
  for (bool own_loss : {true, false}) {
    Net n;
    n.g.opset_imports[""] = 17;
    ValueId ids = n.g.add_input("ids", DType::kI64, {2, 3});
    ValueId h = n.op("MatMul", {n.op("Gather", {n.init("emb", {50, 4}), ids}), n.init("w", {4, 4})});
    n.op("Gather", {n.init("unused", {70, 4}), ids});
    n.g.set_outputs({own_loss ? n.op("ReduceMean", {n.op("Mul", {h, h})}, AttrMap{{"keepdims", Attribute::of_int(0)}}) : h});
    InferShapesPass infer;
    auto st = infer.run(n.g);
    ASSERT_TRUE(st) << st.status().message();
    auto tg = build_training_graph(n.g, TrainingSpec{});
    ASSERT_TRUE(tg) << tg.status().message();
    EXPECT_EQ(tg->appended_loss, !own_loss);
    EXPECT_EQ(tg->vocab, own_loss ? 50 : 4);  // appended: the logits' width
  }
}

}  // namespace
}  // namespace oases

namespace oases {
namespace {

// ViT's class token as the dynamo exporter writes it with a static batch of 2: two equal copies
// [2, 1, 4] concatenated before the patch embeddings. The pipeline makes it one token [1, 1, 4]
// read through an Expand, and the classifier trains it; copies that differ stay as they are.
TEST(Parameters, ATokenCopiedPerBatchRowIsOneLearnedToken) {
  for (bool equal_rows : {true, false}) {
    Net n;
    n.g.opset_imports[""] = 18;
    ValueId x = n.g.add_input("patches", DType::kF32, {2, 3, 4});
    Tensor copies(DType::kF32, {2, 1, 4});
    for (int64_t i = 0; i < 8; ++i)
      copies.mutable_data<float>()[i] = 0.25f * static_cast<float>(i % 4) + (equal_rows ? 0.f : 0.5f * (i / 4));
    n.g.add_initializer("expand", copies);
    ValueId y = n.op("Concat", {n.g.find_value("expand"), x}, AttrMap{{"axis", Attribute::of_int(1)}});
    n.g.set_outputs({y});
    auto reports = run_canonical_passes(n.g, FoldOptions{});
    ASSERT_TRUE(reports) << reports.status().message();
    ValueId tok = n.g.find_value("expand");
    ASSERT_NE(tok, kNoId);
    EXPECT_EQ(n.g.value(tok).shape, (equal_rows ? Shape{1, 1, 4} : Shape{2, 1, 4}));
    EXPECT_EQ(n.g.value(y).shape, (Shape{2, 4, 4}));
    for (const InitializerRole& r : classify_initializers(n.g)) {
      if (r.value == tok) {
        EXPECT_TRUE(r.trainable) << r.reason;  // read by a Concat beside activations
      }
    }
  }
}

}  // namespace
}  // namespace oases
