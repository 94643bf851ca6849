// Affine index maps over an N-d iteration space, shared by the CUDA kernels and the host code that
// builds their arguments. A kernel walks the elements of `Iter` in row-major order; each operand
// finds its element at  base + Σ_d coord_d · stride_d. Broadcasting (stride 0), transposes
// (permuted strides), strided slices (base + step-scaled strides) and concatenation (a part written
// at an offset of the output) are all such maps, so one copy kernel and one elementwise kernel cover
// them.
//
// Plain C++17 with OASES_HD on the per-element functions: nvcc compiles them for the device and g++
// for the host, and the unit tests check the maps on the CPU against the CPU kernels' layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__CUDACC__)
#define OASES_HD __host__ __device__
#else
#define OASES_HD
#endif

namespace oases::cuda {

constexpr int kMaxDims = 8;

struct Iter {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t numel = 1;
};

struct Affine {
  int64_t base = 0;
  int64_t stride[kMaxDims] = {};
};

// Offset of the element at row-major position `linear` of `it` under map `m`.
OASES_HD inline int64_t affine_offset(const Iter& it, const Affine& m, int64_t linear) {
  int64_t off = m.base;
  if (it.numel <= 0xffffffffLL) {  // 32-bit division: several times cheaper on a GPU
    uint32_t l = static_cast<uint32_t>(linear);
    for (int d = it.rank - 1; d >= 0; --d) {
      uint32_t sh = static_cast<uint32_t>(it.shape[d]), c = l % sh;
      l /= sh;
      off += static_cast<int64_t>(c) * m.stride[d];
    }
    return off;
  }
  for (int d = it.rank - 1; d >= 0; --d) {
    int64_t c = linear % it.shape[d];
    linear /= it.shape[d];
    off += c * m.stride[d];
  }
  return off;
}

// The maps of a kernel's operands, one argument.
template <int N>
struct Maps {
  Affine m[N];
};

// Offsets under every map of the element at row-major position `linear`: the coordinates are found
// once for all maps, with 32-bit division when the space has fewer than 2^32 elements (64-bit
// division costs several times as much on a GPU, and an elementwise kernel is mostly index math).
template <int N>
OASES_HD inline void affine_offsets(const Iter& it, const Maps<N>& m, int64_t linear, int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = m.m[k].base;
  if (it.numel <= 0xffffffffLL) {
    uint32_t l = static_cast<uint32_t>(linear);
    for (int d = it.rank - 1; d >= 0; --d) {
      uint32_t sh = static_cast<uint32_t>(it.shape[d]), c = l % sh;
      l /= sh;
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(c) * m.m[k].stride[d];
    }
    return;
  }
  for (int d = it.rank - 1; d >= 0; --d) {
    int64_t c = linear % it.shape[d];
    linear /= it.shape[d];
    for (int k = 0; k < N; ++k) off[k] += c * m.m[k].stride[d];
  }
}

// --- host-side builders ---------------------------------------------------------------------

inline std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// Merges neighbouring dims that every map walks contiguously (fewer divisions, and ranks above
// kMaxDims usually fit afterwards). Drops size-1 dims.
inline void coalesce(std::vector<int64_t>& shape, std::vector<std::vector<int64_t>*> strides) {
  std::vector<int64_t> ns;
  std::vector<std::vector<int64_t>> nst(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !ns.empty();
    for (size_t k = 0; merge && k < strides.size(); ++k) merge = nst[k].back() == (*strides[k])[d] * shape[d];
    if (merge) {
      ns.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) nst[k].back() = (*strides[k])[d];
    } else {
      ns.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) nst[k].push_back((*strides[k])[d]);
    }
  }
  shape = ns;
  for (size_t k = 0; k < strides.size(); ++k) *strides[k] = nst[k];
}

// An iteration space with one map per operand (bases given separately); coalesced.
struct NdPlan {
  Iter it;
  std::vector<Affine> maps;
};

inline NdPlan make_plan(std::vector<int64_t> shape, std::vector<std::vector<int64_t>> strides, const std::vector<int64_t>& bases) {
  std::vector<std::vector<int64_t>*> ptrs;
  for (auto& s : strides) ptrs.push_back(&s);
  int64_t numel = 1;
  for (int64_t v : shape) numel *= v;
  coalesce(shape, ptrs);
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    throw std::runtime_error("[cuda] " + std::to_string(shape.size()) + " non-mergeable dims; the kernels take at most " +
                             std::to_string(kMaxDims));
  }
  NdPlan p;
  p.it.rank = static_cast<int>(shape.size());
  p.it.numel = numel;
  for (size_t d = 0; d < shape.size(); ++d) p.it.shape[d] = shape[d];
  for (size_t k = 0; k < strides.size(); ++k) {
    Affine a;
    a.base = k < bases.size() ? bases[k] : 0;
    for (size_t d = 0; d < shape.size(); ++d) a.stride[d] = strides[k][d];
    p.maps.push_back(a);
  }
  return p;
}

// Strides that read `in` (numpy-broadcast to `out`) while walking `out`.
inline std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int64_t> s(out.size(), 0), is = row_major_strides(in);
  size_t off = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) s[off + d] = in[d] == 1 ? 0 : is[d];
  return s;
}

// Elementwise op over `out` with operands broadcast to it; maps[0] is the output.
inline NdPlan broadcast_plan(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& ins) {
  std::vector<std::vector<int64_t>> st{row_major_strides(out)};
  for (const auto& s : ins) st.push_back(broadcast_strides(s, out));
  return make_plan(out, st, {});
}

// out = in.permute(perm): walk out, read in.
inline NdPlan transpose_plan(const std::vector<int64_t>& in, const std::vector<int64_t>& perm) {
  std::vector<int64_t> out(in.size()), is = row_major_strides(in), rs(in.size());
  for (size_t d = 0; d < perm.size(); ++d) {
    out[d] = in[static_cast<size_t>(perm[d])];
    rs[d] = is[static_cast<size_t>(perm[d])];
  }
  return make_plan(out, {row_major_strides(out), rs}, {});
}

// out[i] = in[start + i * step] per dim (ONNX Slice after normalisation); walk out, read in.
// The same plan with the maps swapped scatters a slice back (Slice's gradient).
inline NdPlan slice_plan(const std::vector<int64_t>& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& steps,
                         const std::vector<int64_t>& out) {
  std::vector<int64_t> is = row_major_strides(in), rs(in.size());
  int64_t base = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    base += starts[d] * is[d];
    rs[d] = steps[d] * is[d];
  }
  return make_plan(out, {row_major_strides(out), rs}, {0, base});
}

// The region (offset, extent: a box of a tensor) copied from the dense row-major box `from` into
// the dense box `to`, both holding it (graph/tiles.h copy_region): walk the region, write to, read from.
inline NdPlan box_copy_plan(const std::vector<int64_t>& offset, const std::vector<int64_t>& extent, const std::vector<int64_t>& from_offset,
                            const std::vector<int64_t>& from_extent, const std::vector<int64_t>& to_offset,
                            const std::vector<int64_t>& to_extent) {
  std::vector<int64_t> fs = row_major_strides(from_extent), ts = row_major_strides(to_extent);
  int64_t fb = 0, tb = 0;
  for (size_t d = 0; d < extent.size(); ++d) {
    fb += (offset[d] - from_offset[d]) * fs[d];
    tb += (offset[d] - to_offset[d]) * ts[d];
  }
  return make_plan(extent, {ts, fs}, {tb, fb});
}

// Part `in` of a concatenation written into `out` at `offset` along `axis`: walk in, write out.
inline NdPlan concat_part_plan(const std::vector<int64_t>& in, const std::vector<int64_t>& out, int64_t axis, int64_t offset) {
  std::vector<int64_t> os = row_major_strides(out);
  return make_plan(in, {os, row_major_strides(in)}, {offset * os[static_cast<size_t>(axis)], 0});
}

// Block shuffles around collectives (kernels/cpu/layout.h):
//   to_rank_major:   [outer][segs][n][block] -> [n][outer][segs][block]
//   from_rank_major: [n][outer][segs][block] -> [outer][segs][n][block]
// as transposes of 4-d arrays of elements (block counted in elements).
inline NdPlan to_rank_major_plan(int64_t outer, int64_t segs, int64_t n, int64_t block) {
  return transpose_plan({outer, segs, n, block}, {2, 0, 1, 3});
}
inline NdPlan from_rank_major_plan(int64_t outer, int64_t segs, int64_t n, int64_t block) {
  return transpose_plan({n, outer, segs, block}, {1, 2, 0, 3});
}

// The same copy with elements `width` bytes wide where every map walks the innermost dim with
// stride 1 and its length, every other stride and every base are whole wide elements: a transpose
// that keeps the last dim (e.g. [B, T, H, D] -> [B, H, T, D]) then moves 16-byte vectors with one
// index computation each instead of D/8 two-byte ones. The caller checks the pointers' alignment.
// False (plan untouched) where it does not apply.
inline bool widen_copy_plan(NdPlan& p, size_t es, size_t width = 16) {
  if (es == 0 || es >= width || width % es != 0 || p.it.rank < 1) return false;
  const int64_t v = static_cast<int64_t>(width / es);
  const int last = p.it.rank - 1;
  if (p.it.shape[last] % v != 0) return false;
  for (const Affine& m : p.maps) {
    if (m.stride[last] != 1 || m.base % v != 0) return false;
    for (int d = 0; d < last; ++d) {
      if (m.stride[d] % v != 0) return false;
    }
  }
  p.it.shape[last] /= v;
  p.it.numel /= v;
  for (Affine& m : p.maps) {
    m.base /= v;
    for (int d = 0; d < last; ++d) m.stride[d] /= v;
  }
  return true;
}

// Walks a host copy the way the copy kernel does: dst[maps[0]] = src[maps[1]] (for tests).
inline void copy_host(const NdPlan& p, const void* src, void* dst, size_t es) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t i = 0; i < p.it.numel; ++i) {
    int64_t o = affine_offset(p.it, p.maps[0], i), r = affine_offset(p.it, p.maps[1], i);
    for (size_t b = 0; b < es; ++b) d[static_cast<size_t>(o) * es + b] = s[static_cast<size_t>(r) * es + b];
  }
}

}  // namespace oases::cuda
