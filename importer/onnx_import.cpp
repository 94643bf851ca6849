#include "importer/onnx_import.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include "graph/atomic_file.h"
#include "graph/op_registry.h"

namespace fs = std::filesystem;

namespace oases {

namespace {

constexpr uint64_t kMaxProtoBytes = (uint64_t{1} << 31) - 1;  // protobuf's hard limit

Status parse_file(const std::string& path, google::protobuf::Message* msg, const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return error("{}: no such file", path);
  if (!fs::is_regular_file(path, ec)) return error("{}: not a regular file", path);
  uint64_t size = fs::file_size(path, ec);
  if (ec) return error("{}: cannot read its size: {}", path, ec.message());
  if (size == 0) return error("{}: the file is empty, not {}", path, what);
  if (size > kMaxProtoBytes) {
    return error("{}: {} bytes is over protobuf's 2 GiB limit; store the weights as external data", path, size);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: cannot open for reading", path);
  google::protobuf::io::IstreamInputStream zin(&in);
  google::protobuf::io::CodedInputStream cin(&zin);
  cin.SetTotalBytesLimit(static_cast<int>(kMaxProtoBytes));
  if (!msg->ParseFromCodedStream(&cin) || !cin.ConsumedEntireMessage()) {
    return error("{}: not {} (protobuf parsing failed: the file is truncated or of another kind)", path, what);
  }
  return Status::ok();
}

// Resolves an external-data location against the model folder; it must stay inside.
Expected<std::string> confined_path(const std::string& base_dir, const std::string& location, const std::string& what) {
  if (base_dir.empty()) return error("{}: external data '{}' but the model has no folder to read it from", what, location);
  fs::path loc(location);
  if (location.empty()) return error("{}: external data has an empty location", what);
  if (loc.is_absolute()) return error("{}: external data path '{}' is absolute; it must be relative to the model's folder", what, location);
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::path(base_dir), ec);
  if (ec) return error("{}: cannot resolve the model folder '{}'", what, base_dir);
  fs::path full = fs::weakly_canonical(base / loc, ec);
  if (ec) return error("{}: cannot resolve external data path '{}'", what, location);
  auto [bend, fend] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (bend != base.end()) {
    return error("{}: external data path '{}' leaves the model's folder '{}' (it resolves to '{}')", what, location, base.string(),
                 full.string());
  }
  return full.string();
}

DType checked_dtype(int t, const std::string& what, Status* st) {
  DType d = dtype_from_onnx(t);
  if (d == DType::kUndefined) *st = error("{}: unsupported data type {} (ONNX TensorProto.DataType)", what, t);
  return d;
}

std::string attr_type_name(int t) {
  switch (t) {
    case onnx::AttributeProto::GRAPH: return "graph";
    case onnx::AttributeProto::GRAPHS: return "graphs";
    case onnx::AttributeProto::SPARSE_TENSOR: return "sparse tensor";
    case onnx::AttributeProto::TENSORS: return "tensors";
    case onnx::AttributeProto::TYPE_PROTO: return "type";
    default: return std::to_string(t);
  }
}

}  // namespace

Status read_model_proto(const std::string& path, onnx::ModelProto* model) {
  return parse_file(path, model, "an ONNX model");
}

namespace {

// A non-negative decimal integer (external data offsets and lengths); nullopt for anything else.
std::optional<uint64_t> parse_u64(const std::string& text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  return v;
}

// How many values the typed field that holds `dt` has (float_data, int64_data, ...).
int64_t typed_field_size(const onnx::TensorProto& tp, DType dt) {
  switch (dt) {
    case DType::kF32: return tp.float_data_size();
    case DType::kF64: return tp.double_data_size();
    case DType::kI64: return tp.int64_data_size();
    case DType::kU32:
    case DType::kU64: return tp.uint64_data_size();
    default: return tp.int32_data_size();  // int32, int16, int8, uint8, uint16, bool, float16, bfloat16
  }
}

Expected<Tensor> external_tensor(const onnx::TensorProto& tp, DType dt, const Shape& shape, uint64_t bytes, const std::string& base_dir,
                                 const std::string& what) {
  std::string location;
  uint64_t offset = 0, length = bytes;
  bool has_length = false;
  for (const auto& kv : tp.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset" || kv.key() == "length") {
      auto v = parse_u64(kv.value());
      if (!v) return error("{}: external data {} '{}' is not a non-negative integer", what, kv.key(), kv.value());
      if (kv.key() == "offset") {
        offset = *v;
      } else {
        length = *v;
        has_length = true;
      }
    }
  }
  OASES_ASSIGN_OR_RETURN(std::string path, confined_path(base_dir, location, what));
  if (has_length && length != bytes) {
    return error("{}: external data length {} does not match shape {} of {} ({} bytes)", what, length, shape_str(shape), dtype_name(dt),
                 bytes);
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) return error("{}: external data file '{}' does not exist", what, location);
  if (!fs::is_regular_file(path, ec)) return error("{}: external data file '{}' is not a regular file", what, location);
  uint64_t fsize = fs::file_size(path, ec);
  if (ec) return error("{}: cannot read the size of external data file '{}': {}", what, location, ec.message());
  if (offset > fsize || bytes > fsize - offset) {
    return error("{}: external data file '{}' has {} bytes, the tensor needs {} at offset {}", what, location, fsize, bytes, offset);
  }
  std::string w = what;
  return Tensor::lazy(dt, shape, [path, offset, w, location](void* dst, size_t n) -> Status {
    std::ifstream f(path, std::ios::binary);
    if (!f) return error("{}: cannot open external data file '{}'", w, location);
    f.seekg(static_cast<std::streamoff>(offset));
    f.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!f || static_cast<size_t>(f.gcount()) != n) {
      return error("{}: external data file '{}' is shorter than expected (changed since the model was read?)", w, location);
    }
    return Status::ok();
  });
}

}  // namespace

Expected<Tensor> tensor_from_proto(const onnx::TensorProto& tp, const std::string& base_dir, const std::string& what) {
  Status st;
  DType dt = checked_dtype(tp.data_type(), what, &st);
  if (!st.is_ok()) return st;
  Shape shape(tp.dims().begin(), tp.dims().end());
  for (int64_t d : shape) {
    if (d < 0) return error("{}: shape {} has a negative dimension", what, shape_str(shape));
  }
  std::optional<uint64_t> nbytes = checked_nbytes(shape, dt);
  if (!nbytes || *nbytes > max_tensor_bytes()) {
    return error("{}: shape {} of {} is over the limit of {} bytes per tensor (--max-memory)", what, shape_str(shape), dtype_name(dt),
                 max_tensor_bytes());
  }
  const uint64_t bytes = *nbytes;
  const uint64_t numel = bytes / dtype_size(dt);
  if (tp.has_segment()) return error("{}: segmented tensors are not supported", what);

  if (tp.data_location() == onnx::TensorProto::EXTERNAL) return external_tensor(tp, dt, shape, bytes, base_dir, what);

  // Every size is checked before the tensor is allocated: the dims of a small file may claim gigabytes.
  if (tp.has_raw_data()) {
    if (tp.raw_data().size() != bytes) {
      return error("{}: raw_data has {} bytes, shape {} of {} needs {}", what, tp.raw_data().size(), shape_str(shape), dtype_name(dt),
                   bytes);
    }
    Tensor t(dt, shape);
    if (bytes) std::memcpy(t.raw_mutable(), tp.raw_data().data(), bytes);
    return t;
  }
  int64_t have = typed_field_size(tp, dt);
  if (static_cast<uint64_t>(have) != numel) {
    return error("{}: has {} values, shape {} needs {}", what, have, shape_str(shape), numel);
  }
  Tensor t(dt, shape);
  if (!bytes) return t;
  void* dst = t.raw_mutable();
  switch (dt) {
    case DType::kF32: std::memcpy(dst, tp.float_data().data(), bytes); break;
    case DType::kF64: std::memcpy(dst, tp.double_data().data(), bytes); break;
    case DType::kI64: std::memcpy(dst, tp.int64_data().data(), bytes); break;
    case DType::kU32:
    case DType::kU64:
      for (uint64_t i = 0; i < numel; ++i) {
        if (dt == DType::kU32) {
          static_cast<uint32_t*>(dst)[i] = static_cast<uint32_t>(tp.uint64_data(static_cast<int>(i)));
        } else {
          static_cast<uint64_t*>(dst)[i] = tp.uint64_data(static_cast<int>(i));
        }
      }
      break;
    default:  // int32, int16, int8, uint8, uint16, bool, float16 and bfloat16 bits live in int32_data
      for (uint64_t i = 0; i < numel; ++i) {
        int32_t v = tp.int32_data(static_cast<int>(i));
        switch (dt) {
          case DType::kI32: static_cast<int32_t*>(dst)[i] = v; break;
          case DType::kI16: static_cast<int16_t*>(dst)[i] = static_cast<int16_t>(v); break;
          case DType::kI8: static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(v); break;
          case DType::kU8: static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(v); break;
          case DType::kBool: static_cast<uint8_t*>(dst)[i] = v != 0; break;
          default: static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(v); break;
        }
      }
  }
  return t;
}

Expected<std::pair<std::string, Tensor>> read_tensor_file(const std::string& path) {
  onnx::TensorProto tp;
  OASES_RETURN_IF_ERROR(parse_file(path, &tp, "a TensorProto file"));
  std::string dir = fs::path(path).parent_path().string();
  OASES_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(tp, dir, path));
  OASES_RETURN_IF_ERROR(t.load().with_context(path));
  return std::make_pair(tp.name(), t);
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* tp) {
  tp->Clear();
  tp->set_name(name);
  tp->set_data_type(dtype_to_onnx(t.dtype()));
  for (int64_t d : t.shape()) tp->add_dims(d);
  tp->set_raw_data(t.nbytes() ? std::string(static_cast<const char*>(t.raw()), t.nbytes()) : std::string());
}

Status write_tensor_file(const Tensor& t, const std::string& name, const std::string& path) {
  onnx::TensorProto tp;
  tensor_to_proto(t, name, &tp);
  std::string bytes;
  if (!tp.SerializeToString(&bytes)) return error("{}: cannot serialise tensor '{}'", path, name);
  return write_file_atomically(path, bytes);
}

namespace {

// Expands calls of model-local functions (the dynamo exporter may write them) into their bodies.
// Each call gets its own prefix for the body's names, so calls of one function never collide.
class FunctionInliner {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr size_t kMaxNodes = size_t{1} << 22;

  explicit FunctionInliner(const onnx::ModelProto& m) {
    for (const auto& f : m.functions()) funcs_[{norm_domain(f.domain()), f.name()}] = &f;
  }

  // Appends `n`, or the expansion of its body when it calls a local function, to `out`.
  Status expand(const onnx::NodeProto& n, std::vector<onnx::NodeProto>* out) { return expand(n, out, 0, n); }

 private:
  static std::string norm_domain(const std::string& d) { return d == "ai.onnx" ? "" : d; }

  Status expand(const onnx::NodeProto& n, std::vector<onnx::NodeProto>* out, int depth, const onnx::NodeProto& top) {
    auto it = funcs_.find({norm_domain(n.domain()), n.op_type()});
    if (it == funcs_.end()) {
      if (out->size() >= kMaxNodes) {
        return error("[{}] node '{}': inlining local functions gives more than {} nodes", top.op_type(), top.name(), kMaxNodes);
      }
      out->push_back(n);
      return Status::ok();
    }
    const onnx::FunctionProto& f = *it->second;
    if (depth >= kMaxDepth) {
      return error("[{}.{}] node '{}': local function calls nest deeper than {} (is '{}' recursive?)", n.domain(), n.op_type(), top.name(),
                   kMaxDepth, f.name());
    }
    std::string prefix = (n.name().empty() ? f.name() : n.name()) + "/";
    if (!prefixes_.insert(prefix).second) {  // unnamed or equally named calls
      prefix = fmt::format("{}#{}/", prefix.substr(0, prefix.size() - 1), calls_++);
      prefixes_.insert(prefix);
    }
    std::unordered_map<std::string, std::string> rename;
    for (int i = 0; i < f.input_size(); ++i) rename[f.input(i)] = i < n.input_size() ? n.input(i) : "";
    for (int i = 0; i < f.output_size(); ++i) rename[f.output(i)] = i < n.output_size() ? n.output(i) : "";
    std::unordered_map<std::string, const onnx::AttributeProto*> call_attrs;
    for (const auto& a : n.attribute()) call_attrs[a.name()] = &a;
    auto mapped = [&](const std::string& name) -> std::string {
      if (name.empty()) return name;
      auto r = rename.find(name);
      if (r != rename.end()) return r->second;
      return prefix + name;
    };
    for (const auto& body : f.node()) {
      onnx::NodeProto c = body;
      c.set_name(prefix + (body.name().empty() ? body.op_type() : body.name()));
      for (int i = 0; i < c.input_size(); ++i) c.set_input(i, mapped(body.input(i)));
      for (int i = 0; i < c.output_size(); ++i) c.set_output(i, mapped(body.output(i)));
      c.clear_attribute();
      for (const auto& a : body.attribute()) {
        if (!a.ref_attr_name().empty()) {
          auto r = call_attrs.find(a.ref_attr_name());
          if (r == call_attrs.end()) continue;  // optional attribute not given
          onnx::AttributeProto* na = c.add_attribute();
          *na = *r->second;
          na->set_name(a.name());
        } else {
          *c.add_attribute() = a;
        }
      }
      OASES_RETURN_IF_ERROR(expand(c, out, depth + 1, top));
    }
    return Status::ok();
  }

  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> funcs_;
  std::set<std::string> prefixes_;
  int64_t calls_ = 0;
};

Expected<Attribute> convert_attribute(const onnx::AttributeProto& a, const std::string& base_dir, const std::string& what) {
  switch (a.type()) {
    case onnx::AttributeProto::INT: return Attribute::of_int(a.i());
    case onnx::AttributeProto::FLOAT: return Attribute::of_float(a.f());
    case onnx::AttributeProto::STRING: return Attribute::of_string(a.s());
    case onnx::AttributeProto::INTS: return Attribute::of_ints({a.ints().begin(), a.ints().end()});
    case onnx::AttributeProto::FLOATS: return Attribute::of_floats({a.floats().begin(), a.floats().end()});
    case onnx::AttributeProto::STRINGS: return Attribute::of_strings({a.strings().begin(), a.strings().end()});
    case onnx::AttributeProto::TENSOR: {
      OASES_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(a.t(), base_dir, what + " attribute '" + a.name() + "'"));
      return Attribute::of_tensor(t);
    }
    default:
      return error("{}: attribute '{}' of type {} is not supported (control flow and sparse tensors are out of scope)", what, a.name(),
                   attr_type_name(a.type()));
  }
}

// A model below opset kMinOpset is read when each of its default-domain ops is defined there as at
// kMinOpset (same since-version in ONNX's schema history: And-7, Elu-6, Not-1, ...) or its schema
// here reads that older version (OpSchema::oldest_version: Unsqueeze-11, Dropout-10, ...); any other
// op (Softmax-11's 2-D coercion, Split-11's attribute, ...) is an error naming the node.
Status check_old_opset_ops(const std::vector<onnx::NodeProto>& nodes, int64_t opset) {
  for (size_t idx = 0; idx < nodes.size(); ++idx) {
    const onnx::NodeProto& n = nodes[idx];
    if (!is_default_domain(n.domain())) continue;
    std::string name = n.name().empty() ? fmt::format("{}_{}", n.op_type(), idx) : n.name();
    std::string what = fmt::format("[{}] node '{}'", n.op_type(), name);
    const auto* old_def = onnx::OpSchemaRegistry::Schema(n.op_type(), static_cast<int>(opset), "");
    if (!old_def) return error("{}: {} is not an op of opset {}, which the model imports", what, n.op_type(), opset);
    const auto* new_def = onnx::OpSchemaRegistry::Schema(n.op_type(), kMinOpset, "");
    if (new_def && new_def->since_version() == old_def->since_version()) continue;
    const OpSchema* ours = OpRegistry::global().find("", n.op_type());
    if (ours && old_def->since_version() >= ours->oldest_version) continue;
    return error(
        "opset {} of the default domain is outside the supported range {}–{}, and {} is {}-{}, which differs "
        "from the op in opset {} (older opsets are read where every op is unchanged since or known here in its "
        "older form)",
        opset, kMinOpset, kMaxOpset, what, n.op_type(), old_def->since_version(), kMinOpset);
  }
  return Status::ok();
}

}  // namespace

Expected<Graph> import_onnx_model(const onnx::ModelProto& model, const std::string& base_dir, const ImportOptions& opts) {
  Graph g;
  if (!model.has_ir_version()) return Status::error("the model has no IR version; is it an ONNX model?");
  if (model.ir_version() < kMinIrVersion || model.ir_version() > kMaxIrVersion) {
    return error("IR version {} is outside the supported range {}–{}", model.ir_version(), kMinIrVersion, kMaxIrVersion);
  }
  if (!model.has_graph()) return Status::error("the model has no graph");
  g.ir_version = model.ir_version();
  g.producer_name = model.producer_name();
  g.producer_version = model.producer_version();
  for (const auto& op : model.opset_import()) {
    std::string d = op.domain() == "ai.onnx" ? "" : op.domain();
    g.opset_imports[d] = op.version();
  }
  if (!g.opset_imports.count("")) return Status::error("the model imports no opset of the default ONNX domain");
  int64_t opset = g.opset_imports[""];
  if (opset < (opts.allow_older_opsets ? 1 : kMinOpset) || opset > kMaxOpset) {
    return error("opset {} of the default domain is outside the supported range {}–{}", opset, kMinOpset, kMaxOpset);
  }
  const onnx::GraphProto& gp = model.graph();
  g.name = gp.name();

  // Initializers.
  std::set<std::string> init_names;
  for (const auto& tp : gp.initializer()) {
    if (tp.name().empty()) return Status::error("an initializer has no name");
    if (!init_names.insert(tp.name()).second) return error("initializer '{}' is defined twice", tp.name());
    OASES_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(tp, base_dir, "initializer '" + tp.name() + "'"));
    g.add_initializer(tp.name(), t);
  }
  if (gp.sparse_initializer_size() > 0) return Status::error("sparse initializers are not supported");

  // Inputs, with symbolic dimensions bound: by --dim, and by the --shape of any input that names
  // the dim (so --shape ids=2,7 also shapes attention_mask[batch, seq]); bindings must agree.
  struct Binding {
    int64_t value;
    std::string source;
  };
  std::map<std::string, Binding> bound;
  for (const auto& [name, v] : opts.dims) bound[name] = {v, fmt::format("--dim {}={}", name, v)};
  std::set<std::string> input_names;
  for (const auto& vi : gp.input()) {
    if (!init_names.count(vi.name())) input_names.insert(vi.name());
  }
  for (const auto& [name, shape] : opts.input_shapes) {
    if (!input_names.count(name)) {
      return error("--shape names '{}', which is not an input of the model (inputs: {})", name, fmt::join(input_names, ", "));
    }
  }
  for (const auto& vi : gp.input()) {
    auto sb = opts.input_shapes.find(vi.name());
    if (init_names.count(vi.name()) || sb == opts.input_shapes.end() || !vi.type().has_tensor_type()) continue;
    const auto& tt = vi.type().tensor_type();
    if (!tt.has_shape()) continue;
    if (tt.shape().dim_size() != static_cast<int>(sb->second.size())) {
      return error("--shape {} gives rank {}, the model's input '{}' has rank {}", vi.name(), sb->second.size(), vi.name(),
                   tt.shape().dim_size());
    }
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (!d.has_dim_param() || d.dim_param().empty()) continue;
      int64_t v = sb->second[i];
      auto [it, fresh] = bound.insert({d.dim_param(), {v, fmt::format("--shape {}", vi.name())}});
      if (!fresh && it->second.value != v) {
        return error("symbolic dimension '{}' is {} by {} but {} by --shape {} (dim {} of input '{}')", d.dim_param(), it->second.value,
                     it->second.source, v, vi.name(), i, vi.name());
      }
    }
  }
  for (const auto& vi : gp.input()) {
    if (init_names.count(vi.name())) continue;  // an initializer listed as input (IR < 4)
    if (!vi.type().has_tensor_type()) return error("input '{}' is not a tensor (sequences and maps are not supported)", vi.name());
    const auto& tt = vi.type().tensor_type();
    Status st;
    DType dt = checked_dtype(tt.elem_type(), "input '" + vi.name() + "'", &st);
    if (!st.is_ok()) return st;
    Shape shape;
    std::vector<std::string> names;
    auto sb = opts.input_shapes.find(vi.name());
    if (!tt.has_shape() && sb == opts.input_shapes.end()) {
      if (opts.require_bound_dims) return error("input '{}' has no shape; give it with --shape {}=d0,d1,...", vi.name(), vi.name());
      if (g.find_value(vi.name()) != kNoId) return error("input '{}' is defined twice", vi.name());
      g.value(g.add_input(vi.name(), dt, {})).has_shape = false;  // not even the rank is known
      continue;
    }
    if (sb != opts.input_shapes.end()) {
      shape = sb->second;
      for (int i = 0; tt.has_shape() && i < tt.shape().dim_size(); ++i) {
        const auto& d = tt.shape().dim(i);
        if (d.has_dim_value() && d.dim_value() != shape[i]) {
          return error("--shape {} sets dim {} to {}, the model's input '{}' fixes it at {}", vi.name(), i, shape[i], vi.name(),
                       d.dim_value());
        }
        names.push_back(d.has_dim_param() ? d.dim_param() : "");
      }
    } else {
      for (int i = 0; i < tt.shape().dim_size(); ++i) {
        const auto& d = tt.shape().dim(i);
        if (d.has_dim_value()) {
          if (d.dim_value() < 0) return error("input '{}' dim {} is negative ({})", vi.name(), i, d.dim_value());
          shape.push_back(d.dim_value());
          names.push_back("");
        } else if (d.has_dim_param() && !d.dim_param().empty()) {
          auto b = bound.find(d.dim_param());
          if (b == bound.end()) {
            if (opts.require_bound_dims) {
              return error("input '{}' dim {} is the symbolic dimension '{}'; bind it with --dim {}=N or --shape {}=...", vi.name(), i,
                           d.dim_param(), d.dim_param(), vi.name());
            }
            shape.push_back(-1);
          } else {
            shape.push_back(b->second.value);
          }
          names.push_back(d.dim_param());
        } else {
          if (opts.require_bound_dims) {
            return error("input '{}' dim {} has no size and no name; give the shape with --shape {}=d0,d1,...", vi.name(), i, vi.name());
          }
          shape.push_back(-1);
          names.push_back("?");
        }
      }
    }
    bool known = true;
    for (int64_t d : shape) {
      if (d < -1) return error("input '{}' has a negative dimension in {}", vi.name(), shape_str(shape));
      known &= d >= 0;
    }
    if (known) {
      std::optional<uint64_t> nbytes = checked_nbytes(shape, dt);
      if (!nbytes || *nbytes > max_tensor_bytes()) {
        return error("input '{}' of shape {} of {} is over the limit of {} bytes per tensor (--max-memory)", vi.name(), shape_str(shape),
                     dtype_name(dt), max_tensor_bytes());
      }
    }
    if (g.find_value(vi.name()) != kNoId) return error("input '{}' is defined twice", vi.name());
    ValueId v = g.add_input(vi.name(), dt, shape);
    g.value(v).dim_names = names;
  }
  // Nodes (model-local functions expanded).
  std::vector<onnx::NodeProto> nodes;
  FunctionInliner inliner(model);
  for (const auto& n : gp.node()) OASES_RETURN_IF_ERROR(inliner.expand(n, &nodes));
  if (opset < kMinOpset) OASES_RETURN_IF_ERROR(check_old_opset_ops(nodes, opset));

  auto value_for = [&](const std::string& name) -> ValueId {
    ValueId v = g.find_value(name);
    return v != kNoId ? v : g.add_value(name);
  };
  std::set<std::string> node_names;
  for (size_t idx = 0; idx < nodes.size(); ++idx) {
    const onnx::NodeProto& np = nodes[idx];
    std::string nname = np.name().empty() ? fmt::format("{}_{}", np.op_type(), idx) : np.name();
    if (!node_names.insert(nname).second) nname = fmt::format("{}_{}", nname, idx);
    std::string what = fmt::format("[{}] node '{}'", np.op_type(), nname);
    std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
    // Ops Oases does not know (If, Loop, Scan, ...) keep none of their attributes: the node is
    // listed with every other unsupported one by check_supported, rather than failing here alone.
    const bool known_op = OpRegistry::global().find(domain, np.op_type()) != nullptr;
    AttrMap attrs;
    for (const auto& a : np.attribute()) {
      auto attr = convert_attribute(a, base_dir, what);
      if (!attr && !known_op) continue;
      if (!attr) return attr.status();
      attrs.set(a.name(), *attr);
    }
    std::vector<ValueId> ins, outs;
    for (const auto& in : np.input()) ins.push_back(in.empty() ? kNoId : value_for(in));
    for (const auto& out : np.output()) {
      if (out.empty()) {
        outs.push_back(kNoId);
        continue;
      }
      ValueId v = value_for(out);
      const Value& val = g.value(v);
      if (val.producer != kNoId || val.is_input || val.is_initializer) {
        return error("{}: output '{}' is already defined elsewhere (the graph is not in SSA form)", what, out);
      }
      outs.push_back(v);
    }
    NodeId id = g.add_node(np.op_type(), ins, outs, attrs, nname, domain);
    auto oi = g.opset_imports.find(domain);
    g.node(id).opset = oi == g.opset_imports.end() ? 0 : static_cast<int>(oi->second);
  }
  for (const auto& vi : gp.output()) {
    ValueId v = g.find_value(vi.name());
    if (v == kNoId) return error("graph output '{}' is produced by no node", vi.name());
    g.add_output(v);
  }
  if (g.outputs().empty()) return Status::error("the graph has no outputs");

  // Every value read must be defined somewhere; unsupported ops are listed all at once later.
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    for (ValueId v : n.inputs) {
      if (v == kNoId) continue;
      const Value& val = g.value(v);
      if (val.producer == kNoId && !val.is_input && !val.is_constant()) {
        return error("{} reads '{}', which no node, input or initializer defines", n.describe(), val.name);
      }
    }
  }
  auto order = g.topo_order();
  if (!order) return order.status();
  return g;
}

Expected<Graph> import_onnx_file(const std::string& path, const ImportOptions& opts) {
  onnx::ModelProto model;
  OASES_RETURN_IF_ERROR(read_model_proto(path, &model));
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  auto g = import_onnx_model(model, dir, opts);
  if (!g) return g.status().with_context(path);
  g->source_path = path;
  return g;
}

Status parse_dim_binding(const std::string& text, ImportOptions* opts) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return error("--dim '{}' must look like NAME=N", text);
  try {
    size_t used = 0;
    int64_t v = std::stoll(text.substr(eq + 1), &used);
    if (used != text.size() - eq - 1 || v < 0) throw std::invalid_argument("bad");
    opts->dims[text.substr(0, eq)] = v;
  } catch (const std::exception&) {
    return error("--dim '{}': '{}' is not a non-negative integer", text, text.substr(eq + 1));
  }
  // An empty batch or sequence has nothing to run or train on, and the passes and the training
  // graph divide by these sizes: refused here, where the user typed it.
  if (opts->dims[text.substr(0, eq)] == 0) return error("--dim '{}': a dimension must be at least 1", text);
  return Status::ok();
}

Status parse_shape_binding(const std::string& text, ImportOptions* opts) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return error("--shape '{}' must look like INPUT=d0,d1,...", text);
  Shape s;
  std::string rest = text.substr(eq + 1);
  size_t pos = 0;
  while (pos <= rest.size() && !rest.empty()) {
    size_t comma = rest.find(',', pos);
    std::string tok = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      int64_t v = std::stoll(tok, &used);
      if (used != tok.size() || v < 0) throw std::invalid_argument("bad");
      s.push_back(v);
    } catch (const std::exception&) {
      return error("--shape '{}': '{}' is not a non-negative integer", text, tok);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  for (int64_t d : s) {
    if (d == 0) return error("--shape '{}': every dimension must be at least 1", text);
  }
  opts->input_shapes[text.substr(0, eq)] = s;
  return Status::ok();
}

}  // namespace oases
