#include "kernels/cpu/dropout.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace oases::kernels {

namespace {

// splitmix64's finaliser: counter-based random bits.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t chunk, std::string_view key_node) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the node's name
  for (char ch : key_node) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return mix64(seed ^ mix64(h ^ mix64(step * 0x100000001b3ull + chunk)));
}

void dropout(const float* x, float* y, uint8_t* mask, const std::vector<int64_t>& local, const std::vector<int64_t>& whole,
             const std::vector<int64_t>& offsets, uint64_t key, float ratio) {
  const size_t r = local.size();
  std::vector<int64_t> mstride(r, 1);
  for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) mstride[d] = mstride[d + 1] * whole[d + 1];
  bool identity = true;
  int64_t n = 1;
  for (size_t d = 0; d < r; ++d) {
    identity &= offsets[d] == 0 && whole[d] == local[d];
    n *= local[d];
  }
  float scale = 1.f / (1.f - ratio);
  uint64_t threshold = static_cast<uint64_t>(static_cast<double>(ratio) * 18446744073709551616.0);
  int64_t inner = r ? local[r - 1] : 1;
  const int64_t rows = n / std::max<int64_t>(1, inner);
  parallel_range(rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, inner)), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      int64_t base = 0;  // index in the whole tensor of this row's first element
      if (identity) {
        base = row * inner;
      } else {
        int64_t rem = row;
        for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) {
          base += (rem % local[static_cast<size_t>(d)] + offsets[static_cast<size_t>(d)]) * mstride[static_cast<size_t>(d)];
          rem /= local[static_cast<size_t>(d)];
        }
        if (r) base += offsets[r - 1];
      }
      for (int64_t j = 0; j < inner; ++j) {
        int64_t i = row * inner + j;
        bool keep = mix64(key + static_cast<uint64_t>(base + j)) >= threshold;
        y[i] = keep ? x[i] * scale : 0.f;
        if (mask) mask[i] = keep;
      }
    }
  });
}

}  // namespace oases::kernels
