// Builds ONNX ModelProtos in C++ for tests (unit tests and the e2e bad-input generator), so no
// Python is needed at test time. Nothing here checks the model: tests build broken ones on purpose.
//
//   ModelBuilder b(/*opset=*/17);
//   b.input("x", onnx::TensorProto::FLOAT, {"batch", 4});
//   b.init_f32("w", {4, 2}, {...});
//   b.node("MatMul", {"x", "w"}, {"y"}, "mm");
//   b.output("y");
//   b.write(dir / "model.onnx");
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace oases::testutil {

namespace fs = std::filesystem;

// A fresh folder under $TMPDIR, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/oases_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = fs::path(buf.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// One dimension of a value's type: a size, or a symbolic name.
struct Dim {
  int64_t value = -1;
  std::string param;
  Dim(int64_t v) : value(v) {}                 // NOLINT: implicit on purpose
  Dim(int v) : value(v) {}                     // NOLINT
  Dim(const char* p) : param(p) {}             // NOLINT
  Dim(std::string p) : param(std::move(p)) {}  // NOLINT
};

inline void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

inline std::string read_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

template <class T>
std::string as_bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// TensorProto with the given bytes as raw_data.
inline onnx::TensorProto raw_tensor(const std::string& name, int data_type, const std::vector<int64_t>& dims, const std::string& raw) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(data_type);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(raw);
  return t;
}

inline onnx::TensorProto f32_tensor(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v,
                                    bool raw = true) {
  if (raw) return raw_tensor(name, onnx::TensorProto::FLOAT, dims, as_bytes(v));
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  for (float x : v) t.add_float_data(x);
  return t;
}

inline onnx::TensorProto i64_tensor(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int64_t>& v,
                                    bool raw = true) {
  if (raw) return raw_tensor(name, onnx::TensorProto::INT64, dims, as_bytes(v));
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : dims) t.add_dims(d);
  for (int64_t x : v) t.add_int64_data(x);
  return t;
}

// TensorProto whose int32_data carries the values (int32, bool, and the bits of f16/bf16).
inline onnx::TensorProto int32_field_tensor(const std::string& name, int data_type, const std::vector<int64_t>& dims,
                                            const std::vector<int32_t>& v) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(data_type);
  for (int64_t d : dims) t.add_dims(d);
  for (int32_t x : v) t.add_int32_data(x);
  return t;
}

// Marks `t` as external data in `location` (relative to the model), optionally with offset/length.
inline void make_external(onnx::TensorProto* t, const std::string& location, int64_t offset = -1, int64_t length = -1) {
  t->clear_raw_data();
  t->clear_float_data();
  t->clear_int64_data();
  t->clear_int32_data();
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = t->add_external_data();
  kv->set_key("location");
  kv->set_value(location);
  if (offset >= 0) {
    kv = t->add_external_data();
    kv->set_key("offset");
    kv->set_value(std::to_string(offset));
  }
  if (length >= 0) {
    kv = t->add_external_data();
    kv->set_key("length");
    kv->set_value(std::to_string(length));
  }
}

// Attribute makers.
inline onnx::AttributeProto attr_int(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}
inline onnx::AttributeProto attr_float(const std::string& name, float v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(v);
  return a;
}
inline onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}
inline onnx::AttributeProto attr_string(const std::string& name, const std::string& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(v);
  return a;
}
inline onnx::AttributeProto attr_tensor(const std::string& name, const onnx::TensorProto& t) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::TENSOR);
  *a.mutable_t() = t;
  return a;
}

inline void set_value_type(onnx::ValueInfoProto* vi, const std::string& name, int elem_type, const std::vector<Dim>& dims,
                           bool with_shape = true) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  if (!with_shape) return;
  auto* sh = tt->mutable_shape();
  for (const Dim& d : dims) {
    auto* dp = sh->add_dim();
    if (d.param.empty()) {
      dp->set_dim_value(d.value);
    } else {
      dp->set_dim_param(d.param);
    }
  }
}

class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 17, int64_t ir_version = 8) {
    m_.set_ir_version(ir_version);
    m_.set_producer_name("oases-tests");
    auto* op = m_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    m_.mutable_graph()->set_name("test");
  }

  onnx::ModelProto& proto() { return m_; }
  onnx::GraphProto& graph() { return *m_.mutable_graph(); }

  ModelBuilder& opset(const std::string& domain, int64_t version) {
    for (auto& op : *m_.mutable_opset_import()) {
      if (op.domain() == domain) {
        op.set_version(version);
        return *this;
      }
    }
    auto* op = m_.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
    return *this;
  }

  ModelBuilder& input(const std::string& name, int elem_type, const std::vector<Dim>& dims) {
    set_value_type(graph().add_input(), name, elem_type, dims);
    return *this;
  }
  ModelBuilder& output(const std::string& name, int elem_type = onnx::TensorProto::FLOAT) {
    auto* vi = graph().add_output();
    set_value_type(vi, name, elem_type, {}, /*with_shape=*/false);
    return *this;
  }
  ModelBuilder& initializer(const onnx::TensorProto& t) {
    *graph().add_initializer() = t;
    return *this;
  }
  ModelBuilder& init_f32(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v, bool raw = true) {
    return initializer(f32_tensor(name, dims, v, raw));
  }
  ModelBuilder& init_i64(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int64_t>& v, bool raw = true) {
    return initializer(i64_tensor(name, dims, v, raw));
  }

  onnx::NodeProto& node(const std::string& op_type, const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                        const std::string& name = "", std::vector<onnx::AttributeProto> attrs = {}, const std::string& domain = "") {
    onnx::NodeProto* n = graph().add_node();
    n->set_op_type(op_type);
    if (!name.empty()) n->set_name(name);
    if (!domain.empty()) n->set_domain(domain);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    for (auto& a : attrs) *n->add_attribute() = std::move(a);
    return *n;
  }

  // A model-local function (ONNX FunctionProto) callable as `domain.name`.
  onnx::FunctionProto& function(const std::string& domain, const std::string& name, const std::vector<std::string>& inputs,
                                const std::vector<std::string>& outputs) {
    onnx::FunctionProto* f = m_.add_functions();
    f->set_domain(domain);
    f->set_name(name);
    for (const auto& i : inputs) f->add_input(i);
    for (const auto& o : outputs) f->add_output(o);
    auto* op = f->add_opset_import();
    op->set_domain("");
    op->set_version(m_.opset_import(0).version());
    return *f;
  }

  std::string serialize() const {
    std::string s;
    if (!m_.SerializeToString(&s)) throw std::runtime_error("cannot serialise the model");
    return s;
  }
  fs::path write(const fs::path& path) const {
    write_bytes(path, serialize());
    return path;
  }

 private:
  onnx::ModelProto m_;
};

// Adds a node to a function body.
inline onnx::NodeProto& function_node(onnx::FunctionProto& f, const std::string& op_type, const std::vector<std::string>& inputs,
                                      const std::vector<std::string>& outputs, std::vector<onnx::AttributeProto> attrs = {}) {
  onnx::NodeProto* n = f.add_node();
  n->set_op_type(op_type);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  for (auto& a : attrs) *n->add_attribute() = std::move(a);
  return *n;
}

}  // namespace oases::testutil
