// Matrix products through cuBLASLt (single matrices, with a workspace and the library's heuristic)
// and cuBLAS (strided batches, stride 0 for a broadcast operand). fp32 computes in fp32 (TF32 only
// when asked), fp16/bf16 store 16 bits and accumulate in fp32, fp64 in fp64.
//   row-major  C[b] = alpha · op(A[b]) · op(B[b]) + beta · C[b]
// is issued as the column-major product Cᵀ = op(B)ᵀ op(A)ᵀ, so no operand is copied.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm_plan.h"

namespace oases::cuda {

// cuBLAS and cuBLASLt handles and the Lt workspace, bound to one stream (RAII; not copyable).
class BlasHandles {
 public:
  explicit BlasHandles(cudaStream_t s, size_t workspace_bytes = size_t(32) << 20, bool allow_tf32 = false);
  ~BlasHandles();
  BlasHandles(const BlasHandles&) = delete;
  BlasHandles& operator=(const BlasHandles&) = delete;
  cudaStream_t stream() const { return stream_; }
  void* blas() const { return blas_; }
  void* lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  bool allow_tf32() const { return allow_tf32_; }

 private:
  cudaStream_t stream_ = nullptr;
  void* blas_ = nullptr;  // cublasHandle_t
  void* lt_ = nullptr;    // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool allow_tf32_ = false;
};

void gemm(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* c);
// One matrix (batch 1, beta 0) through cuBLASLt with an epilogue on the result: bias [n] added to
// every row, then ReLU or GELU (tanh form, cuBLASLt's). False (nothing written) when cuBLASLt has
// no algorithm for it; fp32, fp16 and bf16 (the bias of the result's type).
enum class GemmEpilogue { kBias, kBiasRelu, kBiasGeluTanh };
bool gemm_epilogue(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* c, const void* bias, GemmEpilogue e);
// The GELU's epilogues of a training step (tanh form, cuBLASLt's), on one matrix as above:
//   gemm_gelu_aux:  y = GELU(p), p = op(A)·op(B) [+ bias] written to `preact` too (GELU_AUX[_BIAS]);
//   gemm_gelu_grad: dx = GELU'(x) ⊙ op(A)·op(B), and with `dbias` dx's sums over the rows
//                   (DGELU[_BGRAD]: the bias gradient of the product that made x).
// preact and x are laid out as the result (ldc = n), n a multiple of 8; the vectors of the result's
// type. False (nothing written) when the case does not apply or cuBLASLt has no algorithm for it.
bool gemm_gelu_aux(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* y, const void* bias, void* preact);
bool gemm_gelu_grad(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* dx, const void* x, void* dbias);
// Calls of the two above that ran through cuBLASLt since the process started (the GPU tests check).
int64_t gelu_epilogue_calls();
// The same product with operands of type `ab` (fp32, fp16 or bf16) and a result of type `ct`
// (e.g. bf16 operands, fp32 scores), accumulated in fp32 (cuBLAS strided batches).
// The product under a padded plan (gemm_plan.h plan_padded_gemm, p.used()): the misaligned
// operands copied into `scratch` (p.scratch_bytes(), 16-byte aligned) with padded rows, the result
// computed in blocks of p.block rows and, when misaligned, copied out of scratch block by block.
void gemm_padded(BlasHandles& h, Elem t, const GemmDesc& d, const PaddedGemm& p, const void* a, const void* b, void* c, void* scratch);
// Products run through gemm_padded since the process started (the GPU tests check the path ran).
int64_t padded_gemm_calls();
void gemm_ex(BlasHandles& h, Elem ab, Elem ct, const GemmDesc& d, const void* a, const void* b, void* c);

}  // namespace oases::cuda
