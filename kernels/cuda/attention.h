// Scaled-dot-product attention on the GPU, three ways: cuDNN's fused flash attention through the
// cuDNN frontend's graph API (attention_cudnn.cpp: fp16/bf16, taken first where it applies),
// batched products through cuBLAS (attention_gemm.cu: fp32, fp16, bf16) and the project's own
// fused kernels (attention.cu: any float type, every mask). All three write the same outputs,
// including the log-sum-exp, so any backward pass can follow any forward pass. The contract
// (AttentionDesc, layouts, lse, causal limit) and the cuDNN path's host-side rules are in
// attention_rules.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/cuda/attention_rules.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"

namespace oases::cuda {

// Own kernels. Forward writes out and lse (lse may be null). Backward writes dq, dk, dv (dk/dv
// summed over the query heads sharing a key/value head); `scratch` holds attention_scratch_floats()
// floats.
void attention_forward(const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out, float* lse, cudaStream_t s);
size_t attention_scratch_floats(const AttentionDesc& a);
void attention_backward(const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v, const void* out,
                        const float* lse, void* dq, void* dk, void* dv, float* scratch, cudaStream_t s);

// dst[b, h, t, e] = src[b, h, t, e] for a [batch, heads, time, width] tensor, each side through its
// (batch, head, time) element strides with e contiguous: a strided call's tensors as contiguous
// copies for the own and batched-product kernels, and their results back.
void attention_copy_heads(Elem t, const void* src, const int64_t src_strides[3], void* dst, const int64_t dst_strides[3], int64_t batch,
                          int64_t heads, int64_t time, int64_t width, cudaStream_t s);

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

// cuDNN fused attention (attention_cudnn.cpp). The calls return false, with the reason in *why and
// the outputs untouched or to be overwritten, whenever cuDNN does not run: the shape or type is
// refused (cudnn_attention_refusal), the build has no frontend ("built without the cuDNN
// frontend"), a pointer is not 16-byte aligned, or the frontend fails to validate, build, plan or
// execute the graph. The caller then takes the batched-product path. Plans are built once per
// CudnnPlanKey and cached per thread (a failure too, so a refused shape is not rebuilt); the
// workspace and a converted bias come from `scratch` (stream-ordered, valid for this launch).
// On success *why is empty, or says that the mask went to cuDNN as a converted copy (and why not
// as it lies). `handle` is a cudnnHandle_t; it is bound to `s`. lse may be null in the forward pass (no
// statistics: inference). cuDNN's backward pass sums dq over keys with atomics, so its last bits
// may differ between runs; dk/dv are summed over the query heads sharing a key/value head.
using ScratchFn = std::function<void*(size_t bytes)>;
bool cudnn_attention_forward(void* handle, const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out,
                             float* lse, const ScratchFn& scratch, cudaStream_t s, std::string* why);
bool cudnn_attention_backward(void* handle, const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, void* dq, void* dk, void* dv, const ScratchFn& scratch, cudaStream_t s,
                              std::string* why);
// Calls that ran on cuDNN since the process started (tests read it to prove cuDNN ran).
struct CudnnAttentionCalls {
  uint64_t forward = 0, backward = 0;
};
CudnnAttentionCalls cudnn_attention_calls();
// The cuDNN frontend version the build has ("1.32.0"), or "" when built without it.
const char* cudnn_frontend_version();

// The mask as cuDNN's bias in type t (fp16/bf16), layout l (kConverted): out[b, h, i, j] =
// mask[b·ms0 + h·ms1 + i·ms2 + j·ms3] with finite values saturated to t's range, ±inf kept.
void attention_bias_convert(Elem t, const float* mask, const int64_t mask_strides[4], const CudnnBiasLayout& l, void* out, cudaStream_t s);

}  // namespace oases::cuda
