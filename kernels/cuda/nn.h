// Row kernels: softmax, LayerNorm, RMSNorm, forward and backward side by side (math in softmax.cu
// and norm.cu). A tensor is [outer, n, inner] around the normalised axis; statistics are fp32
// whatever the storage type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/check.h"

namespace oases::cuda {

// y = softmax(x) (log: log_softmax) over the middle dim of [outer, n, inner].
void softmax_forward(bool log, Elem t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s);
// dx = y ∘ (dy − Σ dy∘y) ; log form: dx = dy − exp(y)·Σ dy.
void softmax_backward(bool log, Elem t, const void* dy, const void* y, void* dx, int64_t outer, int64_t n, int64_t inner, cudaStream_t s);

// Rows of length n. scale (and bias, may be null) have n elements; mean/rstd (may be null) get fp32
// per-row statistics.
void layernorm_forward(Elem t, const void* x, const void* scale, const void* bias, void* y, float* mean, float* rstd, int64_t rows,
                       int64_t n, float eps, cudaStream_t s);
void rmsnorm_forward(Elem t, const void* x, const void* scale, void* y, float* rstd, int64_t rows, int64_t n, float eps, cudaStream_t s);

// Backward; dscale/dbias may be null. `scratch` holds norm_backward_scratch_floats(rows, n) floats
// for the deterministic two-stage column sums of dscale and dbias.
size_t norm_backward_scratch_floats(int64_t rows, int64_t n);
void layernorm_backward(Elem t, const void* dy, const void* x, const void* scale, const float* mean, const float* rstd, void* dx,
                        void* dscale, void* dbias, int64_t rows, int64_t n, float* scratch, cudaStream_t s);
void rmsnorm_backward(Elem t, const void* dy, const void* x, const void* scale, const float* rstd, void* dx, void* dscale, int64_t rows,
                      int64_t n, float* scratch, cudaStream_t s);

}  // namespace oases::cuda
