#include "graph/sharding.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace oases {

int64_t Mesh::size() const {
  int64_t n = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (is_base(static_cast<int>(i))) n *= sizes[i];
  }
  return n;
}

bool Mesh::has_compound_axes() const {
  for (const auto& p : parts) {
    if (!p.empty()) return true;
  }
  return false;
}

uint32_t Mesh::base_mask(int a) const {
  if (a < 0) return 0;
  if (is_base(a)) return 1u << a;
  uint32_t m = 0;
  for (int b : parts[static_cast<size_t>(a)]) m |= 1u << b;
  return m;
}

int Mesh::add_compound(const std::string& name, const std::vector<int>& base_axes) {
  parts.resize(axes.size());
  int64_t n = 1;
  for (int b : base_axes) n *= sizes.at(static_cast<size_t>(b));
  axes.push_back(name);
  sizes.push_back(n);
  parts.push_back(base_axes);
  return static_cast<int>(axes.size()) - 1;
}

Status Mesh::validate() const {
  if (sizes.size() != axes.size() || parts.size() > axes.size())
    return error("mesh {}: axes, sizes and parts disagree in length", to_string());
  if (axes.size() > 32) return error("mesh {}: more than 32 axes", to_string());
  for (size_t i = 0; i < axes.size(); ++i) {
    if (sizes[i] < 1) return error("mesh {}: axis '{}' has size {}", to_string(), axes[i], sizes[i]);
    for (size_t j = 0; j < i; ++j) {
      if (axes[j] == axes[i]) return error("mesh {}: axis '{}' named twice", to_string(), axes[i]);
    }
    if (is_base(static_cast<int>(i))) continue;
    int64_t n = 1;
    uint32_t seen = 0;
    for (int b : parts[i]) {
      if (b < 0 || static_cast<size_t>(b) >= axes.size() || !is_base(b))
        return error("mesh {}: axis '{}' spans {}, not a base axis", to_string(), axes[i], b);
      if ((seen >> b) & 1u)
        return error("mesh {}: axis '{}' spans base axis '{}' twice", to_string(), axes[i], axes[static_cast<size_t>(b)]);
      seen |= 1u << b;
      n *= sizes[static_cast<size_t>(b)];
    }
    if (n != sizes[i]) return error("mesh {}: axis '{}' has size {}, its parts {}", to_string(), axes[i], sizes[i], n);
  }
  return Status::ok();
}

bool Mesh::operator==(const Mesh& o) const {
  if (axes != o.axes || sizes != o.sizes) return false;
  for (int a = 0; a < num_axes(); ++a) {
    if (is_base(a) != o.is_base(a)) return false;
    if (!is_base(a) && parts[static_cast<size_t>(a)] != o.parts[static_cast<size_t>(a)]) return false;
  }
  return true;
}

int Mesh::axis(const std::string& name) const {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int64_t> Mesh::coords(int64_t rank) const {
  std::vector<int64_t> c(sizes.size());
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    if (!is_base(static_cast<int>(i))) continue;
    c[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (is_base(static_cast<int>(i))) continue;
    int64_t x = 0;
    for (int b : parts[i]) x = x * sizes[static_cast<size_t>(b)] + c[static_cast<size_t>(b)];
    c[i] = x;
  }
  return c;
}

int64_t Mesh::rank_of(const std::vector<int64_t>& c) const {
  int64_t r = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (is_base(static_cast<int>(i))) r = r * sizes[i] + c[i];
  }
  return r;
}

std::vector<int64_t> Mesh::group(int64_t rank, int a) const {
  std::vector<int64_t> c = coords(rank), out;
  for (int64_t i = 0; i < sizes.at(static_cast<size_t>(a)); ++i) {
    if (is_base(a)) {
      c[a] = i;
    } else {
      int64_t x = i;
      const auto& p = parts[static_cast<size_t>(a)];
      for (auto it = p.rbegin(); it != p.rend(); ++it) {
        c[static_cast<size_t>(*it)] = x % sizes[static_cast<size_t>(*it)];
        x /= sizes[static_cast<size_t>(*it)];
      }
    }
    out.push_back(rank_of(c));
  }
  return out;
}

std::string Mesh::to_string() const {
  std::vector<std::string> parts_text;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (is_base(static_cast<int>(i))) {
      parts_text.push_back(fmt::format("{}={}", axes[i], sizes[i]));
    } else {
      std::vector<std::string> names;
      for (int b : parts[i]) names.push_back(b >= 0 && static_cast<size_t>(b) < axes.size() ? axes[static_cast<size_t>(b)] : "?");
      parts_text.push_back(fmt::format("{}=({})", axes[i], fmt::join(names, " ")));
    }
  }
  return fmt::format("{}", fmt::join(parts_text, " x "));
}

bool ShardingSpec::is_replicated() const {
  if (partial) return false;
  for (const auto& d : dims) {
    if (d.axis >= 0) return false;
  }
  return true;
}

int ShardingSpec::dim_of_axis(int a) const {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].axis == a && a >= 0) return static_cast<int>(i);
  }
  return -1;
}

ShardingSpec ShardingSpec::with_dim(size_t d, int axis, int segments) const {
  ShardingSpec s = *this;
  s.dims.at(d) = DimSpec{axis, axis < 0 ? 1 : segments};
  return s;
}

ShardingSpec ShardingSpec::with_partial(int a, bool on) const {
  ShardingSpec s = *this;
  if (on) {
    s.partial |= 1u << a;
  } else {
    s.partial &= ~(1u << a);
  }
  return s;
}

ShardingSpec ShardingSpec::without_partial() const {
  ShardingSpec s = *this;
  s.partial = 0;
  return s;
}

size_t ShardingSpec::hash() const {
  size_t h = 1469598103934665603ull ^ partial;
  for (const auto& d : dims) h = (h ^ static_cast<size_t>(d.axis + 2) ^ (static_cast<size_t>(d.segments) << 8)) * 1099511628211ull;
  return h;
}

std::string ShardingSpec::to_string(const Mesh* mesh) const {
  auto name = [&](int a) { return mesh && a < mesh->num_axes() ? mesh->axes[a] : std::to_string(a); };
  std::vector<std::string> parts;
  for (const auto& d : dims) {
    if (d.axis < 0) {
      parts.push_back("R");
    } else if (d.segments > 1) {
      parts.push_back(fmt::format("S({})/{}", name(d.axis), d.segments));
    } else {
      parts.push_back(fmt::format("S({})", name(d.axis)));
    }
  }
  std::string s = fmt::format("[{}]", fmt::join(parts, ", "));
  for (int a = 0; a < 32; ++a) {
    if (is_partial(a)) s += fmt::format(" P({})", name(a));
  }
  return s;
}

Status ShardingSpec::validate(const Shape& global, const Mesh& mesh) const {
  if (global.size() != dims.size()) return error("spec {} has rank {}, the value {}", to_string(&mesh), dims.size(), shape_str(global));
  uint32_t used = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    const DimSpec& d = dims[i];
    if (d.axis < 0) continue;
    if (d.axis >= mesh.num_axes()) return error("spec {} names mesh axis {} of a {}-axis mesh", to_string(&mesh), d.axis, mesh.num_axes());
    if (used & mesh.base_mask(d.axis)) return error("spec {} shards two dimensions over '{}'", to_string(&mesh), mesh.axes[d.axis]);
    used |= mesh.base_mask(d.axis);
    int64_t parts = mesh.sizes[d.axis] * d.segments;
    if (global[i] % parts != 0) {
      return error("dimension {} of {} ({}) does not divide into {} {}{}", i, shape_str(global), global[i], mesh.sizes[d.axis],
                   mesh.axes[d.axis], d.segments > 1 ? fmt::format(" x {} segments", d.segments) : "");
    }
  }
  uint32_t partial_bases = 0;
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (!is_partial(a)) continue;
    if (partial_bases & mesh.base_mask(a)) return error("spec {} is partial twice over one base axis", to_string(&mesh));
    partial_bases |= mesh.base_mask(a);
  }
  if (partial_bases & used) return error("spec {} is both sharded and partial over one axis", to_string(&mesh));
  return Status::ok();
}

Shape ShardingSpec::local_shape(const Shape& global, const Mesh& mesh) const {
  Shape s = global;
  for (size_t i = 0; i < dims.size() && i < s.size(); ++i) {
    if (dims[i].axis >= 0) s[i] /= mesh.sizes[dims[i].axis];
  }
  return s;
}

ShardContext::ShardContext(const Graph& g, const Node& n, const Mesh& mesh, std::vector<ShardingSpec> inputs)
    : g_(g), n_(n), mesh_(mesh), in_(std::move(inputs)), required_(in_.size(), false) {
  out_.resize(n.outputs.size());
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] != kNoId) out_[i] = ShardingSpec::replicated(g.value(n.outputs[i]).shape.size());
  }
}

void ShardContext::require(int i, ShardingSpec s) {
  if (in_.at(static_cast<size_t>(i)) == s) return;
  in_[static_cast<size_t>(i)] = std::move(s);
  required_[static_cast<size_t>(i)] = true;
}

void ShardContext::set_out(int i, ShardingSpec s) {
  out_.at(static_cast<size_t>(i)) = std::move(s);
}

void ShardContext::require_no_partial() {
  for (int i = 0; i < num_inputs(); ++i) {
    if (has_input(i) && in(i).any_partial()) require(i, in(i).without_partial());
  }
}

void ShardContext::require_replicated_dims(int i, int64_t from, int64_t to) {
  ShardingSpec s = in(i);
  bool change = false;
  for (int64_t d = std::max<int64_t>(0, from); d < to && d < static_cast<int64_t>(s.rank()); ++d) {
    if (s.dims[d].axis >= 0) {
      s.dims[d] = DimSpec{};
      change = true;
    }
  }
  if (change) require(i, s);
}

std::string ShardContext::describe_inputs() const {
  std::vector<std::string> parts;
  for (int i = 0; i < num_inputs(); ++i) parts.push_back(has_input(i) ? in(i).to_string(&mesh_) : "-");
  return fmt::format("{}", fmt::join(parts, " x "));
}

Status shard_elementwise(ShardContext& c, PartialPolicy policy, int first_input) {
  const Node& n = c.node();
  Shape out = c.out_shape(0);
  size_t R = out.size();
  ShardingSpec o = ShardingSpec::replicated(R);
  uint32_t used_axes = 0;
  // dims
  for (size_t d = 0; d < R; ++d) {
    DimSpec chosen;
    for (int i = first_input; i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      Shape s = c.in_shape(i);
      if (s.size() + d < R) continue;
      size_t j = d - (R - s.size());
      if (s[j] != out[d]) continue;  // broadcast dim
      const DimSpec& ds = c.in(i).dims[j];
      if (ds.axis >= 0 && !((used_axes >> ds.axis) & 1u)) {
        chosen = ds;
        break;
      }
    }
    if (chosen.axis >= 0) used_axes |= 1u << chosen.axis;
    o.dims[d] = chosen;
    for (int i = first_input; i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      Shape s = c.in_shape(i);
      if (s.size() + d < R) continue;
      size_t j = d - (R - s.size());
      DimSpec want = s[j] == out[d] ? chosen : DimSpec{};
      if (c.in(i).dims[j] != want) c.require(i, c.in(i).with_dim(j, want.axis, want.segments));
    }
  }
  // partial sums
  for (int a = 0; a < c.mesh().num_axes(); ++a) {
    std::vector<int> partial_inputs;
    int present = 0;
    for (int i = first_input; i < c.num_inputs(); ++i) {
      if (!c.has_input(i)) continue;
      ++present;
      if (c.in(i).is_partial(a)) partial_inputs.push_back(i);
    }
    if (partial_inputs.empty()) continue;
    bool keep = false;
    if ((used_axes >> a) & 1u) {
      keep = false;
    } else if (policy == PartialPolicy::kAdditive) {
      keep = static_cast<int>(partial_inputs.size()) == present;
    } else if (policy == PartialPolicy::kMultiplicative) {
      keep = true;  // the first partial factor stays, the others are reduced below
    } else if (policy == PartialPolicy::kFirstOnly) {
      keep = partial_inputs[0] == first_input;
    }
    if (keep) {
      o.partial |= 1u << a;
      size_t from = policy == PartialPolicy::kAdditive ? partial_inputs.size() : 1;
      for (size_t k = from; k < partial_inputs.size(); ++k) c.require(partial_inputs[k], c.in(partial_inputs[k]).with_partial(a, false));
    } else {
      for (int i : partial_inputs) c.require(i, c.in(i).with_partial(a, false));
    }
  }
  for (int k = 0; k < c.num_outputs(); ++k) {
    if (c.has_output(k) && c.out_shape(k) == out) c.set_out(k, o);
  }
  (void)n;
  return Status::ok();
}

Status shard_same_as_input(ShardContext& c, PartialPolicy policy) {
  if (policy == PartialPolicy::kNone) c.require_no_partial();
  for (int k = 0; k < c.num_outputs(); ++k) {
    if (c.has_output(k) && c.out_shape(k).size() == c.in(0).rank()) c.set_out(k, c.in(0));
  }
  return Status::ok();
}

Status shard_reshape(ShardContext& c) {
  Shape in = c.in_shape(0), out = c.out_shape(0);
  ShardingSpec is = c.in(0);
  ShardingSpec os = ShardingSpec::replicated(out.size());
  os.partial = is.partial;
  ShardingSpec want = is;
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    // trivial size-1 dims stand alone and are replicated
    if (i < in.size() && in[i] == 1) {
      if (want.dims[i].axis >= 0) want.dims[i] = DimSpec{};
      ++i;
      continue;
    }
    if (j < out.size() && out[j] == 1) {
      ++j;
      continue;
    }
    if (i >= in.size() || j >= out.size()) break;
    size_t i0 = i, j0 = j;
    int64_t pi = in[i++], po = out[j++];
    while (pi != po) {
      if (pi < po && i < in.size()) {
        pi *= in[i++];
      } else if (po < pi && j < out.size()) {
        po *= out[j++];
      } else {
        break;
      }
    }
    DimSpec lead = is.dims[i0];
    for (size_t k = i0 + 1; k < i; ++k) {
      if (is.dims[k].axis >= 0) want.dims[k] = DimSpec{};  // only the outermost dim of a group may stay sharded
    }
    if (lead.axis >= 0) {
      int64_t parts = c.mesh().axis_size(lead.axis) * lead.segments;
      if (out[j0] % parts == 0) {
        os.dims[j0] = lead;
      } else {
        want.dims[i0] = DimSpec{};
      }
    }
  }
  if (want != is) c.require(0, want);
  c.set_out(0, os);
  return Status::ok();
}

Status shard_replicated_only(ShardContext& c) {
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (c.has_input(i)) c.require(i, ShardingSpec::replicated(c.in(i).rank()));
  }
  for (int k = 0; k < c.num_outputs(); ++k) {
    if (c.has_output(k)) c.set_out(k, ShardingSpec::replicated(c.out_shape(k).size()));
  }
  return Status::ok();
}

namespace {

// The `index`-th of `parts` pieces of every segment of dimension `dim`, concatenated.
Tensor take_part(const Tensor& t, size_t dim, int64_t segments, int64_t parts, int64_t index) {
  const Shape& s = t.shape();
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < dim; ++d) outer *= s[d];
  for (size_t d = dim + 1; d < s.size(); ++d) inner *= s[d];
  int64_t seg_len = s[dim] / segments, piece = seg_len / parts;
  Shape os = s;
  os[dim] = segments * piece;
  Tensor out(t.dtype(), os);
  size_t es = dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(out.raw_mutable());
  size_t run = static_cast<size_t>(piece * inner) * es;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t g = 0; g < segments; ++g) {
      const char* from = src + ((o * s[dim] + g * seg_len + index * piece) * inner) * static_cast<int64_t>(es);
      char* to = dst + ((o * os[dim] + g * piece) * inner) * static_cast<int64_t>(es);
      std::memcpy(to, from, run);
    }
  }
  return out;
}

// Inverse of take_part over all pieces.
Tensor join_parts(const std::vector<Tensor>& pieces, size_t dim, int64_t segments) {
  const Shape& ps = pieces[0].shape();
  int64_t parts = static_cast<int64_t>(pieces.size());
  Shape s = ps;
  s[dim] *= parts;
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < dim; ++d) outer *= s[d];
  for (size_t d = dim + 1; d < s.size(); ++d) inner *= s[d];
  int64_t piece = ps[dim] / segments, seg_len = piece * parts;
  Tensor out(pieces[0].dtype(), s);
  size_t es = dtype_size(out.dtype());
  char* dst = static_cast<char*>(out.raw_mutable());
  size_t run = static_cast<size_t>(piece * inner) * es;
  for (int64_t i = 0; i < parts; ++i) {
    const char* src = static_cast<const char*>(pieces[i].raw());
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t g = 0; g < segments; ++g) {
        std::memcpy(dst + ((o * s[dim] + g * seg_len + i * piece) * inner) * static_cast<int64_t>(es),
                    src + ((o * ps[dim] + g * piece) * inner) * static_cast<int64_t>(es), run);
      }
    }
  }
  return out;
}

}  // namespace

Tensor slice_for_rank(const Tensor& global, const ShardingSpec& spec, const Mesh& mesh, int64_t rank) {
  std::vector<int64_t> coords = mesh.coords(rank);
  Tensor t = global;
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    const DimSpec& ds = spec.dims[d];
    if (ds.axis < 0) continue;
    t = take_part(t, d, ds.segments, mesh.sizes[static_cast<size_t>(ds.axis)], coords[static_cast<size_t>(ds.axis)]);
  }
  if (spec.any_partial()) {
    bool first = true;
    for (int a = 0; a < mesh.num_axes(); ++a) {
      if (spec.is_partial(a) && coords[static_cast<size_t>(a)] != 0) first = false;
    }
    if (!first) return Tensor(global.dtype(), t.shape());
  }
  if (t.raw() == global.raw()) t = global.clone();
  return t;
}

Tensor assemble_from_ranks(const std::vector<Tensor>& parts, const ShardingSpec& spec, const Mesh& mesh, const Shape& global) {
  if (mesh.has_compound_axes()) {
    // Each rank's part holds the elements slice_for_rank picks: slice a tensor of global element
    // indices the same way and scatter.
    int64_t n = shape_numel(global);
    Tensor index(DType::kI64, global);
    for (int64_t i = 0; i < n; ++i) static_cast<int64_t*>(index.raw_mutable())[i] = i;
    Tensor out(parts.at(0).dtype(), global);
    size_t es = dtype_size(out.dtype());
    for (int64_t r = 0; r < static_cast<int64_t>(parts.size()); ++r) {
      Tensor where = slice_for_rank(index, spec, mesh, r);
      if (where.shape() != parts[static_cast<size_t>(r)].shape()) {
        throw OasesError(fmt::format("assembling shards: rank {} holds {}, its slice is {}", r,
                                     shape_str(parts[static_cast<size_t>(r)].shape()), shape_str(where.shape())));
      }
      const int64_t* w = static_cast<const int64_t*>(where.raw());
      const char* src = static_cast<const char*>(parts[static_cast<size_t>(r)].raw());
      char* dst = static_cast<char*>(out.raw_mutable());
      for (int64_t i = 0; i < where.numel(); ++i)
        std::memcpy(dst + w[i] * static_cast<int64_t>(es), src + i * static_cast<int64_t>(es), es);
    }
    return out;
  }
  // Ranks count with the last mesh axis fastest: fold that axis first (consecutive runs of its
  // size differ only in its coordinate), then the next, down to one tensor.
  std::vector<Tensor> cur = parts;
  for (int a = mesh.num_axes() - 1; a >= 0; --a) {
    int d = spec.dim_of_axis(a);
    int64_t n = mesh.sizes[static_cast<size_t>(a)];
    std::vector<Tensor> next;
    for (size_t base = 0; base < cur.size(); base += static_cast<size_t>(n)) {
      if (d < 0) {
        next.push_back(cur[base]);
      } else {
        std::vector<Tensor> pieces(cur.begin() + static_cast<long>(base), cur.begin() + static_cast<long>(base) + n);
        next.push_back(join_parts(pieces, static_cast<size_t>(d), spec.dims[static_cast<size_t>(d)].segments));
      }
    }
    cur = std::move(next);
  }
  if (cur[0].shape() != global) {
    throw OasesError(fmt::format("assembling shards gave {}, expected {}", shape_str(cur[0].shape()), shape_str(global)));
  }
  return cur[0];
}

}  // namespace oases
