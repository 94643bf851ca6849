// Elementwise kernels with broadcasting. Functors give the math per element; the loops below give
// the layout. Integer division and modulo follow ONNX (Div truncates; Mod follows the divisor's sign
// unless fmod=1, which follows the dividend's like C).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/parallel.h"

namespace oases::kernels {

template <class T, class R, class Op>
void binary(const T* a, const std::vector<int64_t>& sa, const T* b, const std::vector<int64_t>& sb, R* out, const std::vector<int64_t>& so,
            Op op) {
  Broadcast bc = make_broadcast(so, {sa, sb});
  for_each_row(bc, [&](int64_t o, const std::array<int64_t, kMaxOperands>& off, int64_t n, const std::array<int64_t, kMaxOperands>& st) {
    const T* pa = a + off[0];
    const T* pb = b + off[1];
    R* po = out + o;
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i], pb[i]);
    } else if (st[0] == 1 && st[1] == 0) {
      const T vb = *pb;
      for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i], vb);
    } else if (st[0] == 0 && st[1] == 1) {
      const T va = *pa;
      for (int64_t i = 0; i < n; ++i) po[i] = op(va, pb[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i * st[0]], pb[i * st[1]]);
    }
  });
}

// Mixed operand types (Pow with an integer exponent, ...).
template <class T, class U, class R, class Op>
void binary_mixed(const T* a, const std::vector<int64_t>& sa, const U* b, const std::vector<int64_t>& sb, R* out,
                  const std::vector<int64_t>& so, Op op) {
  Broadcast bc = make_broadcast(so, {sa, sb});
  for_each_row(bc, [&](int64_t o, const std::array<int64_t, kMaxOperands>& off, int64_t n, const std::array<int64_t, kMaxOperands>& st) {
    for (int64_t i = 0; i < n; ++i) out[o + i] = op(a[off[0] + i * st[0]], b[off[1] + i * st[1]]);
  });
}

template <class C, class T, class Op>
void ternary(const C* a, const std::vector<int64_t>& sa, const T* b, const std::vector<int64_t>& sb, const T* c,
             const std::vector<int64_t>& sc, T* out, const std::vector<int64_t>& so, Op op) {
  Broadcast bc = make_broadcast(so, {sa, sb, sc});
  for_each_row(bc, [&](int64_t o, const std::array<int64_t, kMaxOperands>& off, int64_t n, const std::array<int64_t, kMaxOperands>& st) {
    for (int64_t i = 0; i < n; ++i) out[o + i] = op(a[off[0] + i * st[0]], b[off[1] + i * st[1]], c[off[2] + i * st[2]]);
  });
}

// Broadcast copy of `in` to `out` (Expand).
template <class T>
void broadcast_to(const T* in, const std::vector<int64_t>& si, T* out, const std::vector<int64_t>& so) {
  Broadcast bc = make_broadcast(so, {si});
  for_each_row(bc, [&](int64_t o, const std::array<int64_t, kMaxOperands>& off, int64_t n, const std::array<int64_t, kMaxOperands>& st) {
    if (st[0] == 0) {
      for (int64_t i = 0; i < n; ++i) out[o + i] = in[off[0]];
    } else {
      for (int64_t i = 0; i < n; ++i) out[o + i] = in[off[0] + i * st[0]];
    }
  });
}

template <class T, class R, class Op>
void unary(const T* x, R* y, int64_t n, Op op) {
  parallel_range(n, 1 << 15, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) y[i] = op(x[i]);
  });
}

// --- per-element math ----------------------------------------------------------------------

template <class T>
T int_div(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return b == 0 ? T(0) : static_cast<T>(a / b);
  } else {
    return a / b;
  }
}

template <class T>
T onnx_mod(T a, T b, bool fmod) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return T(0);
    T r = static_cast<T>(a % b);
    if constexpr (std::is_signed_v<T>) {
      if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    }
    return r;
  } else {
    T r = std::fmod(a, b);
    if (!fmod && r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}

inline float gelu_erf(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}
inline float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
template <class T>
T sigmoid(T x) {
  return x >= T(0) ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
}

}  // namespace oases::kernels
