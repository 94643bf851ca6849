// Models below opset 13: read when every op is unchanged since (ONNX's schema history) or its
// schema here reads the older form (OpSchema::oldest_version); otherwise an error naming the node.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "importer/onnx_import.h"

namespace oases {
namespace {

onnx::ModelProto one_node_model(const std::string& op, int64_t opset, const std::vector<std::string>& inputs) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("the_node");
  for (const auto& in : inputs) {
    n->add_input(in);
    auto* vi = g->add_input();
    vi->set_name(in);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_value(2);
  }
  n->add_output("y");
  g->add_output()->set_name("y");
  return m;
}

ImportOptions older() {
  ImportOptions o;
  o.allow_older_opsets = true;
  return o;
}

TEST(OldOpset, RefusedByDefault) {
  auto g = import_onnx_model(one_node_model("Elu", 6, {"x"}), "");
  ASSERT_FALSE(g);
  EXPECT_NE(g.status().message().find("opset 6 of the default domain is outside the supported range 13–21"), std::string::npos);
}

TEST(OldOpset, UnchangedOpIsRead) {
  auto g = import_onnx_model(one_node_model("Elu", 6, {"x"}), "", older());
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(g->default_opset(), 6);
}

TEST(OldOpset, OlderFormKnownToTheSchemaIsRead) {
  auto g = import_onnx_model(one_node_model("Pow", 12, {"x", "p"}), "", older());
  EXPECT_TRUE(g) << g.status().message();
}

TEST(OldOpset, ChangedOpIsAnErrorNamingTheNode) {
  auto g = import_onnx_model(one_node_model("Softmax", 11, {"x"}), "", older());
  ASSERT_FALSE(g);
  const std::string& msg = g.status().message();
  EXPECT_NE(msg.find("outside the supported range 13"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[Softmax] node 'the_node'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Softmax-11"), std::string::npos) << msg;
}

TEST(OldOpset, NewerThanSupportedIsRejected) {
  auto g = import_onnx_model(one_node_model("Relu", 22, {"x"}), "");
  ASSERT_FALSE(g);
  EXPECT_NE(g.status().message().find("outside the supported range"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace oases
