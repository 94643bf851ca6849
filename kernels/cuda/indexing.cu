// GatherND, ScatterND and CumSum (indexing.h). One thread per output element for GatherND, per
// (tuple, slice element) for ScatterND without a reduction, per slice element for ScatterND with
// one (walking the tuples in order), per line for CumSum (sequential along the line, as on the CPU).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexing.h"

namespace oases::cuda {

namespace {

constexpr int kMaxIndexDims = 8;

// Index tuples of length m into dims [dims[0], .., dims[m-1]] with row-major strides `stride`.
struct Tuples {
  int m = 0;
  int64_t dims[kMaxIndexDims] = {};
  int64_t stride[kMaxIndexDims] = {};
};

// Offset of tuple t (its m indices at idx + t·m); -1 and the position of the bad index when one is
// outside its dim.
__device__ __forceinline__ int64_t tuple_offset(const Tuples& tp, const int64_t* idx, int64_t t, int64_t* bad) {
  int64_t off = 0;
  for (int k = 0; k < tp.m; ++k) {
    int64_t v = idx[t * tp.m + k];
    if (v < 0) v += tp.dims[k];
    if (v < 0 || v >= tp.dims[k]) {
      *bad = t * tp.m + k;
      return -1;
    }
    off += v * tp.stride[k];
  }
  return off;
}

__device__ __forceinline__ void report(const Fault& f, int64_t pos) {
  if (f.slot) atomicMin(f.slot, f.base + static_cast<unsigned long long>(pos));
}

template <class B>
__global__ void gather_nd_kernel(const B* data, const int64_t* idx, B* out, Tuples tp, int64_t slice, int64_t per_batch,
                                 int64_t batch_stride, int64_t n, Fault f) {
  OASES_GRID_STRIDE(o, n) {
    int64_t t = o / slice, inner = o % slice, bad = -1;
    int64_t off = tuple_offset(tp, idx, t, &bad);
    if (off < 0) {
      if (inner == 0) report(f, bad);
      continue;
    }
    out[o] = data[(t / per_batch) * batch_stride + off + inner];
  }
}

template <class B>
__global__ void scatter_nd_none_kernel(const int64_t* idx, const B* upd, B* out, Tuples tp, int64_t slice, int64_t n, Fault f) {
  OASES_GRID_STRIDE(o, n) {
    int64_t t = o / slice, inner = o % slice, bad = -1;
    int64_t off = tuple_offset(tp, idx, t, &bad);
    if (off < 0) {
      if (inner == 0) report(f, bad);
      continue;
    }
    out[off + inner] = upd[o];
  }
}

template <class T>
__device__ __forceinline__ typename Acc<T>::type reduce_op(int r, typename Acc<T>::type a, typename Acc<T>::type b) {
  switch (r) {
    case 1: return a + b;
    case 2: return a * b;
    case 3: return a > b ? a : b;
    default: return a < b ? a : b;
  }
}

// One thread per element of the data's slice space [D[m..]]: walks every tuple in order.
template <class T>
__global__ void scatter_nd_reduce_kernel(const int64_t* idx, const T* upd, T* out, Tuples tp, int64_t slice, int64_t tuples, int reduction,
                                         Fault f) {
  OASES_GRID_STRIDE(inner, slice) {
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t bad = -1;
      int64_t off = tuple_offset(tp, idx, t, &bad);
      if (off < 0) {
        if (inner == 0) report(f, bad);
        continue;
      }
      store(out, off + inner, reduce_op<T>(reduction, load(out, off + inner), load(upd, t * slice + inner)));
    }
  }
}

// Coordinates of the indices' element `i` (shape `is`, rank r) mapped into the data (strides ds)
// with the axis coordinate taken from the index: the data offset, or -1 for a bad index.
struct ElemMaps {
  int rank = 0, axis = 0;
  int64_t ishape[kMaxIndexDims] = {};
  int64_t dstride[kMaxIndexDims] = {};
  int64_t axis_dim = 0;
};

template <class I>
__device__ __forceinline__ int64_t element_offset(const ElemMaps& m, const I* idx, int64_t i) {
  int64_t rem = i, off = 0;
  for (int d = m.rank - 1; d >= 0; --d) {
    int64_t c = rem % m.ishape[d];
    rem /= m.ishape[d];
    if (d == m.axis) {
      int64_t v = static_cast<int64_t>(idx[i]);
      if (v < 0) v += m.axis_dim;
      if (v < 0 || v >= m.axis_dim) return -1;
      c = v;
    }
    off += c * m.dstride[d];
  }
  return off;
}

// GatherElements (kScatter false: out[i] = in[off]) and ScatterElements without a reduction
// (kScatter true: out[off] = in[i]), i over the indices.
template <bool kScatter, class B, class I>
__global__ void elements_kernel(const B* in, const I* idx, B* out, ElemMaps m, int64_t n, Fault f) {
  OASES_GRID_STRIDE(i, n) {
    int64_t off = element_offset(m, idx, i);
    if (off < 0) {
      report(f, i);
      continue;
    }
    if constexpr (kScatter) {
      out[off] = in[i];
    } else {
      out[i] = in[off];
    }
  }
}

// One thread per line of the indices along the axis (lines = n / ishape[axis]): its updates in order.
template <class T, class I>
__global__ void scatter_elements_reduce_kernel(const I* idx, const T* upd, T* out, ElemMaps m, int64_t lines, int64_t inner, int reduction,
                                               Fault f) {
  OASES_GRID_STRIDE(line, lines) {
    int64_t len = m.ishape[m.axis], first = (line / inner) * len * inner + line % inner;
    for (int64_t k = 0; k < len; ++k) {
      int64_t i = first + k * inner;
      int64_t off = element_offset(m, idx, i);
      if (off < 0) {
        report(f, i);
        continue;
      }
      store(out, off, reduce_op<T>(reduction, load(out, off), load(upd, i)));
    }
  }
}

template <class T>
__global__ void cumsum_kernel(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse) {
  OASES_GRID_STRIDE(line, outer * inner) {
    int64_t base = (line / inner) * n * inner + line % inner;
    typename Acc<T>::type acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      int64_t k = reverse ? n - 1 - s : s;
      int64_t at = base + k * inner;
      typename Acc<T>::type v = load(x, at);
      if (exclusive) {
        store(y, at, acc);
        acc += v;
      } else {
        acc += v;
        store(y, at, acc);
      }
    }
  }
}

unsigned grid(int64_t n) {
  return grid_for(n, kThreads);
}

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t d = from; d < to && d < s.size(); ++d) p *= s[d];
  return p;
}

Tuples tuples_for(const std::vector<int64_t>& dshape, size_t first, int64_t m) {
  if (m < 1 || m > kMaxIndexDims || first + static_cast<size_t>(m) > dshape.size()) {
    throw std::runtime_error("[cuda indexing] index tuples of length " + std::to_string(m) + " do not fit the data's rank " +
                             std::to_string(dshape.size()));
  }
  Tuples tp;
  tp.m = static_cast<int>(m);
  for (int k = 0; k < tp.m; ++k) {
    tp.dims[k] = dshape[first + static_cast<size_t>(k)];
    tp.stride[k] = product(dshape, first + static_cast<size_t>(k) + 1, dshape.size());
  }
  return tp;
}

}  // namespace

void gather_nd(size_t es, const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
               int64_t batch_dims, void* out, Fault f, cudaStream_t s) {
  if (ishape.empty()) throw std::runtime_error("[cuda GatherND] indices must have rank >= 1");
  size_t b = static_cast<size_t>(batch_dims);
  int64_t m = ishape.back();
  Tuples tp = tuples_for(dshape, b, m);
  int64_t slice = product(dshape, b + static_cast<size_t>(m), dshape.size());
  int64_t per_batch = product(ishape, b, ishape.size() - 1);  // tuples per batch entry
  int64_t batch_stride = product(dshape, b, dshape.size());
  int64_t n = product(ishape, 0, ishape.size() - 1) * slice;
  if (n <= 0) return;
  dispatch_bits(es, [&](auto tag) {
    using B = typename decltype(tag)::type;
    gather_nd_kernel<B><<<grid(n), kThreads, 0, s>>>(static_cast<const B*>(data), idx, static_cast<B*>(out), tp, slice,
                                                     std::max<int64_t>(1, per_batch), batch_stride, n, f);
  });
  OASES_CUDA_CHECK_LAUNCH("gather_nd_kernel");
}

void scatter_nd(Elem t, const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
                const void* updates, int reduction, void* out, Fault f, cudaStream_t s) {
  if (ishape.empty()) throw std::runtime_error("[cuda ScatterND] indices must have rank >= 1");
  size_t es = elem_size(t);
  int64_t total = product(dshape, 0, dshape.size());
  if (out != data && total > 0) OASES_CUDA_CHECK(cudaMemcpyAsync(out, data, static_cast<size_t>(total) * es, cudaMemcpyDeviceToDevice, s));
  int64_t m = ishape.back();
  Tuples tp = tuples_for(dshape, 0, m);
  int64_t slice = product(dshape, static_cast<size_t>(m), dshape.size());
  int64_t tuples = product(ishape, 0, ishape.size() - 1);
  if (tuples <= 0 || slice <= 0) return;
  if (reduction == 0) {
    dispatch_bits(es, [&](auto tag) {
      using B = typename decltype(tag)::type;
      scatter_nd_none_kernel<B><<<grid(tuples * slice), kThreads, 0, s>>>(idx, static_cast<const B*>(updates), static_cast<B*>(out), tp,
                                                                          slice, tuples * slice, f);
    });
    OASES_CUDA_CHECK_LAUNCH("scatter_nd_none_kernel");
    return;
  }
  dispatch_numeric("ScatterND", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_nd_reduce_kernel<T><<<grid(slice), kThreads, 0, s>>>(idx, static_cast<const T*>(updates), static_cast<T*>(out), tp, slice,
                                                                 tuples, reduction, f);
  });
  OASES_CUDA_CHECK_LAUNCH("scatter_nd_reduce_kernel");
}

namespace {

ElemMaps elem_maps(const std::vector<int64_t>& dshape, const std::vector<int64_t>& ishape, int64_t axis) {
  if (ishape.size() != dshape.size() || dshape.size() > static_cast<size_t>(kMaxIndexDims) || axis < 0 ||
      axis >= static_cast<int64_t>(dshape.size())) {
    throw std::runtime_error("[cuda GatherElements/ScatterElements] indices of rank " + std::to_string(ishape.size()) + " for data of rank " +
                             std::to_string(dshape.size()) + ", axis " + std::to_string(axis));
  }
  ElemMaps m;
  m.rank = static_cast<int>(dshape.size());
  m.axis = static_cast<int>(axis);
  m.axis_dim = dshape[static_cast<size_t>(axis)];
  for (int d = 0; d < m.rank; ++d) {
    m.ishape[d] = ishape[static_cast<size_t>(d)];
    m.dstride[d] = product(dshape, static_cast<size_t>(d) + 1, dshape.size());
  }
  return m;
}

template <class F>
void by_index_type(bool idx64, F&& f) {
  if (idx64) {
    f(Tag<int64_t>{});
  } else {
    f(Tag<int32_t>{});
  }
}

}  // namespace

void gather_elements(size_t es, const void* data, const std::vector<int64_t>& dshape, const void* idx, bool idx64,
                     const std::vector<int64_t>& ishape, int64_t axis, void* out, Fault f, cudaStream_t s) {
  ElemMaps m = elem_maps(dshape, ishape, axis);
  int64_t n = product(ishape, 0, ishape.size());
  if (n <= 0) return;
  dispatch_bits(es, [&](auto tb) {
    using B = typename decltype(tb)::type;
    by_index_type(idx64, [&](auto ti) {
      using I = typename decltype(ti)::type;
      elements_kernel<false, B, I><<<grid(n), kThreads, 0, s>>>(static_cast<const B*>(data), static_cast<const I*>(idx),
                                                                 static_cast<B*>(out), m, n, f);
    });
  });
  OASES_CUDA_CHECK_LAUNCH("elements_kernel");
}

void scatter_elements(Elem t, const void* data, const std::vector<int64_t>& dshape, const void* idx, bool idx64,
                      const std::vector<int64_t>& ishape, const void* updates, int64_t axis, int reduction, void* out, Fault f,
                      cudaStream_t s) {
  ElemMaps m = elem_maps(dshape, ishape, axis);
  size_t es = elem_size(t);
  int64_t total = product(dshape, 0, dshape.size()), n = product(ishape, 0, ishape.size());
  if (out != data && total > 0) OASES_CUDA_CHECK(cudaMemcpyAsync(out, data, static_cast<size_t>(total) * es, cudaMemcpyDeviceToDevice, s));
  if (n <= 0) return;
  if (reduction == 0) {
    dispatch_bits(es, [&](auto tb) {
      using B = typename decltype(tb)::type;
      by_index_type(idx64, [&](auto ti) {
        using I = typename decltype(ti)::type;
        elements_kernel<true, B, I>
            <<<grid(n), kThreads, 0, s>>>(static_cast<const B*>(updates), static_cast<const I*>(idx), static_cast<B*>(out), m, n, f);
      });
    });
    OASES_CUDA_CHECK_LAUNCH("elements_kernel");
    return;
  }
  int64_t inner = product(ishape, static_cast<size_t>(axis) + 1, ishape.size()), lines = n / std::max<int64_t>(1, ishape[static_cast<size_t>(axis)]);
  dispatch_numeric("ScatterElements", t, [&](auto tt) {
    using T = typename decltype(tt)::type;
    by_index_type(idx64, [&](auto ti) {
      using I = typename decltype(ti)::type;
      scatter_elements_reduce_kernel<T, I><<<grid(lines), kThreads, 0, s>>>(static_cast<const I*>(idx), static_cast<const T*>(updates),
                                                                             static_cast<T*>(out), m, lines, std::max<int64_t>(1, inner),
                                                                             reduction, f);
    });
  });
  OASES_CUDA_CHECK_LAUNCH("scatter_elements_reduce_kernel");
}

void cumsum(Elem t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse, cudaStream_t s) {
  if (outer * inner <= 0 || n <= 0) return;
  dispatch_numeric("CumSum", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cumsum_kernel<T><<<grid(outer * inner), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), outer, n, inner, exclusive,
                                                              reverse);
  });
  OASES_CUDA_CHECK_LAUNCH("cumsum_kernel");
}

}  // namespace oases::cuda
