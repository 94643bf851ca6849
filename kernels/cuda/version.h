// What the CUDA libraries say about themselves, read without a GPU where the library allows it.
#pragma once

#include <string>
#include <vector>

namespace oases::cuda {

struct LibraryVersion {
  std::string library;   // "cudart", "cuda driver", "cublas", "cublasLt", "cudnn", "nccl", "cudnn frontend"
  bool read = false;     // the call answered
  std::string version;   // "12.4.1", or empty
  std::string note;      // the error when it did not answer
  std::string compiled;  // the version of the headers this binary was built with
};
std::vector<LibraryVersion> library_versions();

struct DeviceInfo {
  int count = 0;
  std::string error;  // why cudaGetDeviceCount failed (no driver, no device)
  std::vector<std::string> names;
  std::vector<int> sm;  // compute capability x 10
  std::vector<double> memory_gib;
};
DeviceInfo device_info();

}  // namespace oases::cuda
