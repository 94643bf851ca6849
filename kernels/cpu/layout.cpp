#include "kernels/cpu/layout.h"

#include <cstring>

#include "kernels/cpu/parallel.h"

namespace oases::kernels {

std::vector<int64_t> strides_of(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

namespace {

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline void copy_elems(char* dst, const char* src, int64_t n, int64_t src_stride, size_t es) {
  if (src_stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * es);
    return;
  }
  switch (es) {
    case 4:
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint32_t*>(dst)[i] = *reinterpret_cast<const uint32_t*>(src + i * src_stride * 4);
      break;
    case 8:
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint64_t*>(dst)[i] = *reinterpret_cast<const uint64_t*>(src + i * src_stride * 8);
      break;
    case 2:
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(dst)[i] = *reinterpret_cast<const uint16_t*>(src + i * src_stride * 2);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, src + i * src_stride * static_cast<int64_t>(es), es);
  }
}

}  // namespace

void transpose(const void* in, const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, void* out, size_t es) {
  int64_t r = static_cast<int64_t>(shape.size());
  int64_t n = numel_of(shape);
  if (n == 0) return;
  std::vector<int64_t> ist = strides_of(shape);
  // collapse: output dims with their input strides, merging output-adjacent dims that are also
  // adjacent in the input
  std::vector<int64_t> oshape, ostr;
  for (int64_t i = 0; i < r; ++i) {
    int64_t d = shape[perm[i]], s = ist[perm[i]];
    if (d == 1) continue;
    if (!oshape.empty() && ostr.back() == s * d) {
      oshape.back() *= d;
      ostr.back() = s;
    } else {
      oshape.push_back(d);
      ostr.push_back(s);
    }
  }
  if (oshape.empty()) {
    std::memcpy(out, in, es);
    return;
  }
  int64_t nd = static_cast<int64_t>(oshape.size());
  int64_t inner = oshape[nd - 1], inner_st = ostr[nd - 1];
  int64_t rows = n / inner;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  parallel_range(rows, std::max<int64_t>(1, (1 << 15) / inner), [&](int64_t row_begin, int64_t row_end) {
    for (int64_t row = row_begin; row < row_end; ++row) {
      int64_t rem = row, off = 0;
      for (int64_t d = nd - 2; d >= 0; --d) {
        off += (rem % oshape[d]) * ostr[d];
        rem /= oshape[d];
      }
      copy_elems(dst + row * inner * static_cast<int64_t>(es), src + off * static_cast<int64_t>(es), inner, inner_st, es);
    }
  });
}

void strided_slice(const void* in, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& steps, void* out, const std::vector<int64_t>& out_shape, size_t es) {
  int64_t n = numel_of(out_shape);
  if (n == 0) return;
  int64_t r = static_cast<int64_t>(in_shape.size());
  std::vector<int64_t> ist = strides_of(in_shape);
  if (r == 0) {
    std::memcpy(out, in, es);
    return;
  }
  int64_t inner = out_shape[r - 1];
  int64_t rows = n / inner;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  int64_t base = 0;
  for (int64_t d = 0; d < r; ++d) base += starts[d] * ist[d];
  parallel_range(rows, std::max<int64_t>(1, (1 << 15) / inner), [&](int64_t row_begin, int64_t row_end) {
    for (int64_t row = row_begin; row < row_end; ++row) {
      int64_t rem = row, off = base;
      for (int64_t d = r - 2; d >= 0; --d) {
        off += (rem % out_shape[d]) * steps[d] * ist[d];
        rem /= out_shape[d];
      }
      copy_elems(dst + row * inner * static_cast<int64_t>(es), src + off * static_cast<int64_t>(es), inner, steps[r - 1], es);
    }
  });
}

void strided_scatter(const void* src_v, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& steps, void* dst_v, const std::vector<int64_t>& dst_shape, size_t es) {
  int64_t n = numel_of(src_shape);
  if (n == 0) return;
  int64_t r = static_cast<int64_t>(dst_shape.size());
  std::vector<int64_t> dst_st = strides_of(dst_shape);
  const char* src = static_cast<const char*>(src_v);
  char* dst = static_cast<char*>(dst_v);
  if (r == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  int64_t inner = src_shape[r - 1];
  int64_t rows = n / inner;
  int64_t base = 0;
  for (int64_t d = 0; d < r; ++d) base += starts[d] * dst_st[d];
  int64_t step = steps[r - 1];
  for (int64_t row = 0; row < rows; ++row) {
    int64_t rem = row, off = base;
    for (int64_t d = r - 2; d >= 0; --d) {
      off += (rem % src_shape[d]) * steps[d] * dst_st[d];
      rem /= src_shape[d];
    }
    const char* s = src + row * inner * static_cast<int64_t>(es);
    if (step == 1) {
      std::memcpy(dst + off * static_cast<int64_t>(es), s, static_cast<size_t>(inner) * es);
    } else {
      for (int64_t i = 0; i < inner; ++i)
        std::memcpy(dst + (off + i * step) * static_cast<int64_t>(es), s + i * static_cast<int64_t>(es), es);
    }
  }
}

void concat(const std::vector<const void*>& ins, const std::vector<std::vector<int64_t>>& shapes, int64_t axis, void* out, size_t es) {
  if (shapes.empty()) return;
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shapes[0][d];
  std::vector<int64_t> chunk(ins.size());
  int64_t out_row = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    int64_t c = 1;
    for (size_t d = static_cast<size_t>(axis); d < shapes[i].size(); ++d) c *= shapes[i][d];
    chunk[i] = c * static_cast<int64_t>(es);
    out_row += chunk[i];
  }
  char* dst = static_cast<char*>(out);
  parallel_range(outer, std::max<int64_t>(1, (1 << 17) / std::max<int64_t>(1, out_row)), [&](int64_t o_begin, int64_t o_end) {
    for (int64_t o = o_begin; o < o_end; ++o) {
      int64_t pos = o * out_row;
      for (size_t i = 0; i < ins.size(); ++i) {
        if (chunk[i]) std::memcpy(dst + pos, static_cast<const char*>(ins[i]) + o * chunk[i], static_cast<size_t>(chunk[i]));
        pos += chunk[i];
      }
    }
  });
}

template <class I>
static int64_t gather_impl(const void* data, const std::vector<int64_t>& dshape, const I* idx, int64_t nidx, int64_t axis, void* out,
                           size_t es) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dshape[d];
  for (size_t d = static_cast<size_t>(axis) + 1; d < dshape.size(); ++d) inner *= dshape[d];
  int64_t dim = dshape[axis];
  for (int64_t i = 0; i < nidx; ++i) {
    int64_t v = static_cast<int64_t>(idx[i]);
    if (v < -dim || v >= dim) return i;
  }
  size_t row = static_cast<size_t>(inner) * es;
  const char* src = static_cast<const char*>(data);
  char* dst = static_cast<char*>(out);
  parallel_range(outer * nidx, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, inner)), [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      int64_t o = t / nidx, i = t % nidx;
      int64_t v = static_cast<int64_t>(idx[i]);
      if (v < 0) v += dim;
      std::memcpy(dst + static_cast<size_t>(t) * row, src + static_cast<size_t>(o * dim + v) * row, row);
    }
  });
  return -1;
}

int64_t gather(const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, int64_t nidx, int64_t axis, void* out, size_t es) {
  return gather_impl(data, dshape, idx, nidx, axis, out, es);
}

int64_t gather_i32(const void* data, const std::vector<int64_t>& dshape, const int32_t* idx, int64_t nidx, int64_t axis, void* out,
                   size_t es) {
  return gather_impl(data, dshape, idx, nidx, axis, out, es);
}

void pad(const void* in, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& pads, int mode, const void* value, void* out,
         size_t es) {
  int64_t r = static_cast<int64_t>(in_shape.size());
  std::vector<int64_t> out_shape(in_shape.size());
  for (int64_t d = 0; d < r; ++d) out_shape[d] = in_shape[d] + pads[d] + pads[d + r];
  int64_t n = numel_of(out_shape);
  std::vector<int64_t> ist = strides_of(in_shape);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    bool outside = false;
    for (int64_t d = r - 1; d >= 0; --d) {
      int64_t o = rem % out_shape[d];
      rem /= out_shape[d];
      int64_t x = o - pads[d];
      int64_t dim = in_shape[d];
      if (x < 0 || x >= dim) {
        if (mode == 0 || dim == 0) {
          outside = true;
          break;
        }
        if (mode == 1) {  // reflect (no edge repeat)
          int64_t period = 2 * (dim - 1);
          if (period == 0) {
            x = 0;
          } else {
            x = ((x % period) + period) % period;
            if (x >= dim) x = period - x;
          }
        } else if (mode == 2) {
          x = x < 0 ? 0 : dim - 1;
        } else {
          x = ((x % dim) + dim) % dim;
        }
      }
      off += x * ist[d];
    }
    std::memcpy(dst + i * static_cast<int64_t>(es), outside ? static_cast<const char*>(value) : src + off * static_cast<int64_t>(es), es);
  }
}

void tile(const void* in, const std::vector<int64_t>& in_shape, void* out, const std::vector<int64_t>& out_shape, size_t es) {
  int64_t n = numel_of(out_shape);
  int64_t r = static_cast<int64_t>(in_shape.size());
  std::vector<int64_t> ist = strides_of(in_shape);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  parallel_range(n, 1 << 16, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      int64_t rem = i, off = 0;
      for (int64_t d = r - 1; d >= 0; --d) {
        off += ((rem % out_shape[d]) % in_shape[d]) * ist[d];
        rem /= out_shape[d];
      }
      std::memcpy(dst + i * static_cast<int64_t>(es), src + off * static_cast<int64_t>(es), es);
    }
  });
}

void to_rank_major(const void* in, void* out, int64_t outer, int64_t segs, int64_t n, size_t block_bytes) {
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t g = 0; g < segs; ++g) {
      for (int64_t r = 0; r < n; ++r) {
        std::memcpy(dst + ((r * outer + o) * segs + g) * static_cast<int64_t>(block_bytes),
                    src + ((o * segs + g) * n + r) * static_cast<int64_t>(block_bytes), block_bytes);
      }
    }
  }
}

void from_rank_major(const void* in, void* out, int64_t outer, int64_t segs, int64_t n, size_t block_bytes) {
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t g = 0; g < segs; ++g) {
      for (int64_t r = 0; r < n; ++r) {
        std::memcpy(dst + ((o * segs + g) * n + r) * static_cast<int64_t>(block_bytes),
                    src + ((r * outer + o) * segs + g) * static_cast<int64_t>(block_bytes), block_bytes);
      }
    }
  }
}

}  // namespace oases::kernels
