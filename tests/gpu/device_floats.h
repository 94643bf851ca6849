// float32 buffers on the current device for the GPU suites' communication tests.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

namespace oases::gpu_test {

// float32 values on the device, read back whole.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceFloats(size_t n) : DeviceFloats(std::vector<float>(n, -1.0f)) {}
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return static_cast<float*>(p_); }
  size_t bytes() const { return n_ * sizeof(float); }
  std::vector<float> read() const {
    std::vector<float> out(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), p_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

}  // namespace oases::gpu_test
