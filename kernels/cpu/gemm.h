// Matrix products through OpenBLAS.
//   matmul: C[batch] = A[batch] · B[batch] with numpy batch broadcasting. When B has no batch
//   (a weight), the batch of A is folded into its rows: one [batch·M, K] x [K, N] call.
//   gemm:   C = alpha · op(A) · op(B) + beta · C  (row-major, no broadcasting). Large products run
//           as column (or row) blocks on the kernels' threads (kernels/cpu/parallel.h), each one
//           single-threaded OpenBLAS call.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oases::kernels {

// Row-major GEMM for float and double (OpenBLAS) and integers (loops).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
          T* c, int64_t ldc);
// float and double go to OpenBLAS (gemm.cpp specialises them; declared here so no file that sees
// the integer loops' template instantiates them for floats)
template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float beta, float* c, int64_t ldc);
template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
                  int64_t ldb, double beta, double* c, int64_t ldc);

// Called on each finished block of C (rows x cols at c, row stride ldc; row0, col0 its place in the
// whole output) by the thread that computed it, while the block is still in cache: bias,
// activation, residual, ...
template <class T>
using GemmEpilogue = std::function<void(T* c, int64_t rows, int64_t cols, int64_t ldc, int64_t row0, int64_t col0)>;
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
          T* c, int64_t ldc, const GemmEpilogue<T>& epilogue);  // float and double

// Shapes as in ONNX MatMul after 1-D promotion: a [..., M, K], b [..., K, N], out [..., M, N].
// The epilogue (if any) runs on every finished block of the output viewed as [rows, N].
template <class T>
void matmul(const T* a, const std::vector<int64_t>& sa, const T* b, const std::vector<int64_t>& sb, T* out, const std::vector<int64_t>& so,
            bool trans_a = false, bool trans_b = false, const GemmEpilogue<T>& epilogue = GemmEpilogue<T>());

}  // namespace oases::kernels
