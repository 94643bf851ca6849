// The largest element difference of two tensors relative to the second's largest magnitude, what
// the unit tests that compare a rewritten or distributed run with a reference check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/dtype.h"
#include "graph/tensor.h"

namespace oases::test {

// max |a - b| / max |b| (floored at 1e-12); a shape mismatch is a test failure and returns infinity.
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  double err = 0, ref = 1e-12;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = load_as_double(a.raw(), a.dtype(), i), y = load_as_double(b.raw(), b.dtype(), i);
    err = std::max(err, std::abs(x - y));
    ref = std::max(ref, std::abs(y));
  }
  return err / ref;
}

}  // namespace oases::test
