// Scaled-dot-product attention: batched products through cuBLAS (attention_gemm.cu, the path runs
// take) and the project's own fused kernels (any float type, masks, grouped query heads, causal;
// math in attention.cu). A hook for cuDNN's fused flash attention sits beside them
// (attention_cudnn.cpp) but is not implemented yet: it never applies (docs/GPU.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"

namespace oases::cuda {

// q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, H, Tq, Dv], lse [B, H, Tq] (fp32).
// The mask (fp32 additive, or bool keep-where-1) is read through element strides over [B, H, Tq, Tk]
// (0 where broadcast). Causal: key j > query i + (Tk − Tq) is masked.
struct AttentionDesc {
  int64_t batch = 0, heads = 0, kv_heads = 0, tq = 0, tk = 0, d = 0, dv = 0;
  bool causal = false;
  float scale = 1.f;
  const void* mask = nullptr;
  bool mask_is_bool = false;
  int64_t mask_strides[4] = {0, 0, 0, 0};
};

// Own kernels. Forward writes out and lse (lse may be null). Backward writes dq, dk, dv (dk/dv
// summed over the query heads sharing a key/value head); `scratch` holds attention_scratch_floats()
// floats.
void attention_forward(const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out, float* lse, cudaStream_t s);
size_t attention_scratch_floats(const AttentionDesc& a);
void attention_backward(const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v, const void* out,
                        const float* lse, void* dq, void* dk, void* dv, float* scratch, cudaStream_t s);

// Batched-product attention (attention_gemm.cu): the score matrices through cuBLAS on the tensor
// cores, softmax and its gradient in row kernels; fp32, fp16 and bf16. The path runs take where
// it applies (docs/GPU.md); `scratch` holds attention_gemm_scratch_bytes() bytes (slices of the
// (batch, key/value head) pairs keep it under 1 GiB). The own kernels above remain for the shapes
// it does not take (fp64, one head's score matrix over the budget) and when OASES_CUDA_ATTENTION=own.
bool attention_gemm_applies(const AttentionDesc& a, Elem t);
size_t attention_gemm_scratch_bytes(const AttentionDesc& a, Elem t, bool backward);
void attention_gemm_forward(BlasHandles& h, const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out, float* lse,
                            void* scratch);
void attention_gemm_backward(BlasHandles& h, const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const float* lse, void* dq, void* dk, void* dv, void* scratch);

// cuDNN fused attention (attention_cudnn.cpp), NOT IMPLEMENTED: `applies` returns false for every
// shape. The contract an implementation must keep: `applies` says whether the shape and type are
// ones cuDNN's flash-attention engine takes (fp16/bf16, no explicit mask, head dim a multiple of 8
// up to 128); the calls return false (and leave the outputs untouched)
// when cuDNN refuses the graph at run time, so the caller falls back to the own kernels. The lse
// cuDNN writes ("stats") is the same log-sum-exp the own kernels use, so either backward pass can
// follow either forward pass. `handle` is a cudnnHandle_t bound to the stream.
bool cudnn_attention_applies(const AttentionDesc& a, Elem t);
bool cudnn_attention_forward(void* handle, const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out,
                             float* lse, cudaStream_t s);
bool cudnn_attention_backward(void* handle, const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, void* dq, void* dk, void* dv, cudaStream_t s);

}  // namespace oases::cuda
