#include "executor/cpu/common.h"

#include "kernels/cpu/dropout.h"

#include "executor/communicator.h"

namespace oases::cpu {

bool is_half(DType t) {
  return t == DType::kF16 || t == DType::kBF16;
}

void with_half_as_float(KernelContext& c, const std::function<void(KernelContext&)>& k) {
  bool any = false;
  for (auto& v : c.in) any |= is_half(v.dtype);
  for (auto& v : c.out) any |= is_half(v.dtype);
  if (!any) {
    k(c);
    return;
  }
  KernelContext f = c;
  std::vector<std::vector<float>> bufs;
  bufs.reserve(c.in.size() + c.out.size());
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (!is_half(c.in[i].dtype) || !c.in[i].data) continue;
    bufs.emplace_back(static_cast<size_t>(c.in[i].numel()));
    for (int64_t j = 0; j < c.in[i].numel(); ++j) bufs.back()[j] = static_cast<float>(load_as_double(c.in[i].data, c.in[i].dtype, j));
    f.in[i].dtype = DType::kF32;
    f.in[i].data = bufs.back().data();
  }
  std::vector<size_t> out_buf(c.out.size(), SIZE_MAX);
  for (size_t i = 0; i < c.out.size(); ++i) {
    if (!is_half(c.out[i].dtype) || !c.out[i].data) continue;
    bufs.emplace_back(static_cast<size_t>(c.out[i].numel()));
    out_buf[i] = bufs.size() - 1;
    f.out[i].dtype = DType::kF32;
    f.out[i].data = bufs.back().data();
  }
  k(f);
  for (size_t i = 0; i < c.out.size(); ++i) {
    if (out_buf[i] == SIZE_MAX) continue;
    for (int64_t j = 0; j < c.out[i].numel(); ++j) store_from_double(c.out[i].data, c.out[i].dtype, j, bufs[out_buf[i]][j]);
  }
}

void apply_dropout(const KernelContext& c, const float* x, float* y, uint8_t* mask, float ratio) {
  const Shape& local = c.in[0].shape;
  size_t r = local.size();
  std::string name = c.attrs().get_string("key_node", c.node->name);
  uint64_t key = c.state ? dropout_key(*c.state, name) : 0;
  std::vector<int64_t> mshape = c.attrs().get_ints("mask_shape", local);
  std::vector<int64_t> off = c.attrs().get_ints("mask_offsets", std::vector<int64_t>(r, 0));
  std::vector<int64_t> axes = c.attrs().get_ints("shard_axes", std::vector<int64_t>(r, -1));
  if (mshape.size() != r || off.size() != r || axes.size() != r) c.fail("inconsistent dropout mask attributes");
  if (!(ratio >= 0.f && ratio < 1.f)) c.fail("dropout ratio {} is outside [0, 1)", ratio);
  for (size_t d = 0; d < r; ++d) {
    if (axes[d] >= 0) off[d] += c.group(axes[d]).rank() * local[d];
  }
  kernels::dropout(x, y, mask, local, mshape, off, key, ratio);
}

TableRows table_rows(const KernelContext& c, int64_t dim) {
  if (!c.attrs().has("row_mesh_axis")) return {0, dim};
  CommGroup& g = c.group(c.attrs().get_int("row_mesh_axis", 0));
  return {g.rank() * dim, dim * g.size()};
}

}  // namespace oases::cpu
