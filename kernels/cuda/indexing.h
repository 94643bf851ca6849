// GatherND, ScatterND and CumSum on the GPU (indexing.cu), with the CPU kernels' semantics
// (kernels/cpu/indexing.h): negative indices count from the end, an index outside its dimension is
// reported through the fault word (its position in the indices), nothing is read or written for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/loss.h"

namespace oases::cuda {

// data [B.., D..] (b = batch_dims leading dims), indices int64 [B.., I.., m]; out [B.., I.., D[b+m..]].
void gather_nd(size_t es, const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
               int64_t batch_dims, void* out, Fault f, cudaStream_t s);

// out = data, then out[idx tuple] (reduction) = updates slice, indices int64 [I.., m], updates [I.., D[m..]].
// reduction: 0 none, 1 add, 2 mul, 3 max, 4 min. With a reduction, each element of a slice takes its
// updates in index order (one thread per element of the slice: deterministic, as on the CPU).
void scatter_nd(Elem t, const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, const std::vector<int64_t>& ishape,
                const void* updates, int reduction, void* out, Fault f, cudaStream_t s);

// GatherElements: out (shape of the indices) [.., i_axis, ..] = data[.., idx[..], ..]; ScatterElements:
// out = data, then out[.., idx[..], ..] (reduction) = updates[..] (updates shaped like the indices),
// with a reduction walking each line's updates in order (one thread per line along the axis).
// Indices int64 or int32 (idx64).
void gather_elements(size_t es, const void* data, const std::vector<int64_t>& dshape, const void* idx, bool idx64,
                     const std::vector<int64_t>& ishape, int64_t axis, void* out, Fault f, cudaStream_t s);
void scatter_elements(Elem t, const void* data, const std::vector<int64_t>& dshape, const void* idx, bool idx64,
                      const std::vector<int64_t>& ishape, const void* updates, int64_t axis, int reduction, void* out, Fault f,
                      cudaStream_t s);

// y_t = Σ x_s along a dim of length n (lines of outer × inner), exclusive / reverse as ONNX CumSum.
void cumsum(Elem t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse, cudaStream_t s);

}  // namespace oases::cuda
