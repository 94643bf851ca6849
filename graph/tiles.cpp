#include "graph/tiles.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

namespace oases {

PlacedMesh PlacedMesh::contiguous(Mesh mesh, int64_t first) {
  PlacedMesh p{std::move(mesh), {}};
  for (int64_t i = 0; i < p.mesh.size(); ++i) p.ranks.push_back(first + i);
  return p;
}

int64_t PlacedMesh::mesh_rank(int64_t world_rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), world_rank);
  return it == ranks.end() ? -1 : it - ranks.begin();
}

Status PlacedMesh::validate(int64_t world) const {
  if (Status st = mesh.validate(); !st) return st;
  if (size() != mesh.size()) return error("mesh {} has {} ranks but is placed on {}", mesh.to_string(), mesh.size(), size());
  std::set<int64_t> seen;
  for (int64_t r : ranks) {
    if (r < 0 || r >= world) return error("mesh {} is placed on rank {}, outside the world of {} ranks", mesh.to_string(), r, world);
    if (!seen.insert(r).second) return error("mesh {} is placed on rank {} twice", mesh.to_string(), r);
  }
  return Status::ok();
}

std::string PlacedMesh::to_string() const {
  bool run = !ranks.empty();
  for (size_t i = 1; i < ranks.size(); ++i) run = run && ranks[i] == ranks[i - 1] + 1;
  if (run && ranks.size() > 1) return fmt::format("{} on ranks {}-{}", mesh.to_string(), ranks.front(), ranks.back());
  return fmt::format("{} on ranks {}", mesh.to_string(), fmt::join(ranks, ","));
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

Box Box::intersect(const Box& o) const {
  Box b;
  for (size_t d = 0; d < offset.size() && d < o.offset.size(); ++d) {
    int64_t lo = std::max(offset[d], o.offset[d]);
    int64_t hi = std::min(offset[d] + extent[d], o.offset[d] + o.extent[d]);
    b.offset.push_back(lo);
    b.extent.push_back(std::max<int64_t>(0, hi - lo));
  }
  return b;
}

bool Box::contains(const Box& o) const {
  if (o.offset.size() != offset.size()) return false;
  for (size_t d = 0; d < offset.size(); ++d) {
    if (o.offset[d] < offset[d] || o.offset[d] + o.extent[d] > offset[d] + extent[d]) return false;
  }
  return true;
}

std::string Box::to_string() const {
  std::vector<std::string> parts;
  for (size_t d = 0; d < offset.size(); ++d) parts.push_back(fmt::format("{}:{}", offset[d], offset[d] + extent[d]));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

Expected<TileMap> tile_boxes(const ShardingSpec& spec, const Shape& shape, const Mesh& mesh) {
  if (Status st = mesh.validate(); !st) return st;
  if (spec.rank() != shape.size())
    return error("layout {} has {} dimensions, the value {}", spec.to_string(&mesh), spec.rank(), shape_str(shape));
  uint32_t used = 0;
  for (size_t d = 0; d < spec.rank(); ++d) {
    const DimSpec& ds = spec.dims[d];
    if (shape[d] < 0) return error("value {} has a negative dimension", shape_str(shape));
    if (ds.axis < 0) continue;
    if (ds.axis >= mesh.num_axes())
      return error("layout {} names mesh axis {} of a {}-axis mesh", spec.to_string(&mesh), ds.axis, mesh.num_axes());
    if (used & mesh.base_mask(ds.axis)) return error("layout {} uses mesh axis '{}' twice", spec.to_string(&mesh), mesh.axes[ds.axis]);
    used |= mesh.base_mask(ds.axis);
    if (ds.segments < 1 || shape[d] % ds.segments != 0)
      return error("dimension {} of {} does not divide into {} segments", d, shape_str(shape), ds.segments);
  }
  uint32_t partial_bases = 0;
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (!spec.is_partial(a)) continue;
    if ((partial_bases | used) & mesh.base_mask(a))
      return error("layout {} uses mesh axis '{}' twice", spec.to_string(&mesh), mesh.axes[a]);
    partial_bases |= mesh.base_mask(a);
  }
  if (spec.partial >> mesh.num_axes()) return error("layout {} is partial over an axis off the mesh", spec.to_string(&mesh));

  TileMap t;
  const int64_t n = mesh.size();
  t.boxes.resize(static_cast<size_t>(n));
  t.part_shapes.resize(static_cast<size_t>(n));
  // Ranks agreeing on every base axis that shards a dimension hold the same boxes; among them,
  // those also agreeing on the partial axes hold equal data.
  std::map<std::vector<int64_t>, std::vector<int64_t>> replicas, partials;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> c = mesh.coords(r), shard_key, partial_key;
    for (int b = 0; b < mesh.num_axes(); ++b) {
      if (!mesh.is_base(b)) continue;
      if ((used >> b) & 1u) shard_key.push_back(c[static_cast<size_t>(b)]);
      if ((partial_bases >> b) & 1u) partial_key.push_back(c[static_cast<size_t>(b)]);
    }
    // The cartesian product over dimensions of each dimension's ranges (several per segmented one).
    std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      const DimSpec& ds = spec.dims[d];
      if (ds.axis < 0) {
        ranges[d].push_back({0, shape[d]});
        continue;
      }
      int64_t k = mesh.sizes[static_cast<size_t>(ds.axis)], seg = shape[d] / ds.segments;
      int64_t len = (seg + k - 1) / k, i = c[static_cast<size_t>(ds.axis)];
      for (int s = 0; s < ds.segments; ++s) {
        int64_t lo = std::min(seg, i * len), hi = std::min(seg, (i + 1) * len);
        if (hi > lo) ranges[d].push_back({s * seg + lo, hi - lo});
      }
    }
    Shape& part = t.part_shapes[static_cast<size_t>(r)];
    for (const auto& rd : ranges) {
      int64_t len = 0;
      for (auto [off, l] : rd) len += l;
      part.push_back(len);
    }
    std::vector<Box> boxes(1);
    for (size_t d = 0; d < shape.size(); ++d) {
      std::vector<Box> next;
      for (const Box& b : boxes) {
        for (auto [off, len] : ranges[d]) {
          Box e = b;
          e.offset.push_back(off);
          e.extent.push_back(len);
          next.push_back(std::move(e));
        }
      }
      boxes = std::move(next);
    }
    if (!boxes.empty() && boxes.front().numel() > 0) t.boxes[static_cast<size_t>(r)] = std::move(boxes);
    std::vector<int64_t> both = shard_key;
    both.insert(both.end(), partial_key.begin(), partial_key.end());
    replicas[both].push_back(r);
    if (partial_bases) partials[shard_key].push_back(r);
  }
  for (auto& [k, g] : replicas) t.replica_groups.push_back(g);
  for (auto& [k, g] : partials) t.partial_groups.push_back(g);
  return t;
}

void copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es) {
  size_t nd = region.offset.size();
  if (region.empty()) return;
  if (nd == 0) {
    std::memcpy(to, from, static_cast<size_t>(es));
    return;
  }
  auto strides = [&](const Box& b) {
    std::vector<int64_t> s(nd, es);
    for (size_t d = nd - 1; d > 0; --d) s[d - 1] = s[d] * b.extent[d];
    return s;
  };
  std::vector<int64_t> fs = strides(from_box), ts = strides(to_box);
  // dimensions `inner` … nd - 1 are one contiguous run in both boxes: inside the innermost one,
  // the region spans the others whole
  size_t inner = nd - 1;
  int64_t row = region.extent[nd - 1] * es;
  while (inner > 0 && region.extent[inner] == from_box.extent[inner] && region.extent[inner] == to_box.extent[inner]) {
    --inner;
    row *= region.extent[inner];
  }
  std::vector<int64_t> i(nd, 0);
  while (true) {
    int64_t fo = 0, to_off = 0;
    for (size_t d = 0; d < nd; ++d) {
      fo += (region.offset[d] + i[d] - from_box.offset[d]) * fs[d];
      to_off += (region.offset[d] + i[d] - to_box.offset[d]) * ts[d];
    }
    std::memcpy(to + to_off, from + fo, static_cast<size_t>(row));
    size_t d = inner;
    while (d > 0 && ++i[d - 1] == region.extent[d - 1]) i[--d] = 0;
    if (d == 0) break;
  }
}

Expected<PlacedLayout> placed_layout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& ranks, const std::string& layout,
                                     size_t tensor_rank) {
  PlacedLayout pl;
  if (sizes.empty() || sizes.size() > 8) return error("a mesh of {} axes (1 … 8)", sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    pl.placed.mesh.axes.push_back(fmt::format("m{}", i));
    pl.placed.mesh.sizes.push_back(sizes[i]);
  }
  OASES_RETURN_IF_ERROR(check_mesh_ranks(pl.placed.mesh, fmt::format("mesh [{}]", fmt::join(sizes, ", "))));
  if (Status st = pl.placed.mesh.validate(); !st) return st;
  auto spec = parse_layout(layout, tensor_rank, &pl.placed.mesh);
  if (!spec) return spec.status();
  pl.spec = *spec;
  pl.placed.ranks = ranks;
  return pl;
}

Expected<Mesh> parse_mesh_shape(const std::string& text) {
  Mesh m;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t x = text.find('x', pos);
    std::string part = text.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos)
      return error("mesh '{}': write its shape as sizes joined by 'x', e.g. 2x4", text);
    // more than 7 digits is past 2^20 (and could overflow stoll)
    int64_t size = part.size() > 7 ? kMaxMeshRanks + 1 : std::stoll(part);
    if (size < 1 || size > kMaxMeshRanks) return error("mesh '{}': axis size {} is outside 1 … {}", text, part, kMaxMeshRanks);
    m.axes.push_back(fmt::format("m{}", m.axes.size()));
    m.sizes.push_back(size);
    if (m.axes.size() > 8) return error("mesh '{}' has more than 8 axes", text);
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  OASES_RETURN_IF_ERROR(check_mesh_ranks(m, fmt::format("mesh '{}'", text)));
  return m;
}

namespace {

// The axis of `mesh` spanning exactly these base axes (major first), added when absent.
Expected<int> axis_over(const std::vector<int>& bases, Mesh* mesh, const std::string& text) {
  for (int b : bases) {
    if (b < 0 || b >= mesh->num_axes() || !mesh->is_base(b))
      return error("layout '{}' names mesh axis {} of a mesh with {} axes", text, b, mesh->num_axes());
  }
  if (bases.size() == 1) return bases[0];
  for (int a = 0; a < mesh->num_axes(); ++a) {
    if (!mesh->is_base(a) && mesh->parts[static_cast<size_t>(a)] == bases) return a;
  }
  std::string name = "m";
  for (int b : bases) name += std::to_string(b);
  int a = mesh->add_compound(name, bases);
  if (Status st = mesh->validate(); !st) return st.with_context(fmt::format("layout '{}'", text));
  return a;
}

Expected<std::vector<int>> digits(const std::string& s, size_t& i, const std::string& text) {
  std::vector<int> out;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') out.push_back(s[i++] - '0');
  if (out.empty()) return error("layout '{}': S and P take mesh axes, e.g. S0, S01", text);
  return out;
}

}  // namespace

Expected<ShardingSpec> parse_layout(const std::string& text, size_t rank, Mesh* mesh) {
  if (size_t first = text.find_first_not_of(' '); first != std::string::npos && text[first] == '[') {
    // the notation of ShardingSpec::to_string over axes m0, m1, ... and compound axes m01, ...
    auto spec = parse_spec(text, *mesh, [&](const std::string& name) -> int {
      if (name.size() < 2 || name[0] != 'm' || name.find_first_not_of("0123456789", 1) != std::string::npos) return -1;
      size_t i = 1;
      auto bases = digits(name, i, text);
      if (!bases) return -1;
      auto a = axis_over(*bases, mesh, text);
      return a ? *a : -1;
    });
    if (!spec) return spec.status();
    if (spec->rank() != rank) return error("layout '{}' has {} dimensions, the tensor {}", text, spec->rank(), rank);
    return spec;
  }
  std::string dims_text = text, partial_text;
  if (size_t colon = text.find(':'); colon != std::string::npos) {
    dims_text = text.substr(0, colon);
    partial_text = text.substr(colon + 1);
  }
  ShardingSpec spec;
  size_t i = 0;
  while (i < dims_text.size()) {
    char c = dims_text[i++];
    if (c == 'R') {
      spec.dims.push_back(DimSpec{});
    } else if (c == 'S') {
      auto ds = digits(dims_text, i, text);
      if (!ds) return ds.status();
      auto a = axis_over(*ds, mesh, text);
      if (!a) return a.status();
      spec.dims.push_back(DimSpec{*a, 1});
    } else {
      return error("layout '{}': '{}' is not R, S<axes> or :P<axes>", text, c);
    }
  }
  if (!partial_text.empty()) {
    if (partial_text[0] != 'P') return error("layout '{}': after ':' write P and the partial axes, e.g. :P1", text);
    size_t j = 1;
    auto ds = digits(partial_text, j, text);
    if (!ds) return ds.status();
    if (j != partial_text.size()) return error("layout '{}': unexpected '{}'", text, partial_text.substr(j));
    for (int b : *ds) {
      auto a = axis_over({b}, mesh, text);
      if (!a) return a.status();
      spec = spec.with_partial(*a);
    }
  }
  if (spec.rank() != rank) return error("layout '{}' has {} dimensions, the tensor {}", text, spec.rank(), rank);
  return spec;
}

std::string layout_string(const ShardingSpec& spec, const Mesh& mesh) {
  Mesh named = mesh;
  for (int a = 0; a < named.num_axes(); ++a) {
    std::string& name = named.axes[static_cast<size_t>(a)];
    if (named.is_base(a)) {
      name = fmt::format("m{}", a);
    } else {
      name = "m";
      for (int b : named.parts[static_cast<size_t>(a)]) name += std::to_string(b);
    }
  }
  return spec.to_string(&named);
}

}  // namespace oases
