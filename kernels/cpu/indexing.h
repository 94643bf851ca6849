// Index-driven data movement and selection: GatherND, ScatterND, ScatterElements, TopK, the
// backward of Gather, and the position ops Trilu and CumSum.
//   gather_nd:        data [B.., D..], indices [B.., I.., m] (B = batch_dims leading dims shared)
//                     out[b.., i.., rest..] = data[b.., idx[b.., i.., 0..m-1], rest..]
//   scatter_nd:       out = data; out[idx[j.., 0..m-1], rest..] (op)= updates[j.., rest..]
//   scatter_elements: out = data; out at position p of indices with its `axis` coordinate replaced
//                     by idx[p] (op)= updates[p]
//   top_k:            the k largest (or smallest) values along an axis in order, ties to the lower
//                     index, with their int64 positions
//   gather_grad:      dtable = 0; dtable[o, idx[i], :] += dy[o, i, :] in index order
//   trilu:            y = x where j − i >= k (upper) or <= k (lower), else 0
//   cumsum:           y_t = Σ_{s<=t} x_s along an axis (exclusive: s < t; reverse: from the end)
// Updates apply in index order, so with reduction "none" a repeated index keeps the last update.
// Negative indices count from the end. A kernel that meets an index out of range returns its flat
// position in the indices (>= 0) so that the caller can name it, else -1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace oases::kernels {

enum class ScatterReduction { kNone, kAdd, kMul, kMax, kMin };

int64_t gather_nd(const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
                  int64_t batch_dims, void* out, size_t es);

namespace detail {

inline std::vector<int64_t> row_major_strides(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

template <class T>
void combine(T& dst, T v, ScatterReduction r) {
  switch (r) {
    case ScatterReduction::kNone: dst = v; break;
    case ScatterReduction::kAdd: dst = static_cast<T>(dst + v); break;
    case ScatterReduction::kMul: dst = static_cast<T>(dst * v); break;
    case ScatterReduction::kMax: dst = std::max(dst, v); break;
    case ScatterReduction::kMin: dst = std::min(dst, v); break;
  }
}

}  // namespace detail

// data/out [D..]; idx [J.., m]; updates [J.., D(m)..].
template <class T>
int64_t scatter_nd(const T* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
                   const T* updates, ScatterReduction red, T* out) {
  int64_t total = 1;
  for (int64_t d : dshape) total *= d;
  if (out != data) std::memcpy(out, data, static_cast<size_t>(total) * sizeof(T));
  const int64_t m = ishape.back();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < ishape.size(); ++d) rows *= ishape[d];
  int64_t slice = 1;
  for (size_t d = static_cast<size_t>(m); d < dshape.size(); ++d) slice *= dshape[d];
  std::vector<int64_t> st = detail::row_major_strides(dshape);
  for (int64_t j = 0; j < rows; ++j) {
    int64_t off = 0;
    for (int64_t a = 0; a < m; ++a) {
      int64_t v = idx[j * m + a];
      if (v < 0) v += dshape[a];
      if (v < 0 || v >= dshape[a]) return j * m + a;
      off += v * st[a];
    }
    const T* u = updates + j * slice;
    for (int64_t e = 0; e < slice; ++e) detail::combine(out[off + e], u[e], red);
  }
  return -1;
}

// data/out [D..]; idx and updates [I..] of the same rank as data.
template <class T, class I>
int64_t scatter_elements(const T* data, const std::vector<int64_t>& dshape, const I* idx, const std::vector<int64_t>& ishape,
                         const T* updates, int64_t axis, ScatterReduction red, T* out) {
  int64_t total = 1;
  for (int64_t d : dshape) total *= d;
  if (out != data) std::memcpy(out, data, static_cast<size_t>(total) * sizeof(T));
  int64_t n = 1;
  for (int64_t d : ishape) n *= d;
  std::vector<int64_t> st = detail::row_major_strides(dshape);
  const int64_t r = static_cast<int64_t>(ishape.size());
  for (int64_t p = 0; p < n; ++p) {
    int64_t rem = p, off = 0;
    for (int64_t d = r - 1; d >= 0; --d) {
      int64_t c = rem % ishape[d];
      rem /= ishape[d];
      if (d == axis) {
        c = static_cast<int64_t>(idx[p]);
        if (c < 0) c += dshape[d];
        if (c < 0 || c >= dshape[d]) return p;
      }
      off += c * st[d];
    }
    detail::combine(out[off], updates[p], red);
  }
  return -1;
}

// x [outer, n, inner] around `axis`; values/indices [outer, k, inner].
template <class T>
void top_k(const T* x, const std::vector<int64_t>& shape, int64_t axis, int64_t k, bool largest, T* values, int64_t* indices) {
  int64_t outer = 1, inner = 1, n = shape[axis];
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      const T* row = x + o * n * inner + j;
      std::iota(order.begin(), order.end(), int64_t{0});
      auto before = [&](int64_t a, int64_t b) {
        T va = row[a * inner], vb = row[b * inner];
        if (va != vb) return largest ? va > vb : va < vb;
        return a < b;
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      for (int64_t i = 0; i < k; ++i) {
        int64_t at = (o * k + i) * inner + j;
        values[at] = row[order[i] * inner];
        indices[at] = order[i];
      }
    }
  }
}

// Trilu: keeps y[m, i, j] = x[m, i, j] where j − i >= k (upper) or j − i <= k (lower), zero
// elsewhere, over `mats` matrices [rows, cols] of es-byte elements.
void trilu(const void* x, void* y, int64_t mats, int64_t rows, int64_t cols, size_t es, bool upper, int64_t k);

// CumSum along the middle dim of [outer, n, inner]: y_t = Σ_{s<=t} x_s (exclusive: s < t),
// reverse: sums run from the end.
template <class T>
void cumsum(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse);

// Backward of Gather on a table [outer, dim, inner] of which this rank holds rows
// [start, start + dim) of `total` (a vocabulary-split table; else start 0, total dim):
//   dtable = 0 ; dtable[o, idx[i] − start, :] += dy[o, i, :] for the indices this rank holds,
// summed in index order (deterministic). Negative indices count from the end of the whole table.
// Returns the position of an index outside [−total, total), else -1.
template <class T>
int64_t gather_grad(const T* dy, const int64_t* idx, int64_t nidx, int64_t outer, int64_t dim, int64_t inner, int64_t start, int64_t total,
                    T* dtable);

}  // namespace oases::kernels
