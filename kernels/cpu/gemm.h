// Matrix products through OpenBLAS.
//   matmul: C[batch] = A[batch] · B[batch] with numpy batch broadcasting. When B has no batch
//   (a weight), the batch of A is folded into its rows: one [batch·M, K] x [K, N] call.
//   gemm:   C = alpha · op(A) · op(B) + beta · C  (row-major, no broadcasting).
#pragma once

#include <cstdint>
#include <vector>

namespace oases::kernels {

// Row-major GEMM for float and double (OpenBLAS) and integers (loops).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

// Shapes as in ONNX MatMul after 1-D promotion: a [..., M, K], b [..., K, N], out [..., M, N].
template <class T>
void matmul(const T* a, const std::vector<int64_t>& sa, const T* b, const std::vector<int64_t>& sb, T* out,
            const std::vector<int64_t>& so, bool trans_a = false, bool trans_b = false);

// Number of threads OpenBLAS uses (set once per process or rank thread).
void set_blas_threads(int n);
int blas_threads();

}  // namespace oases::kernels
