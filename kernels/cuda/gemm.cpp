#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "kernels/cuda/elementwise.h"

#define OASES_CUBLAS_CHECK(call)                                                                                                     \
  do {                                                                                                                               \
    cublasStatus_t oases_s_ = (call);                                                                                                \
    if (oases_s_ != CUBLAS_STATUS_SUCCESS)                                                                                           \
      ::oases::cuda::throw_error("cuBLAS", #call, static_cast<long>(oases_s_), cublasGetStatusString(oases_s_), __FILE__, __LINE__); \
  } while (0)

namespace oases::cuda {

namespace {

cudaDataType_t data_type(Elem t) {
  switch (t) {
    case Elem::kF32: return CUDA_R_32F;
    case Elem::kF16: return CUDA_R_16F;
    case Elem::kBF16: return CUDA_R_16BF;
    case Elem::kF64: return CUDA_R_64F;
    default: throw std::runtime_error(std::string("[cuda MatMul] type ") + elem_name(t) + " is not supported (float types are)");
  }
}

cublasComputeType_t compute_type(Elem t, bool tf32) {
  if (t == Elem::kF64) return CUBLAS_COMPUTE_64F;
  if (t == Elem::kF32 && tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// An epilogue of one cuBLASLt call: `bias` is the bias read (BIAS epilogues) or the bias gradient
// written (BGRAD), over the result's columns (the rows of the column-major Cᵀ); `aux` the GELU's
// input written (GELU_AUX) or read (DGELU), laid out as the result with `aux_ld` elements a row.
struct LtEpilogue {
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};

// cuBLASLt, one matrix: true when the heuristic found an algorithm and the call ran.
bool lt_matmul(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* c, const LtEpilogue& e = {}) {
  cudaDataType_t dt = data_type(t);
  cublasComputeType_t ct = compute_type(t, h.allow_tf32());
  cudaDataType_t scale_t = t == Elem::kF64 ? CUDA_R_64F : CUDA_R_32F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = false;
  struct Cleanup {
    cublasLtMatmulDesc_t& op;
    cublasLtMatrixLayout_t &la, &lb, &lc;
    cublasLtMatmulPreference_t& pref;
    ~Cleanup() {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (lc) cublasLtMatrixLayoutDestroy(lc);
      if (lb) cublasLtMatrixLayoutDestroy(lb);
      if (la) cublasLtMatrixLayoutDestroy(la);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  } cleanup{op, la, lb, lc, pref};
  // column-major: Cᵀ (n x m) = op(B)ᵀ (n x k) · op(A)ᵀ (k x m)
  cublasOperation_t opb = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opa = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  OASES_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, ct, scale_t));
  OASES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof(opb)));
  OASES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof(opa)));
  if (e.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    OASES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.epi, sizeof(e.epi)));
  }
  if (e.bias) OASES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
  if (e.aux) {
    OASES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
    OASES_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e.aux_ld, sizeof(e.aux_ld)));
  }
  // stored (column-major) shapes: B is n x k (or k x n when transposed), A is k x m (or m x k)
  OASES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, dt, d.trans_b ? d.k : d.n, d.trans_b ? d.n : d.k, d.ldb));
  OASES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, dt, d.trans_a ? d.m : d.k, d.trans_a ? d.k : d.m, d.lda));
  OASES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, dt, d.n, d.m, d.ldc));
  OASES_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = h.workspace_bytes();
  OASES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasLtHandle_t lt = static_cast<cublasLtHandle_t>(h.lt());
  if (cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, lc, lc, pref, 1, &res, &found) != CUBLAS_STATUS_SUCCESS || found == 0) {
    return false;
  }
  double alpha64 = d.alpha, beta64 = d.beta;
  float alpha32 = d.alpha, beta32 = d.beta;
  const void* alpha = t == Elem::kF64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = t == Elem::kF64 ? static_cast<const void*>(&beta64) : &beta32;
  OASES_CUBLAS_CHECK(cublasLtMatmul(lt, op, alpha, b, lb, a, la, beta, c, lc, c, lc, &res.algo, h.workspace(), ws, h.stream()));
  ok = true;
  return ok;
}

// cuBLAS strided batches (also one matrix): operands of type ab, result of type ct.
void strided_batched(BlasHandles& h, Elem ab, Elem ct, const GemmDesc& d, const void* a, const void* b, void* c) {
  cudaDataType_t dt = data_type(ab), dc = data_type(ct);
  double alpha64 = d.alpha, beta64 = d.beta;
  float alpha32 = d.alpha, beta32 = d.beta;
  const void* alpha = ab == Elem::kF64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = ab == Elem::kF64 ? static_cast<const void*>(&beta64) : &beta32;
  OASES_CUBLAS_CHECK(cublasGemmStridedBatchedEx(static_cast<cublasHandle_t>(h.blas()), d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(d.n), static_cast<int>(d.m),
                                                static_cast<int>(d.k), alpha, b, dt, static_cast<int>(d.ldb), d.stride_b, a, dt,
                                                static_cast<int>(d.lda), d.stride_a, beta, c, dc, static_cast<int>(d.ldc), d.stride_c,
                                                static_cast<int>(d.batch), compute_type(ab, h.allow_tf32()), CUBLAS_GEMM_DEFAULT));
}

}  // namespace

BlasHandles::BlasHandles(cudaStream_t s, size_t workspace_bytes, bool allow_tf32)
    : stream_(s), workspace_bytes_(workspace_bytes), allow_tf32_(allow_tf32) {
  cublasHandle_t b = nullptr;
  OASES_CUBLAS_CHECK(cublasCreate(&b));
  blas_ = b;
  OASES_CUBLAS_CHECK(cublasSetStream(b, s));
  OASES_CUBLAS_CHECK(cublasSetWorkspace(b, nullptr, 0));  // deterministic: no split-K workspace races
  cublasLtHandle_t l = nullptr;
  OASES_CUBLAS_CHECK(cublasLtCreate(&l));
  lt_ = l;
  if (workspace_bytes_) OASES_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

BlasHandles::~BlasHandles() {
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
  if (blas_) cublasDestroy(static_cast<cublasHandle_t>(blas_));
}

void gemm(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* c) {
  if (d.m <= 0 || d.n <= 0 || d.batch <= 0) return;
  if (d.k == 0) {  // empty sum: C = beta C
    if (d.beta == 0.f) {
      for (int64_t i = 0; i < d.batch; ++i) {
        OASES_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(c) + i * d.stride_c * elem_size(t), d.ldc * elem_size(t), 0,
                                           d.n * elem_size(t), d.m, h.stream()));
      }
      return;
    }
    throw std::runtime_error("[cuda MatMul] k = 0 with beta != 0 is not supported");
  }
  if (d.batch == 1 && lt_matmul(h, t, d, a, b, c)) return;
  strided_batched(h, t, t, d, a, b, c);
}

namespace {
std::atomic<int64_t> g_gelu_epilogue_calls{0};

// What cuBLASLt's epilogues need beyond a plain product: one matrix, beta 0, a float type.
bool epilogue_applies(Elem t, const GemmDesc& d) {
  if (d.batch != 1 || d.beta != 0.f || d.m <= 0 || d.n <= 0 || d.k <= 0) return false;
  return t == Elem::kF32 || t == Elem::kF16 || t == Elem::kBF16;
}

// One of the GELU's epilogues: `vec` the bias (read) or bias gradient (written), `aux` the GELU's
// input (written or read), laid out as the result, whose rows must be whole multiples of 8 elements.
bool gelu_epilogue(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* c, cublasLtEpilogue_t epi, const void* vec,
                   const void* aux) {
  if (!epilogue_applies(t, d) || d.ldc != d.n || d.n % 8 != 0 || !aux) return false;
  LtEpilogue lt;
  lt.epi = epi;
  lt.bias = vec;
  lt.aux = aux;
  lt.aux_ld = d.n;
  if (!lt_matmul(h, t, d, a, b, c, lt)) return false;
  g_gelu_epilogue_calls.fetch_add(1);
  return true;
}
}  // namespace

bool gemm_epilogue(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* c, const void* bias, GemmEpilogue e) {
  if (!epilogue_applies(t, d) || !bias) return false;
  LtEpilogue lt;
  lt.epi = e == GemmEpilogue::kBiasRelu       ? CUBLASLT_EPILOGUE_RELU_BIAS
           : e == GemmEpilogue::kBiasGeluTanh ? CUBLASLT_EPILOGUE_GELU_BIAS
                                              : CUBLASLT_EPILOGUE_BIAS;
  lt.bias = bias;
  return lt_matmul(h, t, d, a, b, c, lt);
}

int64_t gelu_epilogue_calls() { return g_gelu_epilogue_calls.load(); }

bool gemm_gelu_aux(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* y, const void* bias, void* preact) {
  return gelu_epilogue(h, t, d, a, b, y, bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, bias, preact);
}

bool gemm_gelu_grad(BlasHandles& h, Elem t, const GemmDesc& d, const void* a, const void* b, void* dx, const void* x, void* dbias) {
  return gelu_epilogue(h, t, d, a, b, dx, dbias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU, dbias, x);
}

namespace {
std::atomic<int64_t> g_padded_calls{0};
}  // namespace

int64_t padded_gemm_calls() { return g_padded_calls.load(); }

void gemm_padded(BlasHandles& h, Elem t, const GemmDesc& d, const PaddedGemm& p, const void* a, const void* b, void* c, void* scratch) {
  g_padded_calls.fetch_add(1);
  const int64_t es = static_cast<int64_t>(elem_size(t));
  char* sb = static_cast<char*>(scratch);
  char* sa = sb + p.bytes_b;
  char* sc = sa + p.bytes_a;
  GemmDesc blk = d;
  blk.k = p.k;
  blk.n = p.n;
  const void* bp = b;
  if (p.pad_b) {  // b whole: k x n (n x k when transposed) into k' x n' (n' x k'), zeros in the pads
    const int64_t rows = d.trans_b ? d.n : d.k, cols = d.trans_b ? d.k : d.n;
    const int64_t prows = d.trans_b ? p.n : p.k, pcols = d.trans_b ? p.k : p.n;
    copy_rows(b, d.ldb, sb, p.ldb, rows, cols, static_cast<size_t>(es), h.stream(), pcols);
    if (prows > rows) OASES_CUDA_CHECK(cudaMemsetAsync(sb + rows * p.ldb * es, 0, static_cast<size_t>((prows - rows) * p.ldb * es), h.stream()));
    bp = sb;
    blk.ldb = p.ldb;
  }
  const auto* ab = static_cast<const char*>(a);
  auto* cb = static_cast<char*>(c);
  for (int64_t m0 = 0; m0 < d.m; m0 += p.block) {
    const int64_t rows = std::min(p.block, d.m - m0);
    blk.m = rows;
    // this block's a: rows m0.. of a (m x k), or columns m0.. of a stored k x m
    const char* ap = d.trans_a ? ab + m0 * es : ab + m0 * d.lda * es;
    blk.lda = d.lda;
    if (p.pad_a) {
      if (d.trans_a) {
        copy_rows(ap, d.lda, sa, p.lda, d.k, rows, static_cast<size_t>(es), h.stream());
        if (p.k > d.k) OASES_CUDA_CHECK(cudaMemsetAsync(sa + d.k * p.lda * es, 0, static_cast<size_t>((p.k - d.k) * p.lda * es), h.stream()));
      } else {
        copy_rows(ap, d.lda, sa, p.lda, rows, d.k, static_cast<size_t>(es), h.stream(), p.k);
      }
      ap = sa;
      blk.lda = p.lda;
    }
    char* cp = cb + m0 * d.ldc * es;
    blk.ldc = p.pad_c ? p.ldc : d.ldc;
    gemm(h, t, blk, ap, bp, p.pad_c ? sc : cp);
    if (p.pad_c) copy_rows(sc, p.ldc, cp, d.ldc, rows, d.n, static_cast<size_t>(es), h.stream());
  }
}

void gemm_ex(BlasHandles& h, Elem ab, Elem ct, const GemmDesc& d, const void* a, const void* b, void* c) {
  if (d.m <= 0 || d.n <= 0 || d.batch <= 0) return;
  if (ab == Elem::kF64 || ct == Elem::kF64 || d.k <= 0) {
    if (ab != ct) throw std::runtime_error("[cuda gemm_ex] mixed types need float operands and k > 0");
    gemm(h, ab, d, a, b, c);
    return;
  }
  strided_batched(h, ab, ct, d, a, b, c);
}

}  // namespace oases::cuda
