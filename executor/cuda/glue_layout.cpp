// CUDA glue for data movement (the CPU glue is executor/cpu/glue_layout.cpp): views, Transpose, Expand,
// Concat, Split, Slice and its gradient, Tile, constant Pad, Gather / embedding and its gradient,
// ConstantOfShape. Every one is a strided copy through the affine maps of kernels/cuda/nd.h.
#include <cstring>

#include "executor/communicator.h"
#include "executor/cuda/cuda_context.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/indexing.h"
#include "kernels/cuda/loss.h"

namespace oases::cuda {

namespace {

void copy_view(CudaContext& c) {
  if (c.out(0).data != c.in(0).data) copy_bytes(c.in(0).data, c.out(0).data, c.in(0).nbytes(), c.stream);
}

int64_t rows_before(const Shape& s, int64_t axis) {
  int64_t r = 1;
  for (int64_t d = 0; d < axis; ++d) r *= s[static_cast<size_t>(d)];
  return r;
}


// ScatterND/ScatterElements' reduction as indexing.h numbers it: 0 none, 1 add, 2 mul, 3 max, 4 min.
int scatter_reduction(const CudaContext& c) {
  std::string red = c.attrs().get_string("reduction", "none");
  return red == "add" ? 1 : red == "mul" ? 2 : red == "max" ? 3 : red == "min" ? 4 : 0;
}
}  // namespace

void register_cuda_layout(CudaKernelRegistry& r) {
  r.add("", "GatherND", [](CudaContext& c) {
    if (c.in(1).dtype != DType::kI64) c.k.fail("GatherND indices must be int64 on CUDA");
    gather_nd(dtype_size(c.in(0).dtype), c.in(0).data, c.in(0).shape, c.in(1).as<int64_t>(), c.in(1).shape,
              c.attrs().get_int("batch_dims", 0), c.out(0).data, c.fault, c.stream);
  });
  r.add("", "ScatterND", [](CudaContext& c) {
    if (c.in(1).dtype != DType::kI64) c.k.fail("ScatterND indices must be int64 on CUDA");
    scatter_nd(elem(c.in(0).dtype), c.in(0).data, c.in(0).shape, c.in(1).as<int64_t>(), c.in(1).shape, c.in(2).data, scatter_reduction(c),
               c.out(0).data, c.fault, c.stream);
  });
  r.add("", "GatherElements", [](CudaContext& c) {
    gather_elements(dtype_size(c.in(0).dtype), c.in(0).data, c.in(0).shape, c.in(1).data, c.in(1).dtype == DType::kI64, c.in(1).shape,
                    c.attrs().get_int("axis", 0), c.out(0).data, c.fault, c.stream);
  });
  r.add("", "ScatterElements", [](CudaContext& c) {
    scatter_elements(elem(c.in(0).dtype), c.in(0).data, c.in(0).shape, c.in(1).data, c.in(1).dtype == DType::kI64, c.in(1).shape,
                     c.in(2).data, c.attrs().get_int("axis", 0), scatter_reduction(c), c.out(0).data, c.fault, c.stream);
  });
  r.add("", "CumSum", [](CudaContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& s = c.in(0).shape;
    int64_t outer = 1, inner = 1, n = s[static_cast<size_t>(axis)];
    for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
    cumsum(elem(c.in(0).dtype), c.in(0).data, c.out(0).data, outer, n, inner, c.attrs().get_int("exclusive", 0) != 0,
           c.attrs().get_int("reverse", 0) != 0, c.stream);
  });
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) r.add("", op, copy_view);
  r.add("", "Transpose", [](CudaContext& c) {
    copy(c.in(0).data, c.out(0).data, dtype_size(c.in(0).dtype), transpose_plan(dims(c.in(0).shape), c.attrs().get_ints("perm")), c.stream);
  });
  r.add("", "Expand", [](CudaContext& c) {
    copy(c.in(0).data, c.out(0).data, dtype_size(c.in(0).dtype), broadcast_plan(dims(c.out(0).shape), {dims(c.in(0).shape)}), c.stream);
  });
  r.add("", "Concat", [](CudaContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0), off = 0;
    size_t es = dtype_size(c.out(0).dtype);
    for (const TensorView& v : c.k.in) {
      if (v.numel() > 0) copy(v.data, c.out(0).data, es, concat_part_plan(dims(v.shape), dims(c.out(0).shape), axis, off), c.stream);
      off += v.shape[static_cast<size_t>(axis)];
    }
  });
  r.add("", "Split", [](CudaContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    std::vector<int64_t> split = c.attrs().get_ints("split");
    size_t es = dtype_size(c.in(0).dtype);
    std::vector<int64_t> starts(c.in(0).shape.size(), 0), steps(c.in(0).shape.size(), 1);
    int64_t pos = 0;
    for (size_t i = 0; i < split.size(); ++i) {
      if (i < c.k.out.size() && c.k.out[i].data) {
        starts[static_cast<size_t>(axis)] = pos;
        copy(c.in(0).data, c.k.out[i].data, es, slice_plan(dims(c.in(0).shape), starts, steps, dims(c.k.out[i].shape)), c.stream);
      }
      pos += split[i];
    }
  });
  auto slice_args = [](CudaContext& c, const Shape& in, std::vector<int64_t>* starts, std::vector<int64_t>* steps) {
    starts->assign(in.size(), 0);
    steps->assign(in.size(), 1);
    std::vector<int64_t> axes = c.attrs().get_ints("axes"), st = c.attrs().get_ints("starts"), sp = c.attrs().get_ints("steps");
    for (size_t i = 0; i < axes.size(); ++i) {
      (*starts)[static_cast<size_t>(axes[i])] = st[i];
      (*steps)[static_cast<size_t>(axes[i])] = sp[i];
    }
  };
  r.add("", "Slice", [slice_args](CudaContext& c) {
    std::vector<int64_t> starts, steps;
    slice_args(c, c.in(0).shape, &starts, &steps);
    copy(c.in(0).data, c.out(0).data, dtype_size(c.in(0).dtype), slice_plan(dims(c.in(0).shape), starts, steps, dims(c.out(0).shape)),
         c.stream);
  });
  r.add("oases", "SliceGrad", [slice_args](CudaContext& c) {
    // zero the input-shaped gradient, then write dy where the slice read: the slice plan walks dy
    // and addresses the full tensor, so its maps swapped scatter instead of gather
    std::vector<int64_t> starts, steps;
    slice_args(c, c.out(0).shape, &starts, &steps);
    fill(c.out(0).data, c.out(0).numel(), dtype_size(c.out(0).dtype), 0, c.stream);
    NdPlan p = slice_plan(dims(c.out(0).shape), starts, steps, dims(c.in(0).shape));
    std::swap(p.maps[0], p.maps[1]);
    copy(c.in(0).data, c.out(0).data, dtype_size(c.out(0).dtype), p, c.stream);
  });
  r.add("", "Tile", [](CudaContext& c) {
    // out[t·n + i] = in[i] per dim: the output as [repeat_d, n_d] pairs, the input broadcast over repeats
    const Shape &in = c.in(0).shape, &out = c.out(0).shape;
    std::vector<int64_t> shape, ost, ist;
    std::vector<int64_t> is = row_major_strides(dims(in)), os = row_major_strides(dims(out));
    for (size_t d = 0; d < in.size(); ++d) {
      int64_t rep = in[d] ? out[d] / in[d] : 0;
      shape.push_back(rep);
      ost.push_back(in[d] * os[d]);
      ist.push_back(0);
      shape.push_back(in[d]);
      ost.push_back(os[d]);
      ist.push_back(is[d]);
    }
    copy(c.in(0).data, c.out(0).data, dtype_size(c.in(0).dtype), make_plan(shape, {ost, ist}, {}), c.stream);
  });
  r.add("", "Pad", [](CudaContext& c) {
    std::string mode = c.attrs().get_string("mode", "constant");
    if (mode != "constant") c.k.fail("Pad mode '{}' is not supported on CUDA (constant is)", mode);
    std::vector<int64_t> pads = c.attrs().get_ints("pads");
    size_t rank = c.in(0).shape.size(), es = dtype_size(c.in(0).dtype);
    for (int64_t p : pads) {
      if (p < 0) c.k.fail("negative pads are not supported on CUDA");
    }
    uint64_t bits = 0;
    if (c.has_input(2) && c.in(2).numel() > 0) {
      const Value& pv = c.k.graph->value(c.k.node->inputs[2]);
      if (!pv.is_constant()) c.k.fail("a computed pad value is not supported on CUDA (give it as a constant)");
      std::memcpy(&bits, pv.constant.raw(), es);
    } else {
      uint8_t v[8] = {0};
      store_from_double(v, c.in(0).dtype, 0, c.attrs().get_float("value", 0.f));
      std::memcpy(&bits, v, es);
    }
    fill(c.out(0).data, c.out(0).numel(), es, bits, c.stream);
    std::vector<int64_t> starts(pads.begin(), pads.begin() + static_cast<int64_t>(rank)), steps(rank, 1);
    NdPlan p = slice_plan(dims(c.out(0).shape), starts, steps, dims(c.in(0).shape));
    std::swap(p.maps[0], p.maps[1]);
    copy(c.in(0).data, c.out(0).data, es, p, c.stream);
  });
  r.add("", "Gather", [](CudaContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& ds = c.in(0).shape;
    int64_t outer = rows_before(ds, axis), dim = ds[static_cast<size_t>(axis)];
    int64_t inner = shape_numel(ds) / std::max<int64_t>(1, outer * dim);
    gather_forward(dtype_size(c.in(0).dtype), c.in(0).data, c.in(1).data, c.in(1).dtype == DType::kI64, c.in(1).numel(), c.out(0).data,
                   outer, dim, inner, 0, dim, false, c.fault, c.stream);
  });
  r.add("oases", "GatherGrad", [](CudaContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& ds = c.out(0).shape;
    int64_t outer = rows_before(ds, axis), dim = ds[static_cast<size_t>(axis)];
    int64_t inner = shape_numel(ds) / std::max<int64_t>(1, outer * dim);
    int64_t start = 0, total = dim;
    if (c.attrs().has("row_mesh_axis")) {
      CommGroup& g = c.k.group(c.attrs().get_int("row_mesh_axis", 0));
      start = g.rank() * dim;
      total = dim * g.size();
    }
    Elem t = elem(c.out(0).dtype);
    float* scratch = t == Elem::kF32 ? nullptr : c.scratch_floats(static_cast<size_t>(c.out(0).numel()));
    gather_backward(t, c.in(0).data, c.in(1).data, c.in(1).dtype == DType::kI64, c.in(1).numel(), c.out(0).data, outer, dim, inner, start,
                    total, scratch, c.fault, c.stream);
  });
  r.add("", "ConstantOfShape", [](CudaContext& c) {
    const Attribute* v = c.attrs().find("value");
    size_t es = dtype_size(c.out(0).dtype);
    uint64_t bits = 0;
    if (v) std::memcpy(&bits, v->t.raw(), std::min<size_t>(es, 8));
    fill(c.out(0).data, c.out(0).numel(), es, bits, c.stream);
  });
}

}  // namespace oases::cuda
