// The shape of a matrix product (GemmDesc) and the plan for running one whose rows are not 16-byte
// aligned through row-padded copies. Plain C++: the CUDA glue uses it, the unit tests check it here.
//
// cuBLASLt's fast Hopper kernels load and store through the tensor-memory accelerator, which needs
// every row of every operand to start on a 16-byte boundary. An odd leading dimension (the logits
// of a 50257-token vocabulary in bf16: rows of 100514 bytes) leaves only slow kernels: on one H100
// the language-model head's three products ran at 95-150 TFLOP/s (docs/gpu-runs/2026-11-26-5dffef1-profile.txt). Copying the misaligned operands into scratch with padded rows and
// writing a misaligned result through padded scratch costs a few passes over memory and lets the
// product run at full speed; blocks of the result's rows bound the scratch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace oases::cuda {

struct GemmDesc {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.f, beta = 0.f;
};

// How a single product runs padded: which operands go through scratch, the product's padded
// inner and column sizes, the padded leading dimensions, and the rows of the result per block.
struct PaddedGemm {
  bool pad_a = false, pad_b = false, pad_c = false;
  int64_t k = 0, n = 0;               // the product's sizes in scratch (the pads are zeros)
  int64_t lda = 0, ldb = 0, ldc = 0;  // leading dimensions of the padded copies (of a block for a and c)
  int64_t block = 0;                  // rows of the result per block (m when one block)
  size_t bytes_b = 0, bytes_a = 0, bytes_c = 0;  // scratch of each copy (a and c: one block's)
  bool used() const { return pad_a || pad_b || pad_c; }
  size_t scratch_bytes() const { return bytes_b + bytes_a + bytes_c; }
};

namespace gemm_plan_detail {
inline bool row_aligned(int64_t ld, size_t es, uintptr_t p) { return (static_cast<size_t>(ld) * es) % 16 == 0 && p % 16 == 0; }
inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
}  // namespace gemm_plan_detail

// The plan for C = op(A) op(B) (one matrix, beta 0, elements of es = 2 or 4 bytes) at addresses a,
// b, c. An operand is copied when its rows are misaligned or when the inner size k or the column
// size n is not a multiple of 16 bytes' elements: the copies are zero-padded to such multiples, so
// the product adds only zeros more (the same sums) and writes columns the copy-out drops. Unused
// (nothing padded) when all is aligned, when the product is too small for the copies to pay (fewer
// than 2^30 multiply-adds), or when the scratch would exceed max_scratch with blocks of at least 256
// rows. Padded rows are 128-byte multiples; blocks are 64-row multiples.
inline PaddedGemm plan_padded_gemm(size_t es, const GemmDesc& d, uintptr_t a, uintptr_t b, uintptr_t c, size_t max_scratch) {
  using namespace gemm_plan_detail;
  PaddedGemm none;
  if (d.batch != 1 || d.beta != 0.f || (es != 2 && es != 4) || d.m <= 0 || d.n <= 0 || d.k <= 0) return none;
  if (static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k) < 1073741824.0) return none;
  const int64_t v = static_cast<int64_t>(16 / es), pad = static_cast<int64_t>(128 / es);  // elements per 16 and 128 bytes
  const bool pk = d.k % v != 0, pn = d.n % v != 0;
  const bool ma = !row_aligned(d.lda, es, a), mb = !row_aligned(d.ldb, es, b), mc = !row_aligned(d.ldc, es, c);
  PaddedGemm q;
  q.pad_a = ma || pk;
  q.pad_b = mb || pk || pn;
  q.pad_c = mc || pn;
  if (!q.used()) return none;
  q.k = pk ? round_up(d.k, v) : d.k;
  q.n = pn ? round_up(d.n, v) : d.n;
  if (q.pad_b) {  // b whole: k x n, or n x k when transposed
    const int64_t rows = d.trans_b ? q.n : q.k, cols = d.trans_b ? q.k : q.n;
    q.ldb = round_up(cols, pad);
    q.bytes_b = static_cast<size_t>(rows * q.ldb) * es;
    if (q.bytes_b > max_scratch) return none;
  }
  // a and c in blocks of the result's rows: a stored m x k (a block is rows) or k x m (columns)
  int64_t row_bytes = 0;  // scratch per row of a block
  if (q.pad_a) {
    if (d.trans_a) {
      row_bytes += q.k * static_cast<int64_t>(es);  // k rows of the block's columns, ld = the block rounded up
    } else {
      q.lda = round_up(q.k, pad);
      row_bytes += q.lda * static_cast<int64_t>(es);
    }
  }
  if (q.pad_c) {
    q.ldc = round_up(q.n, pad);
    row_bytes += q.ldc * static_cast<int64_t>(es);
  }
  q.block = d.m;
  if (row_bytes > 0) {
    const size_t room = max_scratch - q.bytes_b;
    const int64_t fit = static_cast<int64_t>(room / static_cast<size_t>(row_bytes)) / 64 * 64;  // rows that fit, in 64s
    if (fit < d.m) {
      if (fit < 256) return none;
      const int64_t blocks = (d.m + fit - 1) / fit;
      q.block = std::min(fit, round_up((d.m + blocks - 1) / blocks, 64));  // even blocks
    }
    if (q.pad_a && d.trans_a) q.lda = round_up(q.block, pad);
    if (q.pad_a) q.bytes_a = static_cast<size_t>(d.trans_a ? q.k * q.lda : q.block * q.lda) * es;
    if (q.pad_c) q.bytes_c = static_cast<size_t>(q.block * q.ldc) * es;
  }
  return q;
}

}  // namespace oases::cuda
