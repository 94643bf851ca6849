#include "graph/mesh.h"

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

Status check_mesh_ranks(const Mesh& mesh, const std::string& what) {
  for (size_t i = 0; i < mesh.sizes.size(); ++i) {
    if (mesh.sizes[i] < 1 || mesh.sizes[i] > kMaxMeshRanks)
      return error("{}[{}]: {} is not a size from 1 to {}", what, i, mesh.sizes[i], kMaxMeshRanks);
  }
  // each factor is at most 2^20: the product is checked before it could overflow
  int64_t n = 1;
  for (size_t i = 0; i < mesh.sizes.size(); ++i) {
    if (!mesh.is_base(static_cast<int>(i))) continue;
    n *= mesh.sizes[i];
    if (n > kMaxMeshRanks) return error("{}: more than {} ranks in all", what, kMaxMeshRanks);
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

}  // namespace oases
