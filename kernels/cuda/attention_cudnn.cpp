// cuDNN fused attention: NOT IMPLEMENTED. A stub that never applies, so the glue always takes the
// project's own kernels (attention.cu). Building the SDPA graph through cuDNN's backend API needs
// a GPU to finalise and check an execution plan, which this project's machines do not have; an
// unchecked one would be worse than none. docs/GPU.md says so.
#include "kernels/cuda/attention.h"

namespace oases::cuda {

bool cudnn_attention_applies(const AttentionDesc&, Elem) {
  return false;
}
bool cudnn_attention_forward(void*, const AttentionDesc&, Elem, const void*, const void*, const void*, void*, float*, cudaStream_t) {
  return false;
}
bool cudnn_attention_backward(void*, const AttentionDesc&, Elem, const void*, const void*, const void*, const void*, const void*,
                              const float*, void*, void*, void*, cudaStream_t) {
  return false;
}

}  // namespace oases::cuda
