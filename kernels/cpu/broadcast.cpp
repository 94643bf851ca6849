#include "kernels/cpu/broadcast.h"

namespace oases::kernels {

void walk_rows(const Broadcast& b, RowFn f) {
  int nd = static_cast<int>(b.shape.size());
  int64_t inner = b.shape[nd - 1];
  if (inner == 0 || b.numel == 0) return;
  int64_t rows = b.numel / inner;
  // long rows are cut into pieces so that flat loops also spread over threads
  int64_t piece = rows >= 16 ? inner : std::min<int64_t>(inner, 1 << 14);
  int64_t pieces = (inner + piece - 1) / piece;
  RowOffsets inner_st{};
  for (int k = 0; k < b.nin; ++k) inner_st[k] = b.strides[k][nd - 1];
  parallel_range(rows * pieces, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, piece)), [&](int64_t task_begin, int64_t task_end) {
    for (int64_t task = task_begin; task < task_end; ++task) {
      int64_t row = task / pieces, p = task % pieces;
      RowOffsets off{};
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
