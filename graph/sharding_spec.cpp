#include "graph/sharding_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstring>

namespace oases {

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

Expected<ShardingSpec> parse_spec(const std::string& text, const Mesh& mesh, const AxisLookup& lookup) {
  auto axis_of = [&](const std::string& name) { return lookup ? lookup(name) : mesh.axis(name); };
  ShardingSpec s;
  size_t open = text.find('['), close = text.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return error("spec '{}' must look like [R, S(tp)]", text);
  std::string body = text.substr(open + 1, close - open - 1);
  auto trim = [](std::string x) {
    while (!x.empty() && std::isspace(static_cast<unsigned char>(x.front()))) x.erase(x.begin());
    while (!x.empty() && std::isspace(static_cast<unsigned char>(x.back()))) x.pop_back();
    return x;
  };
  size_t pos = 0;
  while (pos <= body.size() && !trim(body).empty()) {
    size_t comma = body.find(',', pos);
    std::string tok = trim(body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (tok == "R") {
      s.dims.push_back(DimSpec{});
    } else if (tok.rfind("S(", 0) == 0) {
      size_t rp = tok.find(')');
      if (rp == std::string::npos) return error("spec '{}': '{}' is not S(axis)", text, tok);
      std::string ax = tok.substr(2, rp - 2);
      int a = axis_of(ax);
      if (a < 0) return error("spec '{}': mesh axis '{}' does not exist (the mesh is {})", text, ax, mesh.to_string());
      int segs = 1;
      if (rp + 1 < tok.size()) {
        if (tok[rp + 1] != '/') return error("spec '{}': '{}' is not S(axis) or S(axis)/segments", text, tok);
        const std::string digits = tok.substr(rp + 2);
        if (digits.empty() || digits.size() > 7 || digits.find_first_not_of("0123456789") != std::string::npos)
          return error("spec '{}': bad segment count in '{}'", text, tok);
        segs = std::stoi(digits);
        if (segs < 1 || segs > kMaxSegments) return error("spec '{}': {} segments in '{}' (1 to {})", text, segs, tok, kMaxSegments);
      }
      s.dims.push_back(DimSpec{a, segs});
    } else {
      return error("spec '{}': '{}' is neither R nor S(axis)", text, tok);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (open != 0 && !trim(text.substr(0, open)).empty()) return error("spec '{}': '{}' before the brackets", text, text.substr(0, open));
  // after the brackets: the partial sums, " P(dp) P(tp)"
  std::string rest = text.substr(close + 1);
  size_t p = 0;
  while (p < rest.size()) {
    if (std::isspace(static_cast<unsigned char>(rest[p]))) {
      ++p;
      continue;
    }
    if (rest.compare(p, 2, "P(") != 0) return error("spec '{}': '{}' is not P(axis)", text, trim(rest.substr(p)));
    size_t rp = rest.find(')', p);
    if (rp == std::string::npos) return error("spec '{}': unclosed P(", text);
    int a = axis_of(rest.substr(p + 2, rp - p - 2));
    if (a < 0 || a >= 32) return error("spec '{}': unknown mesh axis in {}", text, rest.substr(p, rp - p + 1));
    s.partial |= 1u << a;
    p = rp + 1;
  }
  return s;
}

}  // namespace oases
