// cuDNN fused attention: placeholder until the backend-graph version lands (see docs/GPU.md).
#include "kernels/cuda/attention.h"

namespace oases::cuda {

bool cudnn_attention_applies(const AttentionDesc&, Elem) { return false; }
bool cudnn_attention_forward(void*, const AttentionDesc&, Elem, const void*, const void*, const void*, void*, float*, cudaStream_t) {
  return false;
}
bool cudnn_attention_backward(void*, const AttentionDesc&, Elem, const void*, const void*, const void*, const void*, const void*,
                              const float*, void*, void*, void*, cudaStream_t) {
  return false;
}

}  // namespace oases::cuda
