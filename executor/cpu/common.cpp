#include "executor/cpu/common.h"

namespace oases::cpu {

bool is_half(DType t) { return t == DType::kF16 || t == DType::kBF16; }

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

}  // namespace oases::cpu
