// What the device trainer (device_trainer.cpp), the device profile's optimizer timing and the GPU
// tests share: device buffers owned together, the tables of a multi-tensor launch over device
// tensors, and the scalars of one update as the kernels read them (kernels/cuda/optim.h).
#pragma once

#include <cstddef>
#include <vector>

#include "executor/multi_tensor.h"
#include "executor/optimizer.h"
#include "kernels/cuda/optim.h"

namespace oases::cuda {

// Elements per block of the trainer's multi-tensor launches.
inline constexpr int64_t kChunk = int64_t(1) << 16;

// Device allocations freed together with their holder (not copyable). Throws on a failed CUDA call.
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  ~DeviceBuffers();
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  // n zeroed elements.
  void* alloc_bytes(size_t bytes);
  template <class T>
  T* alloc(size_t n) {
    return static_cast<T*>(alloc_bytes(n * sizeof(T)));
  }
  // A device copy of `v`.
  void* put_bytes(const void* host, size_t bytes);
  template <class T>
  T* put(const std::vector<T>& v) {
    return static_cast<T*>(put_bytes(v.data(), v.size() * sizeof(T)));
  }
  size_t bytes() const { return bytes_; }

 private:
  std::vector<void*> owned_;
  size_t bytes_ = 0;
};

// The tables of one multi-tensor launch over tensors i (param[i], grad[i], m[i], v[i] on the device,
// v null for SGD; numel[i] elements; decay[i] 1 where weight decay applies), in blocks of `chunk`
// elements; their arrays in `mem`. No accumulators (MultiTensorTables::acc stays null).
Expected<MultiTensorTables> multi_tensor_tables(DeviceBuffers& mem, const std::vector<float*>& param, const std::vector<const float*>& grad,
                                                const std::vector<float*>& m, const std::vector<float*>& v,
                                                const std::vector<int64_t>& numel, const std::vector<uint8_t>& decay, int64_t chunk);

// The update's scalars for `k` with gradients scaled by `grad_scale` (1 / (micro-batches · loss
// scale)); no skipping, the device's own norm.
inline StepScalars step_scalars(const OptimizerKnobs& k, float grad_scale) {
  StepScalars sc;
  sc.lr = k.lr;
  sc.beta1 = k.beta1;
  sc.beta2 = k.beta2;
  sc.one_minus_beta1 = k.one_minus_beta1;
  sc.one_minus_beta2 = k.one_minus_beta2;
  sc.eps = k.eps;
  sc.weight_decay = k.weight_decay;
  sc.bc1 = k.bc1;
  sc.bc2 = k.bc2;
  sc.momentum = k.momentum;
  sc.grad_scale = grad_scale;
  sc.clip = k.clip;
  sc.adamw = k.adamw ? 1 : 0;
  sc.nesterov = k.nesterov ? 1 : 0;
  sc.first = k.first ? 1 : 0;
  return sc;
}

}  // namespace oases::cuda
