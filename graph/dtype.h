// Element types the IR knows, with the conversions the rest of the project needs
// (float16 and bfloat16 are storage types: arithmetic happens in float32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace oases {

enum class DType : uint8_t {
  kUndefined = 0,
  kF32,
  kF64,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float32", "int64", ...
bool is_floating(DType t);        // f32, f64, f16, bf16
bool is_integer(DType t);         // signed and unsigned integers (not bool)
bool is_signed(DType t);

// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);
float bfloat16_to_float(uint16_t b);

// Reads element `i` of a buffer of type `t` as double / writes a double into it; slow paths for
// constants, comparisons and conversions, never for kernels. Into an integer type the value is
// truncated toward zero and saturated at the type's bounds (NaN gives 0).
double load_as_double(const void* data, DType t, int64_t i);
// Element `i` as int64: exact for integer types (through double, values near 2^63 would round
// out of range), truncated and saturated for floating ones (NaN gives 0). For indices and labels.
int64_t load_as_int64(const void* data, DType t, int64_t i);
void store_from_double(void* data, DType t, int64_t i, double v);

// Calls f.template operator()<T>() with the C++ type of t (uint16_t carries f16/bf16 bits).
template <class F>
auto dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32: return f.template operator()<float>();
    case DType::kF64: return f.template operator()<double>();
    case DType::kI64: return f.template operator()<int64_t>();
    case DType::kI32: return f.template operator()<int32_t>();
    case DType::kI16: return f.template operator()<int16_t>();
    case DType::kI8: return f.template operator()<int8_t>();
    case DType::kU8: return f.template operator()<uint8_t>();
    case DType::kU16: return f.template operator()<uint16_t>();
    case DType::kU32: return f.template operator()<uint32_t>();
    case DType::kU64: return f.template operator()<uint64_t>();
    case DType::kBool: return f.template operator()<bool>();
    case DType::kF16:
    case DType::kBF16: return f.template operator()<uint16_t>();
    default: return f.template operator()<float>();
  }
}

}  // namespace oases

namespace oases {
// ONNX TensorProto.DataType numbers (part of the file format) <-> DType; kUndefined if unknown.
DType dtype_from_onnx(int onnx_type);
int dtype_to_onnx(DType t);
}  // namespace oases
