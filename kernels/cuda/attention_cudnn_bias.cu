// The additive mask as cuDNN's attention bias (CudnnBias::kConverted in attention_rules.h): the
// fp32 mask, read through its broadcast strides, written dense [Bm, Hm, Tq, Tk] in the q/k/v type
// with rows padded to 16 bytes. Finite values saturate to the type's largest magnitude instead of
// rounding to infinity, so a "masked" value such as float32's lowest stays a large finite number
// (a row masked everywhere still attends uniformly, as on the CPU); ±inf and NaN pass through.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

namespace oases::cuda {

namespace {

struct BiasCopy {
  int64_t dims[4];    // Bm, Hm, Tq, Tk
  int64_t out_ld[3];  // output strides of dims 0..2 (dim 3 contiguous)
  int64_t in_st[4];   // mask strides (0 where broadcast)
  float limit;        // the largest finite value of the output type
};

template <class T>
__global__ void bias_convert_kernel(BiasCopy c, const float* mask, T* out) {
  const int64_t n = c.dims[0] * c.dims[1] * c.dims[2] * c.dims[3];
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t j = e % c.dims[3], r = e / c.dims[3];
    int64_t i = r % c.dims[2];
    r /= c.dims[2];
    int64_t h = r % c.dims[1], b = r / c.dims[1];
    float x = mask[b * c.in_st[0] + h * c.in_st[1] + i * c.in_st[2] + j * c.in_st[3]];
    if (isfinite(x)) x = fminf(fmaxf(x, -c.limit), c.limit);
    out[b * c.out_ld[0] + h * c.out_ld[1] + i * c.out_ld[2] + j] = from_float<T>(x);
  }
}

}  // namespace

void attention_bias_convert(Elem t, const float* mask, const int64_t mask_strides[4], const CudnnBiasLayout& l, void* out, cudaStream_t s) {
  BiasCopy c;
  for (int i = 0; i < 4; ++i) {
    c.dims[i] = l.dims[i];
    c.in_st[i] = l.dims[i] == 1 ? 0 : mask_strides[i];
  }
  for (int i = 0; i < 3; ++i) c.out_ld[i] = l.strides[i];
  const int64_t n = l.dims[0] * l.dims[1] * l.dims[2] * l.dims[3];
  if (t == Elem::kBF16) {
    c.limit = 3.38953139e38f;  // 0x7f7f, bfloat16's largest finite value
    bias_convert_kernel<__nv_bfloat16><<<grid_for(n, kThreads), kThreads, 0, s>>>(c, mask, static_cast<__nv_bfloat16*>(out));
  } else if (t == Elem::kF16) {
    c.limit = 65504.f;
    bias_convert_kernel<__half><<<grid_for(n, kThreads), kThreads, 0, s>>>(c, mask, static_cast<__half*>(out));
  } else {
    throw std::runtime_error(std::string("[attention] a cuDNN bias in ") + elem_name(t) + " (float16 or bfloat16 only)");
  }
  OASES_CUDA_CHECK_LAUNCH("bias_convert_kernel");
}

}  // namespace oases::cuda
