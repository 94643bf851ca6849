// What a CUDA kernel glue function sees: the node and its operand views (device pointers) through
// the KernelContext, the stream it must enqueue on, the cuBLAS/cuDNN handles of that stream, the
// fault word for bad labels and indices, and stream-ordered scratch memory. Glue functions never
// synchronise with the host.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "executor/kernel_context.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/nd.h"

namespace oases::cuda {

struct CudaContext {
  KernelContext& k;
  cudaStream_t stream = nullptr;
  BlasHandles* blas = nullptr;  // compute stream only
  void* cudnn = nullptr;        // cudnnHandle_t on the compute stream
  Fault fault;
  std::vector<void*> scratch_;  // freed (stream-ordered) after the launch

  // Device scratch valid for this kernel's launches on `stream`.
  void* scratch(size_t bytes);
  float* scratch_floats(size_t n) { return static_cast<float*>(scratch(n * sizeof(float))); }
  void release();

  const TensorView& in(int i) const { return k.in[static_cast<size_t>(i)]; }
  const TensorView& out(int i) const { return k.out[static_cast<size_t>(i)]; }
  bool has_input(int i) const { return k.has_input(i); }
  bool has_output(int i) const { return static_cast<size_t>(i) < k.out.size() && k.out[static_cast<size_t>(i)].data; }
  const AttrMap& attrs() const { return k.attrs(); }
};

using CudaKernelFn = std::function<void(CudaContext&)>;

class CudaKernelRegistry {
 public:
  static const CudaKernelRegistry& global();
  void add(const std::string& domain, const std::string& op, CudaKernelFn fn);
  const CudaKernelFn* find(const std::string& domain, const std::string& op) const;
  std::vector<std::string> ops() const;  // "Op" or "domain.Op", as CpuKernelRegistry::ops()

 private:
  std::map<std::pair<std::string, std::string>, CudaKernelFn> fns_;
};

void register_cuda_elementwise(CudaKernelRegistry& r);
void register_cuda_layout(CudaKernelRegistry& r);
void register_cuda_nn(CudaKernelRegistry& r);
void register_cuda_collectives(CudaKernelRegistry& r);

// DType -> kernel element type (throws naming the type when the kernels have none).
Elem elem(DType t);
// Shapes as the nd.h builders take them.
inline std::vector<int64_t> dims(const Shape& s) {
  return std::vector<int64_t>(s.begin(), s.end());
}

}  // namespace oases::cuda
