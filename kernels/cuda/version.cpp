#include "kernels/cuda/version.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cublas_lazy.h"

namespace oases::cuda {

namespace {

std::string dotted(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}
// CUDA's packed versions: 1000 * major + 10 * minor
std::string cuda_packed(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

std::vector<LibraryVersion> library_versions() {
  std::vector<LibraryVersion> out;
  {
    LibraryVersion l{"cudart", false, "", "", cuda_packed(CUDART_VERSION)};
    int v = 0;
    cudaError_t e = cudaRuntimeGetVersion(&v);
    l.read = e == cudaSuccess;
    if (l.read)
      l.version = cuda_packed(v);
    else
      l.note = cudaGetErrorString(e);
    out.push_back(l);
  }
  {
    LibraryVersion l{"cuda driver", false, "", "", ""};
    int v = 0;
    cudaError_t e = cudaDriverGetVersion(&v);
    l.read = e == cudaSuccess && v > 0;
    if (l.read)
      l.version = cuda_packed(v);
    else
      l.note = e == cudaSuccess ? "no driver installed" : cudaGetErrorString(e);
    out.push_back(l);
  }
  {
    LibraryVersion l{"cublas", false, "", "", dotted(CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH)};
    int ma = 0, mi = 0, pa = 0;
    bool ok = cublasGetProperty(MAJOR_VERSION, &ma) == CUBLAS_STATUS_SUCCESS &&
              cublasGetProperty(MINOR_VERSION, &mi) == CUBLAS_STATUS_SUCCESS &&
              cublasGetProperty(PATCH_LEVEL, &pa) == CUBLAS_STATUS_SUCCESS;
    l.read = ok;
    if (ok)
      l.version = dotted(ma, mi, pa);
    else
      l.note = "cublasGetProperty failed";
    out.push_back(l);
  }
  {
    size_t v = cublasLtGetVersion();  // 10000 * major + 100 * minor + patch
    LibraryVersion l{"cublasLt", v > 0, "", "", ""};
    if (v > 0) l.version = dotted(static_cast<int>(v / 10000), static_cast<int>((v / 100) % 100), static_cast<int>(v % 100));
    // opened on first use (cublas_lazy.cpp): every function the kernels call must be there
    std::string missing = cublas_open_all();
    if (!missing.empty()) {
      l.read = false;
      l.note = missing;
    }
    out.push_back(l);
  }
  {
    size_t v = cudnnGetVersion();  // cuDNN 9: 10000 * major + 100 * minor + patch
    LibraryVersion l{"cudnn", v > 0, "", "", dotted(CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL)};
    if (v > 0) l.version = dotted(static_cast<int>(v / 10000), static_cast<int>((v / 100) % 100), static_cast<int>(v % 100));
    out.push_back(l);
  }
  {
    LibraryVersion l{"nccl", false, "", "", dotted(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)};
    int v = 0;
    ncclResult_t r = ncclGetVersion(&v);  // NCCL >= 2.9: 10000 * major + 100 * minor + patch
    l.read = r == ncclSuccess;
    if (l.read)
      l.version = dotted(v / 10000, (v / 100) % 100, v % 100);
    else
      l.note = ncclGetErrorString(r);
    out.push_back(l);
  }
  {
    // header-only: the version compiled in (the fused attention, attention_cudnn.cpp)
    std::string fe = cudnn_frontend_version();
    LibraryVersion l{"cudnn frontend", !fe.empty(), fe, "", fe};
    if (fe.empty()) l.note = "built without it: scripts/setup_cudnn_frontend.sh";
    out.push_back(l);
  }
  return out;
}

DeviceInfo device_info() {
  DeviceInfo d;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    d.error = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error
    return d;
  }
  d.count = n;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    d.names.push_back(p.name);
    d.sm.push_back(p.major * 10 + p.minor);
    d.memory_gib.push_back(static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  }
  return d;
}

}  // namespace oases::cuda
