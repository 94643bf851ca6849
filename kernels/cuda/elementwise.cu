// Elementwise kernels. The math per element is the CPU glue's (executor/cpu/glue_elementwise.cpp):
//   unary      y = f(x), computed in fp32 for fp32/fp16/bf16 storage, in double for fp64, exactly for
//              integers (Neg, Abs, Sign, Relu, Clip)
//   binary     out = a ∘ b with numpy broadcasting; integer Div truncates, Mod follows the divisor's
//              sign (fmod=1: the dividend's), Max/Min propagate NaN
//   where      out = cond ? a : b, moving bits
//   cast       between every pair of the supported types, float -> int truncating, NaN -> 0
// Backward passes of these ops are graph ops of their own (UnaryGrad, GeluGrad, ...: activations.cu).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"

namespace oases::cuda {

namespace {

template <class C>
__device__ __forceinline__ C sigmoid_of(C x) {
  return x >= C(0) ? C(1) / (C(1) + exp(-x)) : exp(x) / (C(1) + exp(x));
}

// C: compute type (float or double)
template <class C>
__device__ C unary_math(UnaryOp op, const UnaryArgs& a, C x) {
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return x < C(0) ? -x : x;
    case UnaryOp::kSign: return static_cast<C>((C(0) < x) - (x < C(0)));
    case UnaryOp::kRelu: return x > C(0) ? x : C(0);
    case UnaryOp::kFloor: return floor(x);
    case UnaryOp::kCeil: return ceil(x);
    case UnaryOp::kRound: return nearbyint(x);
    case UnaryOp::kReciprocal: return C(1) / x;
    case UnaryOp::kSqrt: return sqrt(x);
    case UnaryOp::kExp: return exp(x);
    case UnaryOp::kLog: return log(x);
    case UnaryOp::kErf: return erf(x);
    case UnaryOp::kTanh: return tanh(x);
    case UnaryOp::kSigmoid: return sigmoid_of(x);
    case UnaryOp::kSin: return sin(x);
    case UnaryOp::kCos: return cos(x);
    case UnaryOp::kTan: return tan(x);
    case UnaryOp::kAsin: return asin(x);
    case UnaryOp::kAcos: return acos(x);
    case UnaryOp::kAtan: return atan(x);
    case UnaryOp::kSinh: return sinh(x);
    case UnaryOp::kCosh: return cosh(x);
    case UnaryOp::kAsinh: return asinh(x);
    case UnaryOp::kAcosh: return acosh(x);
    case UnaryOp::kAtanh: return atanh(x);
    case UnaryOp::kSoftplus: return x > C(20) ? x : log1p(exp(x));
    case UnaryOp::kSoftsign: return x / (C(1) + (x < C(0) ? -x : x));
    case UnaryOp::kSilu: return x * sigmoid_of(x);
    case UnaryOp::kMish: return x * tanh(x > C(20) ? x : log1p(exp(x)));
    case UnaryOp::kHardSwish: return x * fmax(C(0), fmin(C(1), x / C(6) + C(0.5)));
    case UnaryOp::kGeluErf: return C(0.5) * x * (C(1) + erf(x * C(0.7071067811865476)));
    case UnaryOp::kGeluTanh: return C(0.5) * x * (C(1) + tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x)));
    case UnaryOp::kLeakyRelu: return x >= C(0) ? x : C(a.alpha) * x;
    case UnaryOp::kElu: return x >= C(0) ? x : C(a.alpha) * (exp(x) - C(1));
    case UnaryOp::kSelu: return x > C(0) ? C(a.gamma) * x : C(a.gamma) * (C(a.alpha) * exp(x) - C(a.alpha));
    case UnaryOp::kCelu: return fmax(C(0), x) + fmin(C(0), C(a.alpha) * (exp(x / C(a.alpha)) - C(1)));
    case UnaryOp::kHardSigmoid: return fmax(C(0), fmin(C(1), C(a.alpha) * x + C(a.beta)));
    case UnaryOp::kThresholdedRelu: return x > C(a.alpha) ? x : C(0);
    case UnaryOp::kClip: return x < C(a.lo) ? C(a.lo) : (x > C(a.hi) ? C(a.hi) : x);
    case UnaryOp::kScale: return C(a.alpha) * x;
  }
  return x;
}

template <class I>
__device__ I unary_int(UnaryOp op, const UnaryArgs& a, I x) {
  switch (op) {
    case UnaryOp::kNeg: return static_cast<I>(-x);
    case UnaryOp::kAbs:
      if constexpr (std::is_signed_v<I>) return x < I(0) ? static_cast<I>(-x) : x;
      return x;
    case UnaryOp::kSign:
      if constexpr (std::is_signed_v<I>) return static_cast<I>((I(0) < x) - (x < I(0)));
      return static_cast<I>(x != I(0));
    case UnaryOp::kRelu: return x > I(0) ? x : I(0);
    case UnaryOp::kClip: {
      double v = static_cast<double>(x);
      return v < a.lo ? static_cast<I>(a.lo) : (v > a.hi ? static_cast<I>(a.hi) : x);
    }
    default: return x;
  }
}

template <class T>
__global__ void unary_kernel(UnaryOp op, UnaryArgs a, const T* x, T* y, int64_t n) {
  OASES_GRID_STRIDE(i, n) {
    if constexpr (std::is_integral_v<T>) {
      y[i] = unary_int<T>(op, a, x[i]);
    } else {
      using C = typename Acc<T>::type;
      store(y, i, unary_math<C>(op, a, static_cast<C>(load(x, i))));
    }
  }
}

template <class T>
__global__ void predicate_kernel(PredicateOp op, bool pos, bool neg, const T* x, uint8_t* y, int64_t n) {
  OASES_GRID_STRIDE(i, n) {
    if (op == PredicateOp::kNot) {
      y[i] = !static_cast<bool>(x[i]);
    } else {
      double v = static_cast<double>(load(x, i));
      y[i] = op == PredicateOp::kIsNaN ? isnan(v) : (isinf(v) && ((v > 0 && pos) || (v < 0 && neg)));
    }
  }
}

template <class C>
__device__ C binary_math(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv:
      if constexpr (std::is_integral_v<C>) {
        return b == C(0) ? C(0) : static_cast<C>(a / b);
      } else {
        return a / b;
      }
    case BinaryOp::kMax:
      if constexpr (!std::is_integral_v<C>) {
        if (isnan(a) || isnan(b)) return a + b;
      }
      return a > b ? a : b;
    case BinaryOp::kMin:
      if constexpr (!std::is_integral_v<C>) {
        if (isnan(a) || isnan(b)) return a + b;
      }
      return a < b ? a : b;
    case BinaryOp::kMod:
    case BinaryOp::kFmod: {
      bool f = op == BinaryOp::kFmod;
      if constexpr (std::is_integral_v<C>) {
        if (b == C(0)) return C(0);
        C r = static_cast<C>(a % b);
        if constexpr (std::is_signed_v<C>) {
          if (!f && r != 0 && ((r < 0) != (b < 0))) r = static_cast<C>(r + b);
        }
        return r;
      } else {
        C r = fmod(a, b);
        if (!f && r != 0 && ((r < 0) != (b < 0))) r += b;
        return r;
      }
    }
    case BinaryOp::kPRelu:
      if constexpr (std::is_unsigned_v<C>) {
        return a;
      } else {
        return a < C(0) ? static_cast<C>(b * a) : a;
      }
    case BinaryOp::kSwiGLU:
      if constexpr (!std::is_integral_v<C>) {
        return a * sigmoid_of(a) * b;
      } else {
        return a;
      }
    default: return a;
  }
}

template <class C>
__device__ uint8_t compare(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::kEqual: return a == b;
    case BinaryOp::kLess: return a < b;
    case BinaryOp::kGreater: return a > b;
    case BinaryOp::kLessEq: return a <= b;
    case BinaryOp::kGreaterEq: return a >= b;
    case BinaryOp::kAnd: return a != C(0) && b != C(0);
    case BinaryOp::kOr: return a != C(0) || b != C(0);
    case BinaryOp::kXor: return (a != C(0)) != (b != C(0));
    default: return 0;
  }
}

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, void* out, Iter it, Maps<3> m) {
  using C = typename Acc<T>::type;
  OASES_GRID_STRIDE(i, it.numel) {
    int64_t off[3];
    affine_offsets(it, m, i, off);
    C x = static_cast<C>(load(a, off[1])), y = static_cast<C>(load(b, off[2]));
    int64_t o = off[0];
    if (op >= BinaryOp::kEqual) {
      static_cast<uint8_t*>(out)[o] = compare<C>(op, x, y);
    } else {
      store(static_cast<T*>(out), o, binary_math<C>(op, x, y));
    }
  }
}

// Same-shaped contiguous operands (the common case: residual adds, gradient sums): 16-byte loads
// and stores, V elements a thread; the tail (n % V) one element a thread.
template <class T>
__global__ void binary_contiguous_kernel(BinaryOp op, const T* a, const T* b, T* out, int64_t n) {
  using C = typename Acc<T>::type;
  constexpr int V = 16 / sizeof(T);
  const int64_t nv = n / V;
  const uint4* av = reinterpret_cast<const uint4*>(a);
  const uint4* bv = reinterpret_cast<const uint4*>(b);
  uint4* ov = reinterpret_cast<uint4*>(out);
  OASES_GRID_STRIDE(i, nv) {
    uint4 x = av[i], y = bv[i], r;
    const T* xs = reinterpret_cast<const T*>(&x);
    const T* ys = reinterpret_cast<const T*>(&y);
    T* rs = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int j = 0; j < V; ++j) store(rs, j, binary_math<C>(op, static_cast<C>(load(xs, j)), static_cast<C>(load(ys, j))));
    ov[i] = r;
  }
  for (int64_t i = nv * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(out, i, binary_math<C>(op, static_cast<C>(load(a, i)), static_cast<C>(load(b, i))));
}

// The plan walks all three operands contiguously from their starts.
bool contiguous3(const NdPlan& p) {
  if (p.it.rank != 1 || p.maps.size() != 3) return false;
  for (const Affine& m : p.maps) {
    if (m.base != 0 || m.stride[0] != 1) return false;
  }
  return true;
}

// Pow with any exponent type: computed in double, with x*x for the common exponent 2.
template <class T, class U>
__global__ void pow_kernel(const T* a, const U* b, T* out, Iter it, Maps<3> m) {
  OASES_GRID_STRIDE(i, it.numel) {
    int64_t off[3];
    affine_offsets(it, m, i, off);
    double x = static_cast<double>(load(a, off[1]));
    double e = static_cast<double>(load(b, off[2]));
    double r = e == 2.0 ? x * x : pow(x, e);
    store(out, off[0], static_cast<typename Acc<T>::type>(r));
  }
}

template <class B>
__global__ void where_kernel(const uint8_t* c, const B* a, const B* b, B* out, Iter it, Maps<4> m) {
  OASES_GRID_STRIDE(i, it.numel) {
    int64_t off[4];
    affine_offsets(it, m, i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class B>
__global__ void copy_kernel(const B* src, B* dst, Iter it, Maps<2> m) {
  OASES_GRID_STRIDE(i, it.numel) {
    int64_t off[2];
    affine_offsets(it, m, i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <class B>
__global__ void fill_kernel(B* dst, int64_t n, B v) {
  OASES_GRID_STRIDE(i, n) {
    dst[i] = v;
  }
}

// Casts among float32, float16 and bfloat16 with 16-byte loads and stores, 8 elements a thread
// (the mixed-precision parameters to 16 bits and their gradients back: a scalar kernel with 2-byte
// stores moved them at about half the memory's speed); the conversions are cast_kernel's, so the
// bits are the same. x and y start on 16 bytes; the last n % 8 elements go one by one.
template <class F, class T>
__global__ void cast_vec8_kernel(const F* x, T* y, int64_t n) {
  static_assert(sizeof(F) * 8 % 16 == 0 && sizeof(T) * 8 % 16 == 0, "8 elements are whole 16-byte vectors");
  constexpr int kIn = static_cast<int>(sizeof(F) * 8 / 16), kOut = static_cast<int>(sizeof(T) * 8 / 16);
  const int64_t nv = n / 8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nv; v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint4 in[kIn], out[kOut];
#pragma unroll
    for (int j = 0; j < kIn; ++j) in[j] = reinterpret_cast<const uint4*>(x + v * 8)[j];
    const F* xs = reinterpret_cast<const F*>(in);
    T* ys = reinterpret_cast<T*>(out);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
        ys[j] = from_float<T>(static_cast<float>(load(xs, j)));
      } else {
        ys[j] = static_cast<T>(load(xs, j));
      }
    }
#pragma unroll
    for (int j = 0; j < kOut; ++j) reinterpret_cast<uint4*>(y + v * 8)[j] = out[j];
  }
  for (int64_t i = nv * 8 + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      y[i] = from_float<T>(static_cast<float>(load(x, i)));
    } else {
      y[i] = static_cast<T>(load(x, i));
    }
  }
}

template <class F, class T>
__global__ void cast_kernel(const F* x, T* y, int64_t n) {
  OASES_GRID_STRIDE(i, n) {
    if constexpr (std::is_integral_v<T> && !std::is_integral_v<F>) {
      double v = static_cast<double>(load(x, i));
      if (isnan(v)) v = 0;
      y[i] = std::is_same_v<T, uint8_t> ? static_cast<T>(v != 0.0) : static_cast<T>(trunc(v));
    } else if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      y[i] = from_float<T>(static_cast<float>(load(x, i)));
    } else {
      y[i] = static_cast<T>(load(x, i));
    }
  }
}

}  // namespace

void unary(UnaryOp op, const UnaryArgs& a, Elem t, const void* x, void* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(op, a, static_cast<const T*>(x), static_cast<T*>(y), n);
  };
  dispatch_numeric("unary", t, run);
  OASES_CUDA_CHECK_LAUNCH("unary_kernel");
}

void predicate(PredicateOp op, bool pos, bool neg, Elem t, const void* x, uint8_t* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_numeric("predicate", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    predicate_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(op, pos, neg, static_cast<const T*>(x), y, n);
  });
  OASES_CUDA_CHECK_LAUNCH("predicate_kernel");
}

void binary(BinaryOp op, Elem t, Elem tb, const void* a, const void* b, void* out, const NdPlan& p, cudaStream_t s) {
  if (p.it.numel <= 0) return;
  unsigned grid = grid_for(p.it.numel, kThreads);
  if (op == BinaryOp::kPow) {
    dispatch_numeric("Pow", t, [&](auto ta) {
      using T = typename decltype(ta)::type;
      dispatch_numeric("Pow exponent", tb, [&](auto tu) {
        using U = typename decltype(tu)::type;
        pow_kernel<T, U><<<grid, kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const U*>(b), static_cast<T*>(out), p.it,
                                                   Maps<3>{{p.maps[0], p.maps[1], p.maps[2]}});
      });
    });
  } else if (op < BinaryOp::kEqual && t == tb && (t == Elem::kF32 || t == Elem::kF16 || t == Elem::kBF16) && contiguous3(p) &&
             aligned16(a) && aligned16(b) && aligned16(out)) {
    dispatch_floating("binary", t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      int64_t n = p.it.numel;
      binary_contiguous_kernel<T><<<grid_for(std::max<int64_t>(1, n / (16 / static_cast<int64_t>(sizeof(T)))), kThreads), kThreads, 0, s>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
    });
  } else {
    dispatch_numeric("binary", t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      binary_kernel<T>
          <<<grid, kThreads, 0, s>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), out, p.it, Maps<3>{{p.maps[0], p.maps[1], p.maps[2]}});
    });
  }
  OASES_CUDA_CHECK_LAUNCH("binary_kernel");
}

void where(const uint8_t* cond, const void* a, const void* b, void* out, size_t es, const NdPlan& p, cudaStream_t s) {
  if (p.it.numel <= 0) return;
  dispatch_bits(es, [&](auto tag) {
    using B = typename decltype(tag)::type;
    where_kernel<B><<<grid_for(p.it.numel, kThreads), kThreads, 0, s>>>(
        cond, static_cast<const B*>(a), static_cast<const B*>(b), static_cast<B*>(out), p.it,
        Maps<4>{{p.maps[0], p.maps[1], p.maps[2], p.maps[3]}});
  });
  OASES_CUDA_CHECK_LAUNCH("where_kernel");
}

void cast(Elem from, Elem to, const void* x, void* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (from == to) {
    copy_bytes(x, y, static_cast<size_t>(n) * elem_size(from), s);
    return;
  }
  auto floating = [](Elem t) { return t == Elem::kF32 || t == Elem::kF16 || t == Elem::kBF16; };
  if (floating(from) && floating(to) && aligned16(x) && aligned16(y)) {
    dispatch_floating("Cast from", from, [&](auto tf) {
      using F = typename decltype(tf)::type;
      dispatch_floating("Cast to", to, [&](auto tt) {
        using T = typename decltype(tt)::type;
        cast_vec8_kernel<F, T><<<grid_for(std::max<int64_t>(1, n / 8), kThreads), kThreads, 0, s>>>(static_cast<const F*>(x),
                                                                                                     static_cast<T*>(y), n);
      });
    });
    OASES_CUDA_CHECK_LAUNCH("cast_vec8_kernel");
    return;
  }
  dispatch_numeric("Cast from", from, [&](auto tf) {
    using F = typename decltype(tf)::type;
    dispatch_numeric("Cast to", to, [&](auto tt) {
      using T = typename decltype(tt)::type;
      cast_kernel<F, T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const F*>(x), static_cast<T*>(y), n);
    });
  });
  OASES_CUDA_CHECK_LAUNCH("cast_kernel");
}

void copy(const void* src, void* dst, size_t es, const NdPlan& p, cudaStream_t s) {
  if (p.it.numel <= 0) return;
  if (aligned16(src) && aligned16(dst)) {
    NdPlan wide = p;
    if (widen_copy_plan(wide, es)) {
      copy_kernel<uint4><<<grid_for(wide.it.numel, kThreads), kThreads, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), wide.it,
                                                                                Maps<2>{{wide.maps[0], wide.maps[1]}});
      OASES_CUDA_CHECK_LAUNCH("copy_kernel (16-byte elements)");
      return;
    }
  }
  dispatch_bits(es, [&](auto tag) {
    using B = typename decltype(tag)::type;
    copy_kernel<B>
        <<<grid_for(p.it.numel, kThreads), kThreads, 0, s>>>(static_cast<const B*>(src), static_cast<B*>(dst), p.it, Maps<2>{{p.maps[0], p.maps[1]}});
  });
  OASES_CUDA_CHECK_LAUNCH("copy_kernel");
}

void fill(void* dst, int64_t n, size_t es, uint64_t bits, cudaStream_t s) {
  if (n <= 0) return;
  if (bits == 0) {
    OASES_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * es, s));
    return;
  }
  dispatch_bits(es, [&](auto tag) {
    using B = typename decltype(tag)::type;
    B v;
    memcpy(&v, &bits, sizeof(B));
    fill_kernel<B><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<B*>(dst), n, v);
  });
  OASES_CUDA_CHECK_LAUNCH("fill_kernel");
}

namespace {
// one block column of 1024 elements of a row per block; grid.y walks the rows
template <typename T>
__global__ void copy_rows_kernel(const T* src, int64_t sld, T* dst, int64_t dld, int64_t rows, int64_t cols, int64_t width) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 1024 + threadIdx.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* s = src + r * sld;
    T* d = dst + r * dld;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t c = c0 + i * 256;
      if (c < cols) {
        d[c] = s[c];
      } else if (c < width) {
        d[c] = T(0);
      }
    }
  }
}
}  // namespace

void copy_rows(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t rows, int64_t cols, size_t es, cudaStream_t s,
               int64_t zero_to) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t width = std::max(cols, zero_to);
  if (src_ld == cols && dst_ld == cols && width == cols) {
    copy_bytes(src, dst, static_cast<size_t>(rows * cols) * es, s);
    return;
  }
  dim3 grid(static_cast<unsigned>((width + 1023) / 1024), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  switch (es) {
    case 1: copy_rows_kernel<<<grid, 256, 0, s>>>(static_cast<const uint8_t*>(src), src_ld, static_cast<uint8_t*>(dst), dst_ld, rows, cols, width); break;
    case 2: copy_rows_kernel<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(src), src_ld, static_cast<uint16_t*>(dst), dst_ld, rows, cols, width); break;
    case 4: copy_rows_kernel<<<grid, 256, 0, s>>>(static_cast<const uint32_t*>(src), src_ld, static_cast<uint32_t*>(dst), dst_ld, rows, cols, width); break;
    case 8: copy_rows_kernel<<<grid, 256, 0, s>>>(static_cast<const uint64_t*>(src), src_ld, static_cast<uint64_t*>(dst), dst_ld, rows, cols, width); break;
    default: throw std::runtime_error("[cuda copy_rows] element size " + std::to_string(es) + " is not supported");
  }
  OASES_CUDA_CHECK_LAUNCH("copy_rows_kernel");
}

void copy_bytes(const void* src, void* dst, size_t bytes, cudaStream_t s) {
  if (bytes == 0 || src == dst) return;
  OASES_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
}

}  // namespace oases::cuda
