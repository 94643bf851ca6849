// Element types of the CUDA kernels (the IR's DType without the graph dependency). No CUDA header:
// host-only rules over kernel arguments (attention_rules.h) use it in builds without CUDA too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace oases::cuda {

enum class Elem : uint8_t { kF32, kF64, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kU16, kU32, kU64, kBool };

inline size_t elem_size(Elem t) {
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

inline const char* elem_name(Elem t) {
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

}  // namespace oases::cuda
