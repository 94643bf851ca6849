#include "kernels/cpu/reduce.h"

#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace oases::kernels {

namespace {

template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

template <class T>
T finish(ReduceKind k, Acc<T> acc, int64_t n, T maxv) {
  switch (k) {
    case ReduceKind::kMean: return static_cast<T>(acc / static_cast<Acc<T>>(n ? n : 1));
    case ReduceKind::kL2: return static_cast<T>(std::sqrt(static_cast<double>(acc)));
    case ReduceKind::kLogSum: return static_cast<T>(std::log(static_cast<double>(acc)));
    case ReduceKind::kLogSumExp: return static_cast<T>(static_cast<double>(maxv) + std::log(static_cast<double>(acc)));
    default: return static_cast<T>(acc);
  }
}

template <class T>
void reduce_run(ReduceKind k, const T* p, int64_t n, int64_t stride, T* out) {
  if (k == ReduceKind::kMax || k == ReduceKind::kMin) {
    if (n == 0) {
      *out = k == ReduceKind::kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
      return;
    }
    T m = p[0];
    for (int64_t i = 1; i < n; ++i) {
      T v = p[i * stride];
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(v)) {
          m = v;
          break;
        }
      }
      m = k == ReduceKind::kMax ? (v > m ? v : m) : (v < m ? v : m);
    }
    *out = m;
    return;
  }
  Acc<T> acc = k == ReduceKind::kProd ? Acc<T>(1) : Acc<T>(0);
  T maxv = T(0);
  if (k == ReduceKind::kLogSumExp && n > 0) {
    maxv = p[0];
    for (int64_t i = 1; i < n; ++i) maxv = std::max(maxv, p[i * stride]);
  }
  for (int64_t i = 0; i < n; ++i) {
    Acc<T> v = static_cast<Acc<T>>(p[i * stride]);
    switch (k) {
      case ReduceKind::kProd: acc *= v; break;
      case ReduceKind::kL1: acc += v < 0 ? -v : v; break;
      case ReduceKind::kL2:
      case ReduceKind::kSumSquare: acc += v * v; break;
      case ReduceKind::kLogSumExp: acc += static_cast<Acc<T>>(std::exp(static_cast<double>(v) - static_cast<double>(maxv))); break;
      default: acc += v;
    }
  }
  *out = finish<T>(k, acc, n, maxv);
}

}  // namespace

template <class T>
void reduce(ReduceKind k, const T* in, const std::vector<int64_t>& shape, const std::vector<int64_t>& axes, T* out) {
  int64_t r = static_cast<int64_t>(shape.size());
  std::vector<bool> red(static_cast<size_t>(r), false);
  for (int64_t a : axes) red[a] = true;
  std::vector<int64_t> st(static_cast<size_t>(r), 1);
  for (int64_t i = r - 2; i >= 0; --i) st[i] = st[i + 1] * shape[i + 1];
  std::vector<int64_t> kshape, kst, rshape, rst;
  for (int64_t i = 0; i < r; ++i) {
    if (red[i]) {
      rshape.push_back(shape[i]);
      rst.push_back(st[i]);
    } else {
      kshape.push_back(shape[i]);
      kst.push_back(st[i]);
    }
  }
  int64_t nout = 1, nred = 1;
  for (int64_t d : kshape) nout *= d;
  for (int64_t d : rshape) nred *= d;
  // trailing reduced axes: each output reads one contiguous run
  bool trailing = true;
  for (int64_t i = 0; i < r; ++i) {
    if (red[i] && i < r - static_cast<int64_t>(rshape.size())) trailing = false;
  }
  if (trailing) {
    parallel_range(nout, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, nred)), [&](int64_t o_begin, int64_t o_end) {
      for (int64_t o = o_begin; o < o_end; ++o) reduce_run<T>(k, in + o * nred, nred, 1, out + o);
    });
    return;
  }
  // leading reduced axes with a plain sum/mean: accumulate rows (bias gradients)
  bool leading = true;
  for (int64_t i = 0; i < static_cast<int64_t>(rshape.size()); ++i) {
    if (!red[i]) leading = false;
  }
  if (leading && (k == ReduceKind::kSum || k == ReduceKind::kMean) && std::is_floating_point_v<T>) {
    // column blocks in parallel; each column still sums its rows in order
    parallel_range(nout, std::max<int64_t>(64, (1 << 15) / std::max<int64_t>(1, nred)), [&](int64_t o0, int64_t o1) {
      std::vector<Acc<T>> acc(static_cast<size_t>(o1 - o0), Acc<T>(0));
      for (int64_t j = 0; j < nred; ++j) {
        const T* row = in + j * nout;
        for (int64_t o = o0; o < o1; ++o) acc[o - o0] += static_cast<Acc<T>>(row[o]);
      }
      for (int64_t o = o0; o < o1; ++o) out[o] = finish<T>(k, acc[o - o0], nred, T(0));
    });
    return;
  }
  // general: gather each output's reduced elements into a scratch run
  parallel_range(nout, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, nred)), [&](int64_t o_begin, int64_t o_end) {
    std::vector<T> scratch(static_cast<size_t>(nred));
    for (int64_t o = o_begin; o < o_end; ++o) {
      int64_t rem = o, base = 0;
      for (int64_t d = static_cast<int64_t>(kshape.size()) - 1; d >= 0; --d) {
        base += (rem % kshape[d]) * kst[d];
        rem /= kshape[d];
      }
      for (int64_t j = 0; j < nred; ++j) {
        int64_t rr = j, off = base;
        for (int64_t d = static_cast<int64_t>(rshape.size()) - 1; d >= 0; --d) {
          off += (rr % rshape[d]) * rst[d];
          rr /= rshape[d];
        }
        scratch[j] = in[off];
      }
      reduce_run<T>(k, scratch.data(), nred, 1, out + o);
    }
  });
}

template void reduce<float>(ReduceKind, const float*, const std::vector<int64_t>&, const std::vector<int64_t>&, float*);
template void reduce<double>(ReduceKind, const double*, const std::vector<int64_t>&, const std::vector<int64_t>&, double*);
template void reduce<int64_t>(ReduceKind, const int64_t*, const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t*);
template void reduce<int32_t>(ReduceKind, const int32_t*, const std::vector<int64_t>&, const std::vector<int64_t>&, int32_t*);
template void reduce<uint8_t>(ReduceKind, const uint8_t*, const std::vector<int64_t>&, const std::vector<int64_t>&, uint8_t*);
template void reduce<int8_t>(ReduceKind, const int8_t*, const std::vector<int64_t>&, const std::vector<int64_t>&, int8_t*);
template void reduce<uint32_t>(ReduceKind, const uint32_t*, const std::vector<int64_t>&, const std::vector<int64_t>&, uint32_t*);
template void reduce<uint64_t>(ReduceKind, const uint64_t*, const std::vector<int64_t>&, const std::vector<int64_t>&, uint64_t*);

}  // namespace oases::kernels
