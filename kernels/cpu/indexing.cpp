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

void trilu(const void* x, void* y, int64_t mats, int64_t rows, int64_t cols, size_t es, bool upper, int64_t k) {
  const char* src = static_cast<const char*>(x);
  char* dst = static_cast<char*>(y);
  for (int64_t m = 0; m < mats; ++m) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        bool keep = upper ? (j - i >= k) : (j - i <= k);
        int64_t off = ((m * rows + i) * cols + j) * static_cast<int64_t>(es);
        if (keep) {
          std::memcpy(dst + off, src + off, es);
        } else {
          std::memset(dst + off, 0, es);
        }
      }
    }
  }
}

template <class T>
void cumsum(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      T acc = 0;
      for (int64_t t = 0; t < n; ++t) {
        int64_t i = reverse ? n - 1 - t : t;
        int64_t idx = (o * n + i) * inner + j;
        if (exclusive) {
          y[idx] = acc;
          acc += x[idx];
        } else {
          acc += x[idx];
          y[idx] = acc;
        }
      }
    }
  }
}

template <class T>
int64_t gather_grad(const T* dy, const int64_t* idx, int64_t nidx, int64_t outer, int64_t dim, int64_t inner, int64_t start, int64_t total,
                    T* dtable) {
  std::fill(dtable, dtable + outer * dim * inner, T(0));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < nidx; ++i) {
      int64_t v = idx[i];
      if (v < 0) v += total;
      if (v < 0 || v >= total) return i;
      v -= start;
      if (v < 0 || v >= dim) continue;
      T* dst = dtable + (o * dim + v) * inner;
      const T* src = dy + (o * nidx + i) * inner;
      for (int64_t e = 0; e < inner; ++e) dst[e] += src[e];
    }
  }
  return -1;
}

template void cumsum<float>(const float*, float*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<double>(const double*, double*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<int64_t>(const int64_t*, int64_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<int32_t>(const int32_t*, int32_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<int16_t>(const int16_t*, int16_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<int8_t>(const int8_t*, int8_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<uint8_t>(const uint8_t*, uint8_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<uint32_t>(const uint32_t*, uint32_t*, int64_t, int64_t, int64_t, bool, bool);
template void cumsum<uint64_t>(const uint64_t*, uint64_t*, int64_t, int64_t, int64_t, bool, bool);
template int64_t gather_grad<float>(const float*, const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
template int64_t gather_grad<double>(const double*, const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double*);

}  // namespace oases::kernels
