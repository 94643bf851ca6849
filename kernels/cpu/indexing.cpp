#include "kernels/cpu/indexing.h"

namespace oases::kernels {

int64_t gather_nd(const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
                  int64_t batch_dims, void* out, size_t es) {
  const int64_t m = ishape.back();
  int64_t batches = 1, rows_per_batch = 1;
  for (int64_t d = 0; d < batch_dims; ++d) batches *= dshape[d];
  for (size_t d = static_cast<size_t>(batch_dims); d + 1 < ishape.size(); ++d) rows_per_batch *= ishape[d];
  int64_t slice = 1, batch_size = 1;
  for (size_t d = static_cast<size_t>(batch_dims + m); d < dshape.size(); ++d) slice *= dshape[d];
  for (size_t d = static_cast<size_t>(batch_dims); d < dshape.size(); ++d) batch_size *= dshape[d];
  std::vector<int64_t> st = detail::row_major_strides(dshape);
  const char* src = static_cast<const char*>(data);
  char* dst = static_cast<char*>(out);
  const size_t row_bytes = static_cast<size_t>(slice) * es;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t i = 0; i < rows_per_batch; ++i) {
      const int64_t row = b * rows_per_batch + i;
      int64_t off = b * batch_size;
      for (int64_t a = 0; a < m; ++a) {
        int64_t dim = dshape[batch_dims + a];
        int64_t v = idx[row * m + a];
        if (v < 0) v += dim;
        if (v < 0 || v >= dim) return row * m + a;
        off += v * st[batch_dims + a];
      }
      std::memcpy(dst + static_cast<size_t>(row) * row_bytes, src + static_cast<size_t>(off) * es, row_bytes);
    }
  }
  return -1;
}

}  // namespace oases::kernels
