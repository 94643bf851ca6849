// Helpers for the CPU kernel glue: dtype dispatch and float16/bfloat16 up-casting.
#pragma once

#include <cstring>
#include <vector>

#include "executor/kernel_context.h"
#include "kernels/cpu/attention.h"

namespace oases::cpu {

// Calls f.template operator()<T>() for arithmetic types (not bool, not half types).
template <class F>
void dispatch_numeric(const KernelContext& c, DType t, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<float>(); break;
    case DType::kF64: f.template operator()<double>(); break;
    case DType::kI64: f.template operator()<int64_t>(); break;
    case DType::kI32: f.template operator()<int32_t>(); break;
    case DType::kI16: f.template operator()<int16_t>(); break;
    case DType::kI8: f.template operator()<int8_t>(); break;
    case DType::kU8: f.template operator()<uint8_t>(); break;
    case DType::kU16: f.template operator()<uint16_t>(); break;
    case DType::kU32: f.template operator()<uint32_t>(); break;
    case DType::kU64: f.template operator()<uint64_t>(); break;
    default: c.fail("type {} is not supported here", dtype_name(t));
  }
}

template <class F>
void dispatch_float(const KernelContext& c, DType t, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<float>(); break;
    case DType::kF64: f.template operator()<double>(); break;
    default: c.fail("type {} is not supported here (float32 and float64 are)", dtype_name(t));
  }
}

bool is_half(DType t);
// Runs `k` with float16/bfloat16 inputs and outputs converted to float32 views (and the outputs
// converted back); other dtypes run directly.
void with_half_as_float(KernelContext& c, const std::function<void(KernelContext&)>& k);

// Product of the dims before `axis`: the outer count of an [outer, n, inner] view.
inline int64_t rows_before(const Shape& s, int64_t axis) {
  int64_t r = 1;
  for (int64_t d = 0; d < axis; ++d) r *= s[d];
  return r;
}

inline std::vector<int64_t> promote_matrix(const Shape& s, bool is_a) {
  std::vector<int64_t> r(s.begin(), s.end());
  if (r.size() == 1) {
    if (is_a) {
      r.insert(r.begin(), 1);
    } else {
      r.push_back(1);
    }
  }
  return r;
}

// Shapes, mask and mask strides of an Attention (q at slot 0) or AttentionGrad (q at slot 1) node.
struct AttentionArgs {
  kernels::AttentionShape shape{};
  const void* mask = nullptr;
  bool mask_bool = false;
  int64_t ms[4] = {0, 0, 0, 0};
};
AttentionArgs attention_args(const KernelContext& c, int q_slot);
// A strided attention's layout attributes (graph/ops/fused.cpp: [offset, batch, head, time
// strides], or [batch, head, time strides] for O and dO) into strides[i], i in the order q, k, v,
// O and, with `backward`, dO, dq, dk, dv; offsets[0..2] receive q, k, v's offsets into their
// sources and, with `backward`, offsets[3..5] dq, dk, dv's.
void attention_layouts(const KernelContext& c, bool backward, int64_t* const strides[8], int64_t offsets[6]);

// Training-mode dropout on a float32 tensor (kernels/cpu/dropout.h has the math): unpacks the key
// node, the whole tensor's shape (attr mask_shape), the static offsets of micro-batch chunks
// (mask_offsets) and the mesh axis splitting each dim (shard_axes, whose offset comes from this
// rank's place in the group), so the same element gets the same mask under any chunking, sharding
// or recomputation.
void apply_dropout(const KernelContext& c, const float* x, float* y, uint8_t* mask, float ratio);

// The rows [start, start + dim) of a table of `total` rows that this rank holds: the whole table,
// or its share of a vocabulary-split one (attribute row_mesh_axis: split over that mesh axis).
struct TableRows {
  int64_t start = 0, total = 0;
};
TableRows table_rows(const KernelContext& c, int64_t dim);

}  // namespace oases::cpu
