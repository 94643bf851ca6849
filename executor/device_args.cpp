#include "executor/device_args.h"

#include "executor/communicator.h"

namespace oases {

cuda::DropoutArgs make_dropout_args(const KernelContext& k, float ratio) {
  const Shape& local = k.in[0].shape;
  size_t r = local.size();
  std::string name = k.attrs().get_string("key_node", k.node->name);
  std::vector<int64_t> mshape = k.attrs().get_ints("mask_shape", local);
  std::vector<int64_t> off = k.attrs().get_ints("mask_offsets", std::vector<int64_t>(r, 0));
  std::vector<int64_t> axes = k.attrs().get_ints("shard_axes", std::vector<int64_t>(r, -1));
  if (mshape.size() != r || off.size() != r || axes.size() != r) k.fail("inconsistent dropout mask attributes");
  if (r > static_cast<size_t>(cuda::kMaxDims)) k.fail("dropout on more than {} dims", cuda::kMaxDims);
  if (!(ratio >= 0.f && ratio < 1.f)) k.fail("dropout ratio {} is outside [0, 1)", ratio);
  for (size_t d = 0; d < r; ++d) {
    if (axes[d] >= 0) off[d] += k.group(axes[d]).rank() * local[d];
  }
  std::vector<int64_t> ms = cuda::row_major_strides(mshape);
  cuda::DropoutArgs a;
  a.key = k.state ? dropout_key(*k.state, name) : 0;
  a.threshold = static_cast<uint64_t>(static_cast<double>(ratio) * 18446744073709551616.0);
  a.scale = 1.f / (1.f - ratio);
  a.local.rank = static_cast<int>(r);
  a.local.numel = shape_numel(local);
  for (size_t d = 0; d < r; ++d) {
    a.local.shape[d] = local[d];
    a.global.stride[d] = ms[d];
    a.global.base += off[d] * ms[d];
  }
  return a;
}

}  // namespace oases
