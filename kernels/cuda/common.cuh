// Device helpers shared by the .cu files: float views of the storage types (arithmetic in fp32,
// storage in fp32, fp16 or bf16), warp and block reductions, grid-stride loops, dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/nd.h"

namespace oases::cuda {

constexpr int kThreads = 256;

// --- storage <-> float ----------------------------------------------------------------------

template <class T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x) {
  return static_cast<T>(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Compute type of a storage type: float for the 16-bit floats and float, itself otherwise.
template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<__half> {
  using type = float;
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
};

template <class T>
__device__ __forceinline__ typename Acc<T>::type load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return to_float(p[i]);
  } else {
    return p[i];
  }
}
template <class T, class V>
__device__ __forceinline__ void store(T* p, int64_t i, V v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    p[i] = from_float<T>(static_cast<float>(v));
  } else {
    p[i] = static_cast<T>(v);
  }
}

// Whether 16-byte vector loads and stores may go through p (host side, choosing a kernel).
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// --- reductions -----------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call synchronises the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(r);
}

#define OASES_GRID_STRIDE(i, n) \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// --- dispatch -------------------------------------------------------------------------------

[[noreturn]] inline void unsupported(const char* what, Elem t) {
  throw std::runtime_error(std::string("[cuda ") + what + "] type " + elem_name(t) + " is not supported");
}

// Dispatch calls f(Tag<T>{}) with the C++ type of an element type (C++17: no templated lambdas);
// the callee writes `using T = typename decltype(tag)::type;`.
template <class T>
struct Tag {
  using type = T;
};

// The floating storage types.
template <class F>
void dispatch_floating(const char* what, Elem t, F&& f) {
  switch (t) {
    case Elem::kF32: f(Tag<float>{}); break;
    case Elem::kF16: f(Tag<__half>{}); break;
    case Elem::kBF16: f(Tag<__nv_bfloat16>{}); break;
    default: unsupported(what, t);
  }
}
// ... plus float64 and the integer types the graphs compute with.
template <class F>
void dispatch_numeric(const char* what, Elem t, F&& f) {
  switch (t) {
    case Elem::kF32: f(Tag<float>{}); break;
    case Elem::kF16: f(Tag<__half>{}); break;
    case Elem::kBF16: f(Tag<__nv_bfloat16>{}); break;
    case Elem::kF64: f(Tag<double>{}); break;
    case Elem::kI64: f(Tag<int64_t>{}); break;
    case Elem::kI32: f(Tag<int32_t>{}); break;
    case Elem::kU8:
    case Elem::kBool: f(Tag<uint8_t>{}); break;
    default: unsupported(what, t);
  }
}
// By element size (bit moves).
template <class F>
void dispatch_bits(size_t es, F&& f) {
  switch (es) {
    case 1: f(Tag<uint8_t>{}); break;
    case 2: f(Tag<uint16_t>{}); break;
    case 4: f(Tag<uint32_t>{}); break;
    case 8: f(Tag<uint64_t>{}); break;
    default: throw std::runtime_error("[cuda] element size " + std::to_string(es) + " is not supported");
  }
}

}  // namespace oases::cuda
