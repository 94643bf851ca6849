#include "graph/slicing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace oases {

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
