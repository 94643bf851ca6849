// The CPU kernels' performance machinery: vectorised math against the C library (and the 8-lane
// versions against their scalar twins), the thread pool (every item once, nesting, exceptions,
// concurrent callers), GEMM blocks on the pool (deterministic, right) and the epilogue's block
// coordinates.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace oases::kernels {
namespace {

std::vector<float> grid(float lo, float hi, int n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  return x;
}

// f (the scalar twin) and, through kernels compiled with AVX2, the 8-lane version against a
// double-precision reference: |y − ref| ≤ abs_tol + rel_tol·|ref|, and the two bit-identical
template <class F1, class Ref>
void check(const char* name, const std::vector<float>& x, const std::vector<float>& y, F1 f1, Ref ref, double rel_tol, double abs_tol) {
  for (size_t i = 0; i < x.size(); ++i) {
    double r = ref(static_cast<double>(x[i]));
    ASSERT_LE(std::fabs(f1(x[i]) - r), abs_tol + rel_tol * std::fabs(r)) << name << "(" << x[i] << ") = " << f1(x[i]) << ", want " << r;
    if (!y.empty()) {
      ASSERT_EQ(y[i], f1(x[i])) << name << ": vector and scalar differ at " << x[i];
    }
  }
}

TEST(VecMath, ExpTanhGeluMatchTheCLibrary) {
  check(
      "exp", grid(-87.f, 88.f, 100001), {}, vec::exp1, [](double v) { return std::exp(v); }, 3e-7, 0);
  check(
      "tanh", grid(-12.f, 12.f, 100001), {}, vec::tanh1, [](double v) { return std::tanh(v); }, 3e-7, 1e-30);
  std::vector<float> x = grid(-8.f, 8.f, 100001), y(x.size()), ones(x.size(), 1.f);
  const int64_t n = static_cast<int64_t>(x.size());
  activation<float>(Activation::kGeluTanh, x.data(), y.data(), n);
  check(
      "gelu_tanh", x, y, vec::gelu_tanh1,
      [](double v) { return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }, 1e-6, 1e-9);
  activation<float>(Activation::kGeluErf, x.data(), y.data(), n);
  check(
      "gelu_erf", x, y, vec::gelu_erf1, [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }, 5e-6, 1e-9);
  activation_grad<float>(Activation::kGeluTanh, ones.data(), x.data(), y.data(), n);
  check(
      "gelu_tanh'", x, y, vec::gelu_tanh_grad1,
      [](double v) {
        double c = 0.7978845608028654, k = 0.044715, t = std::tanh(c * (v + k * v * v * v));
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * k * v * v);
      },
      1e-6, 1e-6);
  activation_grad<float>(Activation::kGeluErf, ones.data(), x.data(), y.data(), n);
  check(
      "gelu_erf'", x, y, vec::gelu_erf_grad1,
      [](double v) { return 0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI); }, 5e-6, 1e-6);
}

TEST(VecMath, SpecialValues) {
  EXPECT_TRUE(std::isnan(vec::exp1(NAN)));
  EXPECT_EQ(vec::exp1(INFINITY), INFINITY);
  EXPECT_EQ(vec::exp1(-INFINITY), 0.f);
  EXPECT_EQ(vec::exp1(89.f), INFINITY);
  EXPECT_GT(vec::exp1(88.7f), 3e38f);
  EXPECT_TRUE(std::isnan(vec::tanh1(NAN)));
  EXPECT_EQ(vec::tanh1(100.f), 1.f);
  EXPECT_EQ(vec::tanh1(-100.f), -1.f);
  EXPECT_EQ(vec::gelu_tanh1(-100.f), -0.f);
  EXPECT_EQ(vec::gelu_tanh1(100.f), 100.f);
}

TEST(ParallelFor, RunsEveryItemOnce) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "threads " << threads << ", " << n << " items";
    }
  }
  set_num_threads(0);
}

TEST(ParallelFor, NestedLoopsRunOnTheirThread) {
  set_num_threads(2);
  std::vector<std::atomic<int>> hits(64);
  parallel_for(8, [&](int64_t i) {
    EXPECT_TRUE(in_parallel());
    parallel_for(8, [&](int64_t j) { hits[static_cast<size_t>(i * 8 + j)]++; });
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_FALSE(in_parallel());
  set_num_threads(0);
}

TEST(ParallelFor, AnItemsExceptionReachesTheCaller) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100,
                            [](int64_t i) {
                              if (i == 37) throw std::runtime_error("item 37");
                            }),
               std::runtime_error);
  // the pool still works afterwards
  std::atomic<int64_t> sum{0};
  parallel_for(100, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
  set_num_threads(0);
}

TEST(ParallelFor, ConcurrentCallersEachGetTheirItems) {
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(4, 0);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      set_num_threads(2);
      for (int rep = 0; rep < 50; ++rep) {
        std::atomic<int64_t> s{0};
        parallel_for(64, [&](int64_t i) { s += i; });
        sums[static_cast<size_t>(c)] += s.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 50 * 2016);
}

// Bit for bit from run to run at a given thread count (resumed training relies on it); across
// thread counts the blocks differ and so may the last bits (OpenBLAS's kernels are not
// independent of the block shape).
TEST(Gemm, BlocksAreDeterministicAndRight) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto [m, n, k, ta, tb] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool, bool>>{
           {512, 700, 96, false, false}, {96, 4500, 64, false, true}, {300, 40, 200, true, false}, {257, 129, 33, true, true}}) {
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<float> c(static_cast<size_t>(m * n)), again(c.size());
      gemm<float>(ta, tb, m, n, k, 1.f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.f, c.data(), n);
      gemm<float>(ta, tb, m, n, k, 1.f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.f, again.data(), n);
      ASSERT_EQ(c, again) << m << "x" << n << "x" << k << " with " << threads << " threads";
      for (int64_t i = 0; i < m; i += 7) {
        for (int64_t j = 0; j < n; j += 11) {
          double acc = 0;
          for (int64_t p = 0; p < k; ++p) acc += double(ta ? a[p * m + i] : a[i * k + p]) * double(tb ? b[j * k + p] : b[p * n + j]);
          ASSERT_NEAR(c[i * n + j], acc, 1e-4) << m << "x" << n << "x" << k << " with " << threads << " threads";
        }
      }
    }
  }
  set_num_threads(0);
}

TEST(Gemm, EpilogueSeesEveryBlockOnceWithItsPlace) {
  set_num_threads(2);
  const int64_t m = 256, n = 8192, k = 64;
  std::vector<float> a(m * k, 1.f), b(k * n, 1.f), c(m * n, 0.f);
  std::vector<std::atomic<int>> seen(static_cast<size_t>(m * n));
  GemmEpilogue<float> ep = [&](float* blk, int64_t rows, int64_t cols, int64_t ldc, int64_t r0, int64_t c0) {
    EXPECT_EQ(blk, c.data() + r0 * n + c0);
    EXPECT_EQ(ldc, n);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) seen[static_cast<size_t>((r0 + i) * n + c0 + j)]++;
    }
  };
  gemm<float>(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n, ep);
  for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  set_num_threads(0);
}

TEST(Activation, BiasActivationAndResidual) {
  std::vector<float> c{1, -2, 3, -4, 5, -6}, bias{0.5f, 0.25f, -1}, res{1, 1, 1, 2, 2, 2};
  std::vector<float> plain = c;
  bias_activation<float>(plain.data(), 2, 3, 3, bias.data(), Activation::kNone, res.data(), 3);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(plain[i], (c[i] + bias[i % 3]) + res[i]);
  std::vector<float> relu = c;
  bias_activation<float>(relu.data(), 2, 3, 3, bias.data(), Activation::kRelu);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(relu[i], std::max(0.f, c[i] + bias[i % 3]));
}

}  // namespace
}  // namespace oases::kernels
