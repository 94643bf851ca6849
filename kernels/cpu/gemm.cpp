#include "kernels/cpu/gemm.h"

#include "kernels/cpu/parallel.h"

#include <cblas.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace oases::kernels {

// Threading: OpenBLAS runs on one thread, always, and a large product is cut into column (or row)
// blocks that the kernels' pool (kernels/cpu/parallel.h) computes with one single-threaded BLAS
// call each. All parallel work of the CPU kernels thus runs on one pool: OpenBLAS's own pthreads,
// which busy-wait after every call, would compete with the pool for the same cores (on 2 cores
// this made the elementwise kernels between GEMMs several times slower). The blocks split the output, never the
// K sum, and the blocks depend only on the shapes and the thread count: results are the same from
// run to run.
namespace {

void single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

struct Tile {
  int64_t m0, m1, n0, n1;
};

// Column blocks (B is packed once in total, A once per block) unless N is too narrow; blocks are
// multiples of 16 columns / 8 rows, about one per thread, more when the product is huge.
std::vector<Tile> tiles_for(int64_t m, int64_t n, int64_t k, int threads) {
  double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (threads <= 1 || flops < 4e6 || in_parallel()) return {{0, m, 0, n}};
  // one block per thread; huge products get two per thread (evens out a thread that is
  // descheduled on a busy machine) when the blocks stay wide enough to amortise packing A again
  int64_t parts = threads;
  if (flops > 2e9 && n / (2 * threads) >= 2048) parts = 2 * threads;
  std::vector<Tile> t;
  if (n >= 64 * threads) {
    int64_t step = std::max<int64_t>(16, (n / parts + 15) / 16 * 16);
    for (int64_t j = 0; j < n; j += step) t.push_back({0, m, j, std::min(n, j + step)});
  } else {
    int64_t step = std::max<int64_t>(8, (m / parts + 7) / 8 * 8);
    for (int64_t i = 0; i < m; i += step) t.push_back({i, std::min(m, i + step), 0, n});
  }
  return t;
}

template <class T, class Call>
void tiled(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc,
           const GemmEpilogue<T>* epilogue, Call call) {
  single_threaded_blas();
  std::vector<Tile> tiles = tiles_for(m, n, k, num_threads());
  auto run = [&](const Tile& t) {
    const T* at = ta ? a + t.m0 : a + t.m0 * lda;
    const T* bt = tb ? b + t.n0 * ldb : b + t.n0;
    T* ct = c + t.m0 * ldc + t.n0;
    call(t.m1 - t.m0, t.n1 - t.n0, at, bt, ct);
    if (epilogue && *epilogue) (*epilogue)(ct, t.m1 - t.m0, t.n1 - t.n0, ldc, t.m0, t.n0);
  };
  if (tiles.size() == 1) {
    run(tiles[0]);
    return;
  }
  parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t i) { run(tiles[static_cast<size_t>(i)]); });
}

}  // namespace

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float beta, float* c, int64_t ldc, const GemmEpilogue<float>& epilogue) {
  if (m == 0 || n == 0) return;
  tiled<float>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, &epilogue,
               [&](int64_t mm, int64_t nn, const float* at, const float* bt, float* ct) {
                 cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(mm),
                             static_cast<blasint>(nn), static_cast<blasint>(k), alpha, at, static_cast<blasint>(lda), bt,
                             static_cast<blasint>(ldb), beta, ct, static_cast<blasint>(ldc));
               });
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
                  int64_t ldb, double beta, double* c, int64_t ldc, const GemmEpilogue<double>& epilogue) {
  if (m == 0 || n == 0) return;
  tiled<double>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, &epilogue,
                [&](int64_t mm, int64_t nn, const double* at, const double* bt, double* ct) {
                  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(mm),
                              static_cast<blasint>(nn), static_cast<blasint>(k), alpha, at, static_cast<blasint>(lda), bt,
                              static_cast<blasint>(ldb), beta, ct, static_cast<blasint>(ldc));
                });
}

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float beta, float* c, int64_t ldc) {
  gemm<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, GemmEpilogue<float>());
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b,
                  int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm<double>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, GemmEpilogue<double>());
}

template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
          int64_t ldc) {
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

template void gemm<int64_t>(bool, bool, int64_t, int64_t, int64_t, int64_t, const int64_t*, int64_t, const int64_t*, int64_t, int64_t,
                            int64_t*, int64_t);
template void gemm<int32_t>(bool, bool, int64_t, int64_t, int64_t, int32_t, const int32_t*, int64_t, const int32_t*, int64_t, int32_t,
                            int32_t*, int64_t);
template void gemm<uint32_t>(bool, bool, int64_t, int64_t, int64_t, uint32_t, const uint32_t*, int64_t, const uint32_t*, int64_t, uint32_t,
                             uint32_t*, int64_t);
template void gemm<uint64_t>(bool, bool, int64_t, int64_t, int64_t, uint64_t, const uint64_t*, int64_t, const uint64_t*, int64_t, uint64_t,
                             uint64_t*, int64_t);

template <class T>
void matmul(const T* a, const std::vector<int64_t>& sa, const T* b, const std::vector<int64_t>& sb, T* out, const std::vector<int64_t>& so,
            bool ta, bool tb, const GemmEpilogue<T>& epilogue) {
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
  // one product of mm rows whose first row is row `first` of the output viewed as [batch·M, N]
  auto one = [&](bool ta_, int64_t mm, const T* ap, const T* bp, T* cp, int64_t first) {
    GemmEpilogue<T> ep;
    if (epilogue) {
      ep = [&](T* c, int64_t rows, int64_t cols, int64_t ldc, int64_t r0, int64_t c0) { epilogue(c, rows, cols, ldc, first + r0, c0); };
    }
    if constexpr (std::is_floating_point_v<T>) {
      gemm<T>(ta_, tb, mm, n, k, T(1), ap, lda, bp, ldb, T(0), cp, n, ep);
    } else {
      gemm<T>(ta_, tb, mm, n, k, T(1), ap, lda, bp, ldb, T(0), cp, n);
      if (ep) ep(cp, mm, n, n, 0, 0);
    }
  };
  if (b_batch == 1 && !ta && a_batch == batch) {
    one(false, batch * m, a, b, out, 0);
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
  auto run = [&](int64_t bi) {
    int64_t rem = bi, oa = 0, ob = 0;
    for (int64_t d = nb - 1; d >= 0; --d) {
      int64_t idx = rem % bshape[d];
      rem /= bshape[d];
      oa += idx * sta[d];
      ob += idx * stb[d];
    }
    one(ta, m, a + oa, b + ob, out + bi * m * n, bi * m);
  };
  // many small products (attention scores of an unfused graph): one thread per product
  if (batch >= num_threads() && !in_parallel() && 2.0 * static_cast<double>(m * n * k) < 1e8) {
    parallel_for(batch, run);
    return;
  }
  for (int64_t bi = 0; bi < batch; ++bi) run(bi);
}

template void matmul<float>(const float*, const std::vector<int64_t>&, const float*, const std::vector<int64_t>&, float*,
                            const std::vector<int64_t>&, bool, bool, const GemmEpilogue<float>&);
template void matmul<double>(const double*, const std::vector<int64_t>&, const double*, const std::vector<int64_t>&, double*,
                             const std::vector<int64_t>&, bool, bool, const GemmEpilogue<double>&);
template void matmul<int64_t>(const int64_t*, const std::vector<int64_t>&, const int64_t*, const std::vector<int64_t>&, int64_t*,
                              const std::vector<int64_t>&, bool, bool, const GemmEpilogue<int64_t>&);
template void matmul<int32_t>(const int32_t*, const std::vector<int64_t>&, const int32_t*, const std::vector<int64_t>&, int32_t*,
                              const std::vector<int64_t>&, bool, bool, const GemmEpilogue<int32_t>&);
template void matmul<uint32_t>(const uint32_t*, const std::vector<int64_t>&, const uint32_t*, const std::vector<int64_t>&, uint32_t*,
                               const std::vector<int64_t>&, bool, bool, const GemmEpilogue<uint32_t>&);
template void matmul<uint64_t>(const uint64_t*, const std::vector<int64_t>&, const uint64_t*, const std::vector<int64_t>&, uint64_t*,
                               const std::vector<int64_t>&, bool, bool, const GemmEpilogue<uint64_t>&);

}  // namespace oases::kernels
