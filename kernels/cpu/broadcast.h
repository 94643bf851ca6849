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

using RowOffsets = std::array<int64_t, kMaxOperands>;
using RowFn = FunctionRef<void(int64_t, const RowOffsets&, int64_t, const RowOffsets&)>;

// Calls f(out_offset, {in offsets}, inner_len, {inner strides}) for every run of the innermost
// dimension, in output order; `rows` of the outer index space are split over the pool's threads
// when the work is large. The walk is compiled once (broadcast.cpp); only f, the kernel's loop over
// one run, is compiled per op and element type, and is called once a run.
void walk_rows(const Broadcast& b, RowFn f);

template <class F>
void for_each_row(const Broadcast& b, F&& f) {
  walk_rows(b, RowFn(f));
}

}  // namespace oases::kernels
