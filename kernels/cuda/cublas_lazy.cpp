// cuBLAS and cuBLASLt opened on first use. The tools are not linked against them: mapping cuBLASLt
// at start-up relocates ~150 MiB (about 25k page faults, 0.1-0.15 s of a core), which every process
// paid, CPU runs and every MPI rank of a test included, for libraries only a GPU run calls. Each
// cuBLAS function this code calls is defined here with the header's signature and forwards to the
// library's own, resolved once (dlopen of the soname the headers name, else beside libcudart).
// When the library cannot be opened the functions return CUBLAS_STATUS_NOT_INITIALIZED and
// cublasGetStatusString says why.
#include "kernels/cuda/cublas_lazy.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#define OASES_CUBLAS_STR2(x) #x
#define OASES_CUBLAS_STR(x) OASES_CUBLAS_STR2(x)

namespace oases::cuda {

namespace {

struct CublasLibrary {
  const char* soname;
  std::once_flag once;
  void* handle = nullptr;
  std::string error;
};

CublasLibrary& cublas_library(bool lt) {
  // libcublas needs libcublasLt (its DT_NEEDED), so the two share a major version
  static CublasLibrary cublas{"libcublas.so." OASES_CUBLAS_STR(CUBLAS_VER_MAJOR), {}, nullptr, {}};
  static CublasLibrary cublas_lt{"libcublasLt.so." OASES_CUBLAS_STR(CUBLAS_VER_MAJOR), {}, nullptr, {}};
  return lt ? cublas_lt : cublas;
}

void open_cublas_library(CublasLibrary& l) {
  l.handle = dlopen(l.soname, RTLD_NOW | RTLD_LOCAL);
  if (l.handle) return;
  const char* first = dlerror();
  l.error = first ? first : l.soname;
  // the folder libcudart was loaded from (the toolkit's, or a wheel's): where cuBLAS usually is too
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) != 0 && info.dli_fname != nullptr) {
    std::string path = info.dli_fname;
    size_t slash = path.rfind('/');
    if (slash != std::string::npos) {
      path = path.substr(0, slash + 1) + l.soname;
      l.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (l.handle) {
        l.error.clear();
        return;
      }
      const char* second = dlerror();
      if (second) l.error += std::string("; ") + second;
    }
  }
}

void* cublas_symbol(bool lt, const char* name) {
  CublasLibrary& l = cublas_library(lt);
  std::call_once(l.once, [&] { open_cublas_library(l); });
  if (!l.handle) return nullptr;
  return dlsym(l.handle, name);
}

// Every function forwarded below, for cublas_open_all.
struct CublasForwarded {
  bool lt;
  const char* name;
};
constexpr CublasForwarded kCublasForwarded[] = {
    {false, "cublasCreate_v2"},
    {false, "cublasDestroy_v2"},
    {false, "cublasSetStream_v2"},
    {false, "cublasSetWorkspace_v2"},
    {false, "cublasGetProperty"},
    {false, "cublasGetStatusString"},
    {false, "cublasGemmStridedBatchedEx"},
    {true, "cublasLtCreate"},
    {true, "cublasLtDestroy"},
    {true, "cublasLtGetVersion"},
    {true, "cublasLtMatmul"},
    {true, "cublasLtMatmulAlgoGetHeuristic"},
    {true, "cublasLtMatmulDescCreate"},
    {true, "cublasLtMatmulDescDestroy"},
    {true, "cublasLtMatmulDescSetAttribute"},
    {true, "cublasLtMatmulPreferenceCreate"},
    {true, "cublasLtMatmulPreferenceDestroy"},
    {true, "cublasLtMatmulPreferenceSetAttribute"},
    {true, "cublasLtMatrixLayoutCreate"},
    {true, "cublasLtMatrixLayoutDestroy"},
};

}  // namespace

std::string cublas_open_all() {
  for (const CublasForwarded& f : kCublasForwarded) {
    if (cublas_symbol(f.lt, f.name) == nullptr) {
      const CublasLibrary& l = cublas_library(f.lt);
      return l.handle ? std::string(l.soname) + " has no " + f.name : l.error;
    }
  }
  return "";
}

}  // namespace oases::cuda

// One definition per function: the header's declaration, a pointer resolved on the first call.
#define OASES_CUBLAS_FORWARD(LT, RET, FAIL, NAME, PARAMS, ARGS)                                \
  extern "C" RET CUBLASWINAPI NAME PARAMS {                                                     \
    static auto* const fn = reinterpret_cast<RET(*) PARAMS>(oases::cuda::cublas_symbol(LT, #NAME)); \
    if (fn == nullptr) return FAIL;                                                             \
    return fn ARGS;                                                                             \
  }

#define OASES_CUBLAS_STATUS(LT, NAME, PARAMS, ARGS) \
  OASES_CUBLAS_FORWARD(LT, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, NAME, PARAMS, ARGS)

OASES_CUBLAS_STATUS(false, cublasCreate_v2, (cublasHandle_t * handle), (handle))
OASES_CUBLAS_STATUS(false, cublasDestroy_v2, (cublasHandle_t handle), (handle))
OASES_CUBLAS_STATUS(false, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t streamId), (handle, streamId))
OASES_CUBLAS_STATUS(false, cublasSetWorkspace_v2, (cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes),
                    (handle, workspace, workspaceSizeInBytes))
OASES_CUBLAS_STATUS(false, cublasGetProperty, (libraryPropertyType type, int* value), (type, value))
OASES_CUBLAS_STATUS(false, cublasGemmStridedBatchedEx,
                    (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                     const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
                     cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                     int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType,
                     cublasGemmAlgo_t algo),
                    (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
                     ldc, strideC, batchCount, computeType, algo))

extern "C" const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  static auto* const fn = reinterpret_cast<const char* (*)(cublasStatus_t)>(oases::cuda::cublas_symbol(false, "cublasGetStatusString"));
  if (fn == nullptr) {
    static const std::string why = "cuBLAS could not be opened: " + oases::cuda::cublas_open_all();
    return why.c_str();
  }
  return fn(status);
}

OASES_CUBLAS_STATUS(true, cublasLtCreate, (cublasLtHandle_t * lightHandle), (lightHandle))
OASES_CUBLAS_STATUS(true, cublasLtDestroy, (cublasLtHandle_t lightHandle), (lightHandle))
OASES_CUBLAS_FORWARD(true, size_t, 0, cublasLtGetVersion, (void), ())
OASES_CUBLAS_STATUS(true, cublasLtMatmul,
                    (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha, const void* A,
                     cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                     const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream),
                    (lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                     workspaceSizeInBytes, stream))
OASES_CUBLAS_STATUS(true, cublasLtMatmulAlgoGetHeuristic,
                    (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
                     cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                     cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                     cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
                    (lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
                     heuristicResultsArray, returnAlgoCount))
OASES_CUBLAS_STATUS(true, cublasLtMatmulDescCreate,
                    (cublasLtMatmulDesc_t * matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType),
                    (matmulDesc, computeType, scaleType))
OASES_CUBLAS_STATUS(true, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t matmulDesc), (matmulDesc))
OASES_CUBLAS_STATUS(true, cublasLtMatmulDescSetAttribute,
                    (cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                     size_t sizeInBytes),
                    (matmulDesc, attr, buf, sizeInBytes))
OASES_CUBLAS_STATUS(true, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
OASES_CUBLAS_STATUS(true, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
OASES_CUBLAS_STATUS(true, cublasLtMatmulPreferenceSetAttribute,
                    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                     size_t sizeInBytes),
                    (pref, attr, buf, sizeInBytes))
OASES_CUBLAS_STATUS(true, cublasLtMatrixLayoutCreate,
                    (cublasLtMatrixLayout_t * matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                    (matLayout, type, rows, cols, ld))
OASES_CUBLAS_STATUS(true, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t matLayout), (matLayout))
