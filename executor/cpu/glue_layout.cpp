// CPU glue for data movement: views (Reshape & co. copy only when not aliased), Transpose,
// Expand, Concat, Split, Slice, Tile, Pad, Gather, GatherElements, GatherND, ScatterND,
// ScatterElements, OneHot, generators, and the backward ops GatherGrad and SliceGrad.
#include <cmath>

#include "executor/cpu/common.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/indexing.h"
#include "kernels/cpu/layout.h"

namespace oases {

using namespace oases::cpu;
namespace k = oases::kernels;

namespace {

void copy_view(KernelContext& c) {
  if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
}

template <class F>
void by_elem_size(size_t es, F&& f) {
  switch (es) {
    case 1: f.template operator()<uint8_t>(); break;
    case 2: f.template operator()<uint16_t>(); break;
    case 4: f.template operator()<uint32_t>(); break;
    default: f.template operator()<uint64_t>(); break;
  }
}

k::ScatterReduction scatter_reduction(const KernelContext& c) {
  std::string red = c.attrs().get_string("reduction", "none");
  if (red == "add") return k::ScatterReduction::kAdd;
  if (red == "mul") return k::ScatterReduction::kMul;
  if (red == "max") return k::ScatterReduction::kMax;
  if (red == "min") return k::ScatterReduction::kMin;
  return k::ScatterReduction::kNone;
}

[[noreturn]] void bad_index(const KernelContext& c, int slot, int64_t pos) {
  int64_t v = static_cast<int64_t>(load_as_double(c.in[slot].data, c.in[slot].dtype, pos));
  c.fail("index {} at position {} of '{}' is out of range for data {}", v, pos, c.graph->value(c.node->inputs[slot]).name,
         shape_str(c.in[0].shape));
}

// ScatterND / ScatterElements: plain assignment moves bits of the element size; reductions run
// on the element type (float16/bfloat16 through float32).
template <class Run>
void scatter_kernel(KernelContext& c, Run run) {
  k::ScatterReduction red = scatter_reduction(c);
  int64_t bad = -1;
  if (red == k::ScatterReduction::kNone) {
    by_elem_size(dtype_size(c.in[0].dtype), [&]<class T>() { bad = run.template operator()<T>(c, red); });
  } else {
    with_half_as_float(
        c, [&](KernelContext& f) { dispatch_numeric(f, f.in[0].dtype, [&]<class T>() { bad = run.template operator()<T>(f, red); }); });
  }
  if (bad >= 0) bad_index(c, 1, bad);
}

struct ScatterNd {
  template <class T>
  int64_t operator()(KernelContext& f, k::ScatterReduction red) const {
    return k::scatter_nd<T>(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<int64_t>(), f.in[1].shape, f.in[2].as<T>(), red, f.out[0].as<T>());
  }
};

struct ScatterElements {
  template <class T>
  int64_t operator()(KernelContext& f, k::ScatterReduction red) const {
    int64_t axis = f.attrs().get_int("axis", 0);
    if (f.in[1].dtype == DType::kI32) {
      return k::scatter_elements<T, int32_t>(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<int32_t>(), f.in[1].shape, f.in[2].as<T>(), axis,
                                             red, f.out[0].as<T>());
    }
    return k::scatter_elements<T, int64_t>(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<int64_t>(), f.in[1].shape, f.in[2].as<T>(), axis, red,
                                           f.out[0].as<T>());
  }
};

}  // namespace

void register_cpu_layout(CpuKernelRegistry& r) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) r.add("", op, copy_view);
  r.add("", "Transpose", [](KernelContext& c) {
    k::transpose(c.in[0].data, c.in[0].shape, c.attrs().get_ints("perm"), c.out[0].data, dtype_size(c.in[0].dtype));
  });
  r.add("", "Expand", [](KernelContext& c) {
    by_elem_size(dtype_size(c.in[0].dtype),
                 [&]<class T>() { k::broadcast_to(c.in[0].as<T>(), c.in[0].shape, c.out[0].as<T>(), c.out[0].shape); });
  });
  r.add("", "Concat", [](KernelContext& c) {
    std::vector<const void*> ins;
    std::vector<std::vector<int64_t>> shapes;
    for (auto& v : c.in) {
      ins.push_back(v.data);
      shapes.push_back(v.shape);
    }
    k::concat(ins, shapes, c.attrs().get_int("axis", 0), c.out[0].data, dtype_size(c.out[0].dtype));
  });
  r.add("", "Split", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    std::vector<int64_t> split = c.attrs().get_ints("split");
    size_t es = dtype_size(c.in[0].dtype);
    std::vector<int64_t> starts(c.in[0].shape.size(), 0), steps(c.in[0].shape.size(), 1);
    int64_t pos = 0;
    for (size_t i = 0; i < split.size(); ++i) {
      if (i < c.out.size() && c.out[i].data) {
        starts[axis] = pos;
        k::strided_slice(c.in[0].data, c.in[0].shape, starts, steps, c.out[i].data, c.out[i].shape, es);
      }
      pos += split[i];
    }
  });
  r.add("", "Slice", [](KernelContext& c) {
    size_t rank = c.in[0].shape.size();
    std::vector<int64_t> starts(rank, 0), steps(rank, 1);
    std::vector<int64_t> axes = c.attrs().get_ints("axes"), st = c.attrs().get_ints("starts"), sp = c.attrs().get_ints("steps");
    for (size_t i = 0; i < axes.size(); ++i) {
      starts[axes[i]] = st[i];
      steps[axes[i]] = sp[i];
    }
    k::strided_slice(c.in[0].data, c.in[0].shape, starts, steps, c.out[0].data, c.out[0].shape, dtype_size(c.in[0].dtype));
  });
  r.add("", "Tile",
        [](KernelContext& c) { k::tile(c.in[0].data, c.in[0].shape, c.out[0].data, c.out[0].shape, dtype_size(c.in[0].dtype)); });
  r.add("", "Pad", [](KernelContext& c) {
    std::string mode = c.attrs().get_string("mode", "constant");
    int m = mode == "reflect" ? 1 : mode == "edge" ? 2 : mode == "wrap" ? 3 : 0;
    std::vector<uint8_t> value(dtype_size(c.in[0].dtype), 0);
    if (c.has_input(2) && c.in[2].numel() > 0) {
      if (c.in[2].dtype != c.in[0].dtype) {
        c.fail("constant_value has type {}, data {}", dtype_name(c.in[2].dtype), dtype_name(c.in[0].dtype));
      }
      std::memcpy(value.data(), c.in[2].data, value.size());
    } else {
      store_from_double(value.data(), c.in[0].dtype, 0, c.attrs().get_float("value", 0.f));
    }
    if (m != 0) {
      for (size_t d = 0; d < c.in[0].shape.size(); ++d) {
        if (c.in[0].shape[d] == 0 && c.out[0].shape[d] != 0) c.fail("cannot pad an empty axis {} in mode {}", d, mode);
      }
    }
    k::pad(c.in[0].data, c.in[0].shape, c.attrs().get_ints("pads"), m, value.data(), c.out[0].data, dtype_size(c.in[0].dtype));
  });
  r.add("", "Gather", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    int64_t bad = c.in[1].dtype == DType::kI64 ? k::gather(c.in[0].data, c.in[0].shape, c.in[1].as<int64_t>(), c.in[1].numel(), axis,
                                                           c.out[0].data, dtype_size(c.in[0].dtype))
                                               : k::gather_i32(c.in[0].data, c.in[0].shape, c.in[1].as<int32_t>(), c.in[1].numel(), axis,
                                                               c.out[0].data, dtype_size(c.in[0].dtype));
    if (bad >= 0) {
      int64_t v = static_cast<int64_t>(load_as_double(c.in[1].data, c.in[1].dtype, bad));
      c.fail("index {} at position {} of '{}' is outside [0, {}) on axis {}", v, bad, c.graph->value(c.node->inputs[1]).name,
             c.in[0].shape[axis], axis);
    }
  });
  r.add("", "GatherElements", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& ds = c.in[0].shape;
    const Shape& is = c.in[1].shape;
    std::vector<int64_t> dst = contiguous_strides(ds);
    size_t es = dtype_size(c.in[0].dtype);
    int64_t n = c.in[1].numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (int64_t d = static_cast<int64_t>(is.size()) - 1; d >= 0; --d) {
        int64_t idx = rem % is[d];
        rem /= is[d];
        if (d == axis) {
          int64_t v = static_cast<int64_t>(load_as_double(c.in[1].data, c.in[1].dtype, i));
          if (v < 0) v += ds[d];
          if (v < 0 || v >= ds[d]) c.fail("index out of range on axis {}", axis);
          idx = v;
        }
        off += idx * dst[d];
      }
      std::memcpy(static_cast<char*>(c.out[0].data) + i * static_cast<int64_t>(es),
                  static_cast<const char*>(c.in[0].data) + off * static_cast<int64_t>(es), es);
    }
  });
  r.add("", "GatherND", [](KernelContext& c) {
    int64_t bad = k::gather_nd(c.in[0].data, c.in[0].shape, c.in[1].as<int64_t>(), c.in[1].shape, c.attrs().get_int("batch_dims", 0),
                               c.out[0].data, dtype_size(c.in[0].dtype));
    if (bad >= 0) bad_index(c, 1, bad);
  });
  r.add("", "ScatterND", [](KernelContext& c) { scatter_kernel(c, ScatterNd{}); });
  r.add("", "ScatterElements", [](KernelContext& c) { scatter_kernel(c, ScatterElements{}); });
  r.add("", "EyeLike", [](KernelContext& c) {
    int64_t rows = c.out[0].shape[0], cols = c.out[0].shape[1], kk = c.attrs().get_int("k", 0);
    std::memset(c.out[0].data, 0, c.out[0].nbytes());
    for (int64_t i = 0; i < rows; ++i) {
      int64_t j = i + kk;
      if (j >= 0 && j < cols) store_from_double(c.out[0].data, c.out[0].dtype, i * cols + j, 1.0);
    }
  });
  r.add("", "OneHot", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", -1);
    int64_t depth = c.attrs().get_int("depth", 0);
    const Shape& is = c.in[0].shape;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= is[d];
    for (size_t d = static_cast<size_t>(axis); d < is.size(); ++d) inner *= is[d];
    size_t es = dtype_size(c.out[0].dtype);
    const char* vals = static_cast<const char*>(c.in[2].data);
    char* out = static_cast<char*>(c.out[0].data);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t d = 0; d < depth; ++d) {
        for (int64_t j = 0; j < inner; ++j) {
          int64_t v = static_cast<int64_t>(load_as_double(c.in[0].data, c.in[0].dtype, o * inner + j));
          if (v < 0) v += depth;
          std::memcpy(out + ((o * depth + d) * inner + j) * static_cast<int64_t>(es), vals + (v == d ? es : 0), es);
        }
      }
    }
  });
  r.add("", "ConstantOfShape", [](KernelContext& c) {
    const Attribute* v = c.attrs().find("value");
    size_t es = dtype_size(c.out[0].dtype);
    int64_t n = c.out[0].numel();
    if (!v) {
      std::memset(c.out[0].data, 0, c.out[0].nbytes());
      return;
    }
    const char* src = static_cast<const char*>(v->t.raw());
    for (int64_t i = 0; i < n; ++i) std::memcpy(static_cast<char*>(c.out[0].data) + i * static_cast<int64_t>(es), src, es);
  });
  r.add("", "Range", [](KernelContext& c) {
    double start = load_as_double(c.in[0].data, c.in[0].dtype, 0);
    double delta = load_as_double(c.in[2].data, c.in[2].dtype, 0);
    for (int64_t i = 0; i < c.out[0].numel(); ++i)
      store_from_double(c.out[0].data, c.out[0].dtype, i, start + static_cast<double>(i) * delta);
  });
  r.add("", "Shape", [](KernelContext& c) {
    int64_t s = c.attrs().get_int("start", 0);
    for (int64_t i = 0; i < c.out[0].numel(); ++i) c.out[0].as<int64_t>()[i] = c.in[0].shape[s + i];
  });
  r.add("", "Size", [](KernelContext& c) { *c.out[0].as<int64_t>() = c.in[0].numel(); });
  r.add("", "Constant", [](KernelContext& c) {
    const Value& v = c.graph->value(c.node->outputs[0]);
    if (v.is_constant()) std::memcpy(c.out[0].data, v.constant.raw(), v.constant.nbytes());
  });

  // backward
  r.add("oases", "GatherGrad", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& ds = c.out[0].shape;
    int64_t outer = rows_before(ds, axis), dim = ds[axis];
    int64_t inner = shape_numel(ds) / std::max<int64_t>(1, outer * dim);
    int64_t nidx = c.in[1].numel();
    const auto [start, total] = table_rows(c, dim);  // a vocabulary-split table: this rank's rows
    std::vector<int64_t> idx(static_cast<size_t>(nidx));
    for (int64_t i = 0; i < nidx; ++i) idx[i] = static_cast<int64_t>(load_as_double(c.in[1].data, c.in[1].dtype, i));
    dispatch_float(c, c.out[0].dtype, [&]<class T>() {
      int64_t bad = k::gather_grad<T>(c.in[0].as<T>(), idx.data(), nidx, outer, dim, inner, start, total, c.out[0].as<T>());
      if (bad >= 0) c.fail("index {} outside [0, {})", idx[bad] < 0 ? idx[bad] + total : idx[bad], total);
    });
  });
  r.add("oases", "SliceGrad", [](KernelContext& c) {
    const Shape& in = c.out[0].shape;
    std::vector<int64_t> starts(in.size(), 0), steps(in.size(), 1);
    std::vector<int64_t> axes = c.attrs().get_ints("axes"), st = c.attrs().get_ints("starts"), sp = c.attrs().get_ints("steps");
    for (size_t i = 0; i < axes.size(); ++i) {
      starts[axes[i]] = st[i];
      steps[axes[i]] = sp[i];
    }
    std::memset(c.out[0].data, 0, c.out[0].nbytes());
    k::strided_scatter(c.in[0].data, c.in[0].shape, starts, steps, c.out[0].data, in, dtype_size(c.out[0].dtype));
  });
}

}  // namespace oases
