// Data movement on raw bytes (element size `es`): transpose, strided slice, concat, gather,
// pad, tile. Innermost contiguous runs are copied with memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oases::kernels {

// Row-major strides (in elements) of a contiguous tensor of `shape`.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape);

// out = in.permute(perm); out shape is in shape permuted.
void transpose(const void* in, const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, void* out, size_t es);

// out[i0..] = in[start_d + i_d * step_d] over every dim d (steps may be negative).
void strided_slice(const void* in, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& steps, void* out, const std::vector<int64_t>& out_shape, size_t es);

// Inverse of strided_slice: scatters `src` into `dst` (dst otherwise untouched); used for Slice's
// gradient and Split's inverse.
void strided_scatter(const void* src, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& steps, void* dst, const std::vector<int64_t>& dst_shape, size_t es);

// Concatenates inputs along `axis`.
void concat(const std::vector<const void*>& ins, const std::vector<std::vector<int64_t>>& shapes, int64_t axis, void* out, size_t es);

// out = data.take(indices, axis); negative indices count from the end; an index out of range
// returns its position (>= 0) so the caller can report it, else -1.
int64_t gather(const void* data, const std::vector<int64_t>& dshape, const int64_t* idx, int64_t nidx, int64_t axis, void* out, size_t es);
int64_t gather_i32(const void* data, const std::vector<int64_t>& dshape, const int32_t* idx, int64_t nidx, int64_t axis, void* out,
                   size_t es);

// Constant / edge / reflect / wrap padding; `pads` is [begin_0.., end_0..]; `value` holds one element.
void pad(const void* in, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& pads, int mode, const void* value, void* out,
         size_t es);  // mode: 0 constant, 1 reflect, 2 edge, 3 wrap

void tile(const void* in, const std::vector<int64_t>& in_shape, void* out, const std::vector<int64_t>& out_shape, size_t es);

// Block shuffles around collectives over a (segmented) dimension:
//   to_rank_major:   [outer][segs][n][block] -> [n][outer][segs][block]   (before a reduce-scatter)
//   from_rank_major: [n][outer][segs][block] -> [outer][segs][n][block]   (after an all-gather)
void to_rank_major(const void* in, void* out, int64_t outer, int64_t segs, int64_t n, size_t block_bytes);
void from_rank_major(const void* in, void* out, int64_t outer, int64_t segs, int64_t n, size_t block_bytes);

}  // namespace oases::kernels
