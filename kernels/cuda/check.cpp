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

size_t elem_size(Elem t) {
  switch (t) {
    case Elem::kF64:
    case Elem::kI64:
    case Elem::kU64: return 8;
    case Elem::kF32:
    case Elem::kI32:
    case Elem::kU32: return 4;
    case Elem::kF16:
    case Elem::kBF16:
    case Elem::kI16:
    case Elem::kU16: return 2;
    default: return 1;
  }
}

const char* elem_name(Elem t) {
  switch (t) {
    case Elem::kF32: return "float32";
    case Elem::kF64: return "float64";
    case Elem::kF16: return "float16";
    case Elem::kBF16: return "bfloat16";
    case Elem::kI64: return "int64";
    case Elem::kI32: return "int32";
    case Elem::kI16: return "int16";
    case Elem::kI8: return "int8";
    case Elem::kU8: return "uint8";
    case Elem::kU16: return "uint16";
    case Elem::kU32: return "uint32";
    case Elem::kU64: return "uint64";
    case Elem::kBool: return "bool";
  }
  return "?";
}

unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535LL * 16));
}

}  // namespace oases::cuda
