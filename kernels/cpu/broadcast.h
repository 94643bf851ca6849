// Numpy broadcasting over up to 3 operands, as nested loops over collapsed dimensions.
//   make_broadcast(out_shape, {a_shape, b_shape, ...}) → per-dim strides (0 where broadcast),
//   adjacent dims merged when every operand is contiguous across them, so the common cases
//   (same shape, scalar, bias over the last dim) run as one or two flat loops.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace oases::kernels {

constexpr int kMaxOperands = 3;

struct Broadcast {
  int nin = 0;
  std::vector<int64_t> shape;                              // collapsed output shape
  std::array<std::vector<int64_t>, kMaxOperands> strides;  // per operand, elements
  int64_t numel = 1;
};

inline Broadcast make_broadcast(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& ins) {
  Broadcast b;
  b.nin = static_cast<int>(ins.size());
  size_t r = out.size();
  std::vector<std::vector<int64_t>> st(ins.size(), std::vector<int64_t>(r, 0));
  for (size_t k = 0; k < ins.size(); ++k) {
    const auto& s = ins[k];
    int64_t acc = 1;
    for (size_t i = 0; i < s.size(); ++i) {
      size_t oi = r - 1 - i;
      size_t si = s.size() - 1 - i;
      st[k][oi] = s[si] == 1 && out[oi] != 1 ? 0 : acc;
      acc *= s[si];
    }
  }
  // drop size-1 dims, then merge dims i-1 and i when every operand has stride[i-1] == stride[i]*shape[i]
  std::vector<int64_t> shp;
  std::vector<std::vector<int64_t>> nst(ins.size());
  for (size_t i = 0; i < r; ++i) {
    if (out[i] == 1) continue;
    bool merge = !shp.empty();
    for (size_t k = 0; k < ins.size() && merge; ++k) {
      if (nst[k].back() != st[k][i] * out[i]) merge = false;
    }
    if (merge) {
      shp.back() *= out[i];
      for (size_t k = 0; k < ins.size(); ++k) nst[k].back() = st[k][i];
    } else {
      shp.push_back(out[i]);
      for (size_t k = 0; k < ins.size(); ++k) nst[k].push_back(st[k][i]);
    }
  }
  if (shp.empty()) {
    shp.push_back(1);
    for (auto& v : nst) v.push_back(0);
  }
  b.shape = shp;
  for (size_t k = 0; k < ins.size(); ++k) b.strides[k] = nst[k];
  for (int64_t d : shp) b.numel *= d;
  return b;
}

// Calls f(out_offset, {in offsets}, inner_len, {inner strides}) for every run of the innermost
// dimension, in output order; `rows` of the outer index space are split over OpenMP threads when
// the work is large.
template <class F>
void for_each_row(const Broadcast& b, F&& f) {
  int nd = static_cast<int>(b.shape.size());
  int64_t inner = b.shape[nd - 1];
  if (inner == 0 || b.numel == 0) return;
  int64_t rows = b.numel / inner;
  // long rows are cut into pieces so that flat loops also spread over threads
  int64_t piece = rows >= 16 ? inner : std::min<int64_t>(inner, 1 << 14);
  int64_t pieces = (inner + piece - 1) / piece;
  std::array<int64_t, kMaxOperands> inner_st{};
  for (int k = 0; k < b.nin; ++k) inner_st[k] = b.strides[k][nd - 1];
  parallel_range(rows * pieces, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, piece)), [&](int64_t task_begin, int64_t task_end) {
    for (int64_t task = task_begin; task < task_end; ++task) {
      int64_t row = task / pieces, p = task % pieces;
      std::array<int64_t, kMaxOperands> off{};
      int64_t rem = row;
      for (int d = nd - 2; d >= 0; --d) {
        int64_t idx = rem % b.shape[d];
        rem /= b.shape[d];
        for (int k = 0; k < b.nin; ++k) off[k] += idx * b.strides[k][d];
      }
      int64_t start = p * piece;
      for (int k = 0; k < b.nin; ++k) off[k] += start * inner_st[k];
      f(row * inner + start, off, std::min(piece, inner - start), inner_st);
    }
  });
}

}  // namespace oases::kernels
