#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <stdexcept>

namespace oases::kernels {

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                  const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
          T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        T av = ta ? a[p * lda + i] : a[i * lda + p];
        T bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      c[i * ldc + j] = static_cast<T>(alpha * acc + (beta == T(0) ? T(0) : beta * c[i * ldc + j]));
    }
  }
}

template void gemm<int64_t>(bool, bool, int64_t, int64_t, int64_t, int64_t, const int64_t*, int64_t, const int64_t*,
                            int64_t, int64_t, int64_t*, int64_t);
template void gemm<int32_t>(bool, bool, int64_t, int64_t, int64_t, int32_t, const int32_t*, int64_t, const int32_t*,
                            int64_t, int32_t, int32_t*, int64_t);
template void gemm<uint32_t>(bool, bool, int64_t, int64_t, int64_t, uint32_t, const uint32_t*, int64_t, const uint32_t*,
                             int64_t, uint32_t, uint32_t*, int64_t);
template void gemm<uint64_t>(bool, bool, int64_t, int64_t, int64_t, uint64_t, const uint64_t*, int64_t, const uint64_t*,
                             int64_t, uint64_t, uint64_t*, int64_t);

template <class T>
void matmul(const T* a, const std::vector<int64_t>& sa, const T* b, const std::vector<int64_t>& sb, T* out,
            const std::vector<int64_t>& so, bool ta, bool tb) {
  // sa/sb are rank >= 2 here (the caller promotes 1-D operands).
  int64_t ra = static_cast<int64_t>(sa.size()), rb = static_cast<int64_t>(sb.size()), ro = static_cast<int64_t>(so.size());
  int64_t m = so[ro - 2], n = so[ro - 1];
  int64_t k = ta ? sa[ra - 2] : sa[ra - 1];
  int64_t lda = sa[ra - 1], ldb = sb[rb - 1];
  int64_t batch = 1;
  for (int64_t i = 0; i < ro - 2; ++i) batch *= so[i];
  int64_t b_batch = 1;
  for (int64_t i = 0; i < rb - 2; ++i) b_batch *= sb[i];
  int64_t a_batch = 1;
  for (int64_t i = 0; i < ra - 2; ++i) a_batch *= sa[i];
  if (b_batch == 1 && !ta && a_batch == batch) {
    gemm<T>(false, tb, batch * m, n, k, T(1), a, lda, b, ldb, T(0), out, n);
    return;
  }
  // general batch broadcasting: per output batch index, find a's and b's batch offsets
  std::vector<int64_t> bshape(so.begin(), so.end() - 2);
  int64_t nb = static_cast<int64_t>(bshape.size());
  auto batch_strides = [&](const std::vector<int64_t>& s) {
    std::vector<int64_t> st(static_cast<size_t>(nb), 0);
    int64_t r = static_cast<int64_t>(s.size()) - 2;
    int64_t acc = s[s.size() - 1] * s[s.size() - 2];
    for (int64_t i = 0; i < r; ++i) {
      int64_t si = r - 1 - i, oi = nb - 1 - i;
      st[oi] = s[si] == 1 ? 0 : acc;
      acc *= s[si];
    }
    return st;
  };
  std::vector<int64_t> sta = batch_strides(sa), stb = batch_strides(sb);
  for (int64_t bi = 0; bi < batch; ++bi) {
    int64_t rem = bi, oa = 0, ob = 0;
    for (int64_t d = nb - 1; d >= 0; --d) {
      int64_t idx = rem % bshape[d];
      rem /= bshape[d];
      oa += idx * sta[d];
      ob += idx * stb[d];
    }
    gemm<T>(ta, tb, m, n, k, T(1), a + oa, lda, b + ob, ldb, T(0), out + bi * m * n, n);
  }
}

template void matmul<float>(const float*, const std::vector<int64_t>&, const float*, const std::vector<int64_t>&, float*,
                            const std::vector<int64_t>&, bool, bool);
template void matmul<double>(const double*, const std::vector<int64_t>&, const double*, const std::vector<int64_t>&,
                             double*, const std::vector<int64_t>&, bool, bool);
template void matmul<int64_t>(const int64_t*, const std::vector<int64_t>&, const int64_t*, const std::vector<int64_t>&,
                              int64_t*, const std::vector<int64_t>&, bool, bool);
template void matmul<int32_t>(const int32_t*, const std::vector<int64_t>&, const int32_t*, const std::vector<int64_t>&,
                              int32_t*, const std::vector<int64_t>&, bool, bool);
template void matmul<uint32_t>(const uint32_t*, const std::vector<int64_t>&, const uint32_t*, const std::vector<int64_t>&,
                               uint32_t*, const std::vector<int64_t>&, bool, bool);
template void matmul<uint64_t>(const uint64_t*, const std::vector<int64_t>&, const uint64_t*, const std::vector<int64_t>&,
                               uint64_t*, const std::vector<int64_t>&, bool, bool);

void set_blas_threads(int n) { openblas_set_num_threads(std::max(1, n)); }
int blas_threads() { return openblas_get_num_threads(); }

}  // namespace oases::kernels
