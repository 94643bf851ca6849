// The padded-product plan of the CUDA glue (kernels/cuda/gemm_plan.h), checked on the CPU: which
// operands are copied, their padded leading dimensions, the blocks of rows and the scratch. The
// GPU suite runs the plans against the CPU's products (tests/gpu/cuda_kernels_test.cpp).
#include <gtest/gtest.h>

#include "kernels/cuda/gemm_plan.h"

namespace oases::cuda {
namespace {

constexpr uintptr_t kBase = 0x10000;  // an aligned address
constexpr size_t kLots = size_t(1) << 40;

GemmDesc desc(int64_t m, int64_t n, int64_t k, bool ta = false, bool tb = false) {
  GemmDesc d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_a = ta;
  d.trans_b = tb;
  d.lda = ta ? m : k;
  d.ldb = tb ? k : n;
  d.ldc = n;
  return d;
}

TEST(PaddedGemmPlan, AlignedRowsAndSizesAreLeftAlone) {
  EXPECT_FALSE(plan_padded_gemm(2, desc(8192, 50304, 1024), kBase, kBase, kBase, kLots).used());
  // fp32 rows of 4 elements are 16 bytes
  EXPECT_FALSE(plan_padded_gemm(4, desc(8192, 4100, 1024), kBase, kBase, kBase, kLots).used());
}

TEST(PaddedGemmPlan, SmallProductsAndOtherShapesAreLeftAlone) {
  EXPECT_FALSE(plan_padded_gemm(2, desc(64, 50257, 64), kBase, kBase, kBase, kLots).used());  // 2^28 multiply-adds
  GemmDesc d = desc(8192, 50257, 1024);
  d.batch = 2;
  EXPECT_FALSE(plan_padded_gemm(2, d, kBase, kBase, kBase, kLots).used());
  d = desc(8192, 50257, 1024);
  d.beta = 1.f;
  EXPECT_FALSE(plan_padded_gemm(2, d, kBase, kBase, kBase, kLots).used());
  EXPECT_FALSE(plan_padded_gemm(8, desc(8192, 50257, 1024), kBase, kBase, kBase, kLots).used());  // fp64
}

// logits = x · wᵀ of a 50257-token vocabulary in bf16: the result's rows are misaligned and its
// column size is odd, so the weight is copied with zero rows up to 50264 and the result is
// computed 50264 wide in scratch, in blocks
TEST(PaddedGemmPlan, LogitsPadTheVocabularyAndTheResult) {
  PaddedGemm p = plan_padded_gemm(2, desc(8192, 50257, 1024, false, true), kBase, kBase, kBase, size_t(384) << 20);
  ASSERT_TRUE(p.used());
  EXPECT_FALSE(p.pad_a);
  EXPECT_TRUE(p.pad_b);
  EXPECT_TRUE(p.pad_c);
  EXPECT_EQ(p.k, 1024);
  EXPECT_EQ(p.n, 50264);  // a multiple of 8 elements
  EXPECT_EQ(p.ldb, 1024);
  EXPECT_EQ(p.bytes_b, size_t(50264) * 1024 * 2);
  EXPECT_EQ(p.ldc, 50304);  // 100608-byte rows: 128-byte multiples
  EXPECT_EQ(p.block, 2752);  // three even blocks in what the weight leaves of 384 MiB
  EXPECT_EQ(p.bytes_c, size_t(2752) * 50304 * 2);
  EXPECT_EQ(p.scratch_bytes(), p.bytes_b + p.bytes_c);
  EXPECT_LE(p.scratch_bytes(), size_t(384) << 20);
  // all of it in one block when the scratch allows
  EXPECT_EQ(plan_padded_gemm(2, desc(8192, 50257, 1024, false, true), kBase, kBase, kBase, kLots).block, 8192);
  // an aligned leading dimension does not help an odd column size
  GemmDesc d = desc(8192, 50257, 1024, false, true);
  d.ldc = 50304;
  EXPECT_TRUE(plan_padded_gemm(2, d, kBase, kBase, kBase, kLots).pad_c);
}

// the input gradient dlogits · w: the inner size 50257 is padded with zeros in both operands
TEST(PaddedGemmPlan, InputGradientPadsTheInnerSize) {
  PaddedGemm p = plan_padded_gemm(2, desc(8192, 1024, 50257), kBase, kBase, kBase, size_t(256) << 20);
  ASSERT_TRUE(p.used());
  EXPECT_TRUE(p.pad_a);
  EXPECT_TRUE(p.pad_b);
  EXPECT_FALSE(p.pad_c);
  EXPECT_EQ(p.k, 50264);
  EXPECT_EQ(p.n, 1024);
  EXPECT_EQ(p.lda, 50304);
  EXPECT_EQ(p.ldb, 1024);
  EXPECT_EQ(p.bytes_b, size_t(50264) * 1024 * 2);
  EXPECT_EQ(p.block, 1408);  // six even blocks
  EXPECT_EQ(p.bytes_a, size_t(1408) * 50304 * 2);
  EXPECT_LE(p.scratch_bytes(), size_t(256) << 20);
}

// the weight gradient dlogitsᵀ · x: a transposed, so a block is columns of the stored a
TEST(PaddedGemmPlan, WeightGradientPadsTransposedAByColumns) {
  PaddedGemm p = plan_padded_gemm(2, desc(50257, 1024, 8192, true, false), kBase, kBase, kBase, size_t(256) << 20);
  ASSERT_TRUE(p.used());
  EXPECT_TRUE(p.pad_a);
  EXPECT_FALSE(p.pad_b);
  EXPECT_FALSE(p.pad_c);
  EXPECT_EQ(p.k, 8192);
  EXPECT_EQ(p.n, 1024);
  EXPECT_EQ(p.block % 64, 0);
  EXPECT_EQ(p.lda, p.block);  // the block's columns, a 64-multiple, are the padded row
  EXPECT_EQ(p.bytes_a, size_t(8192) * static_cast<size_t>(p.lda) * 2);
  EXPECT_LE(p.scratch_bytes(), size_t(256) << 20);
  EXPECT_GE(p.block * ((50257 + p.block - 1) / p.block), 50257);
}

// an untied head [k, n] not transposed: b and the result misaligned; b whole, the result in blocks
TEST(PaddedGemmPlan, MisalignedWeightIsCopiedWhole) {
  PaddedGemm p = plan_padded_gemm(4, desc(4096, 1027, 1024), kBase, kBase, kBase, size_t(8) << 20);
  ASSERT_TRUE(p.used());
  EXPECT_TRUE(p.pad_b);
  EXPECT_TRUE(p.pad_c);
  EXPECT_EQ(p.n, 1028);
  EXPECT_EQ(p.ldb, 1056);
  EXPECT_EQ(p.bytes_b, size_t(1024) * 1056 * 4);
  EXPECT_EQ(p.ldc, 1056);
  EXPECT_LT(p.block, 4096);
  EXPECT_EQ(p.block % 64, 0);
  EXPECT_LE(p.scratch_bytes(), size_t(8) << 20);
}

TEST(PaddedGemmPlan, MisalignedAddressesCount) {
  EXPECT_TRUE(plan_padded_gemm(2, desc(8192, 1024, 1024), kBase + 2, kBase, kBase, kLots).pad_a);
  EXPECT_TRUE(plan_padded_gemm(2, desc(8192, 1024, 1024), kBase, kBase, kBase + 8, kLots).pad_c);
}

TEST(PaddedGemmPlan, TooLittleScratchLeavesItAlone) {
  // blocks under 256 rows would not pay
  EXPECT_FALSE(plan_padded_gemm(2, desc(8192, 50257, 1024, false, true), kBase, kBase, kBase, size_t(16) << 20).used());
  // b alone over the limit
  EXPECT_FALSE(plan_padded_gemm(4, desc(4096, 1027, 1024), kBase, kBase, kBase, size_t(1) << 20).used());
}

}  // namespace
}  // namespace oases::cuda
