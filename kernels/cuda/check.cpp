#include "kernels/cuda/check.h"

#include <algorithm>
#include <stdexcept>

namespace oases::cuda {

void throw_error(const char* library, const char* call, long code, const char* message, const char* file, int line) {
  std::string where = file;
  size_t p = where.find("kernels/");
  if (p == std::string::npos) p = where.find("executor/");
  if (p != std::string::npos) where = where.substr(p);
  throw std::runtime_error(std::string(library) + " call " + call + " failed with " + std::to_string(code) + " (" +
                           (message ? message : "?") + ") at " + where + ":" + std::to_string(line));
}

unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535LL * 16));
}

}  // namespace oases::cuda
