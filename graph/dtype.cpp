#include "graph/dtype.h"

#include <cmath>
#include <limits>

namespace oases {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
    case DType::kI16: return 2;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kU16: return 2;
    case DType::kU32: return 4;
    case DType::kU64: return 8;
    case DType::kBool: return 1;
    default: return 0;
  }
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI64: return "int64";
    case DType::kI32: return "int32";
    case DType::kI16: return "int16";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kU16: return "uint16";
    case DType::kU32: return "uint32";
    case DType::kU64: return "uint64";
    case DType::kBool: return "bool";
    default: return "undefined";
  }
}

bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}

bool is_integer(DType t) {
  switch (t) {
    case DType::kI64:
    case DType::kI32:
    case DType::kI16:
    case DType::kI8:
    case DType::kU8:
    case DType::kU16:
    case DType::kU32:
    case DType::kU64: return true;
    default: return false;
  }
}

bool is_signed(DType t) {
  return is_floating(t) || t == DType::kI64 || t == DType::kI32 || t == DType::kI16 || t == DType::kI8;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));  // inf / nan
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) half_mant++;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;  // may carry into exponent: correct
  return static_cast<uint16_t>(half);
}

float half_to_float(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float bfloat16_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double load_as_double(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF64: return static_cast<const double*>(data)[i];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bfloat16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kI32: return static_cast<const int32_t*>(data)[i];
    case DType::kI16: return static_cast<const int16_t*>(data)[i];
    case DType::kI8: return static_cast<const int8_t*>(data)[i];
    case DType::kU8: return static_cast<const uint8_t*>(data)[i];
    case DType::kU16: return static_cast<const uint16_t*>(data)[i];
    case DType::kU32: return static_cast<const uint32_t*>(data)[i];
    case DType::kU64: return static_cast<double>(static_cast<const uint64_t*>(data)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(data)[i] ? 1.0 : 0.0;
    default: return 0.0;
  }
}

namespace {

// Float to integer as Oases defines it (ONNX leaves out-of-range values unspecified; C++ makes
// them undefined behaviour): truncate toward zero, saturate at the type's bounds, NaN to 0.
template <class T>
T saturate_to(double v) {
  if (std::isnan(v)) return T(0);
  // The bounds as doubles: lo is exact (a power of two or 0); hi may round up to 2^k, which is
  // why the upper test is >= on the first value that does not fit.
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double past_hi = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= past_hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

}  // namespace

int64_t load_as_int64(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kI64: return static_cast<const int64_t*>(data)[i];
    case DType::kI32: return static_cast<const int32_t*>(data)[i];
    case DType::kI16: return static_cast<const int16_t*>(data)[i];
    case DType::kI8: return static_cast<const int8_t*>(data)[i];
    case DType::kU8: return static_cast<const uint8_t*>(data)[i];
    case DType::kU16: return static_cast<const uint16_t*>(data)[i];
    case DType::kU32: return static_cast<const uint32_t*>(data)[i];
    case DType::kU64: {
      uint64_t u = static_cast<const uint64_t*>(data)[i];
      return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(u);
    }
    case DType::kBool: return static_cast<const uint8_t*>(data)[i] ? 1 : 0;
    default: return saturate_to<int64_t>(load_as_double(data, t, i));
  }
}

void store_from_double(void* data, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(data)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = float_to_bfloat16(static_cast<float>(v)); break;
    case DType::kI64: static_cast<int64_t*>(data)[i] = saturate_to<int64_t>(v); break;
    case DType::kI32: static_cast<int32_t*>(data)[i] = saturate_to<int32_t>(v); break;
    case DType::kI16: static_cast<int16_t*>(data)[i] = saturate_to<int16_t>(v); break;
    case DType::kI8: static_cast<int8_t*>(data)[i] = saturate_to<int8_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(data)[i] = saturate_to<uint8_t>(v); break;
    case DType::kU16: static_cast<uint16_t*>(data)[i] = saturate_to<uint16_t>(v); break;
    case DType::kU32: static_cast<uint32_t*>(data)[i] = saturate_to<uint32_t>(v); break;
    case DType::kU64: static_cast<uint64_t*>(data)[i] = saturate_to<uint64_t>(v); break;
    case DType::kBool: static_cast<uint8_t*>(data)[i] = v != 0.0 ? 1 : 0; break;
    default: break;
  }
}

}  // namespace oases

namespace oases {

DType dtype_from_onnx(int t) {
  switch (t) {
    case 1: return DType::kF32;
    case 2: return DType::kU8;
    case 3: return DType::kI8;
    case 4: return DType::kU16;
    case 5: return DType::kI16;
    case 6: return DType::kI32;
    case 7: return DType::kI64;
    case 9: return DType::kBool;
    case 10: return DType::kF16;
    case 11: return DType::kF64;
    case 12: return DType::kU32;
    case 13: return DType::kU64;
    case 16: return DType::kBF16;
    default: return DType::kUndefined;
  }
}

int dtype_to_onnx(DType t) {
  switch (t) {
    case DType::kF32: return 1;
    case DType::kU8: return 2;
    case DType::kI8: return 3;
    case DType::kU16: return 4;
    case DType::kI16: return 5;
    case DType::kI32: return 6;
    case DType::kI64: return 7;
    case DType::kBool: return 9;
    case DType::kF16: return 10;
    case DType::kF64: return 11;
    case DType::kU32: return 12;
    case DType::kU64: return 13;
    case DType::kBF16: return 16;
    default: return 0;
  }
}

}  // namespace oases
