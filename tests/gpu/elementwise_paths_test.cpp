// The elementwise kernels' fast paths against the CPU, bit for bit: same-shaped contiguous binary
// ops with 16-byte vectors (and a tail that is not a whole vector), and copies moving 16-byte
// elements (transposes that keep the last dim), beside shapes that take the general kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "executor/executor.h"
#include "tests/gpu/gpu_test_common.h"

namespace oases {
namespace {

Tensor ramp(DType t, const Shape& shape) {
  Tensor x(t, shape);
  for (int64_t i = 0; i < x.numel(); ++i) store_from_double(x.raw_mutable(), t, i, 0.01 * static_cast<double>((i * 37) % 101) - 0.4);
  return x;
}

// Runs one-node graph g on both devices; the outputs must have the same bits.
void expect_same_bits(const Graph& g, const std::map<std::string, Tensor>& feeds, const std::string& what) {
  ExecOptions gpu;
  gpu.device = "cuda";
  auto a = Executor::create(g);
  auto b = Executor::create(g, gpu);
  ASSERT_TRUE(a && b) << what;
  auto x = (*a)->run(feeds);
  auto y = (*b)->run(feeds);
  ASSERT_TRUE(x && y) << what;
  for (size_t i = 0; i < x->size(); ++i) {
    ASSERT_EQ((*x)[i].nbytes(), (*y)[i].nbytes()) << what;
    EXPECT_EQ(std::memcmp((*x)[i].raw(), (*y)[i].raw(), (*x)[i].nbytes()), 0) << what << " output " << i;
  }
}

TEST(ElementwisePaths, ContiguousBinaryOpsWithTails) {
  REQUIRE_GPU();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
      for (Shape s : {Shape{3, 333337}, Shape{8, 1024}, Shape{5}, Shape{2, 3, 4}}) {
        Graph g;
        ValueId a = g.add_input("a", t, s), b = g.add_input("b", t, s);
        ValueId y = g.add_value("y", t, s, true);
        g.add_node(op, {a, b}, {y}, {}, "op");
        g.set_outputs({y});
        Tensor tb = ramp(t, s);
        for (int64_t i = 0; i < tb.numel(); ++i) store_from_double(tb.raw_mutable(), t, i, 1.5 + load_as_double(tb.raw(), t, i));
        expect_same_bits(g, {{"a", ramp(t, s)}, {"b", tb}}, std::string(op) + " " + dtype_name(t) + shape_str(s));
      }
    }
  }
}

TEST(ElementwisePaths, TransposesWithAndWithoutWideElements) {
  REQUIRE_GPU();
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
  };
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : {Case{{2, 37, 4, 64}, {0, 2, 1, 3}}, Case{{2, 5, 3, 7}, {0, 2, 1, 3}}, Case{{3, 16, 8}, {1, 0, 2}},
                          Case{{9, 24}, {1, 0}}}) {
      Graph g;
      ValueId x = g.add_input("x", t, c.shape);
      Shape out;
      for (int64_t p : c.perm) out.push_back(c.shape[static_cast<size_t>(p)]);
      ValueId y = g.add_value("y", t, out, true);
      g.add_node("Transpose", {x}, {y}, AttrMap{{"perm", Attribute::of_ints(c.perm)}}, "t");
      g.set_outputs({y});
      expect_same_bits(g, {{"x", ramp(t, c.shape)}}, std::string("Transpose ") + dtype_name(t) + shape_str(c.shape));
    }
  }
}

// Sums over leading axes with the kept axes contiguous (bias gradients: the column kernel, with
// 16-byte loads where the columns allow, and element by element for 1003 columns) and over other
// axes (the general kernels), against the CPU within fp32 rounding of the sums.
TEST(ElementwisePaths, ReductionsOverLeadingAxes) {
  REQUIRE_GPU();
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
    const char* op;
  };
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : {Case{{3, 333, 1000}, {0, 1}, "ReduceSum"}, Case{{8192, 64}, {0}, "ReduceSum"}, Case{{70, 4096}, {0}, "ReduceMean"},
                          Case{{5, 7, 9}, {0, 1}, "ReduceSum"}, Case{{64, 3, 100}, {0, 2}, "ReduceSum"},
                          Case{{2, 100, 1003}, {0, 1}, "ReduceSum"}, Case{{4, 512, 3072}, {0, 1}, "ReduceSum"}}) {
      Graph g;
      ValueId x = g.add_input("x", t, c.shape);
      Shape out;
      for (size_t d = 0; d < c.shape.size(); ++d) {
        if (std::find(c.axes.begin(), c.axes.end(), static_cast<int64_t>(d)) == c.axes.end()) out.push_back(c.shape[d]);
      }
      ValueId y = g.add_value("y", t, out, true);
      // the canonical form: axes as an attribute
      g.add_node(c.op, {x}, {y}, AttrMap{{"keepdims", Attribute::of_int(0)}, {"axes", Attribute::of_ints(c.axes)}}, "r");
      g.set_outputs({y});
      std::map<std::string, Tensor> feeds{{"x", ramp(t, c.shape)}};
      ExecOptions gpu;
      gpu.device = "cuda";
      auto ca = Executor::create(g);
      auto cb = Executor::create(g, gpu);
      ASSERT_TRUE(ca && cb);
      auto ra = (*ca)->run(feeds);
      auto rb = (*cb)->run(feeds);
      ASSERT_TRUE(ra && rb) << (rb ? ra.status().message() : rb.status().message());
      const Tensor &p = (*ra)[0], &q = (*rb)[0];
      double top = 1e-6, err = 0;
      for (int64_t i = 0; i < p.numel(); ++i) {
        double u = load_as_double(p.raw(), t, i), v = load_as_double(q.raw(), t, i);
        top = std::max(top, std::abs(u));
        err = std::max(err, std::abs(u - v));
      }
      EXPECT_LE(err, (t == DType::kF32 ? 1e-5 : 1e-2) * top) << c.op << " " << dtype_name(t) << shape_str(c.shape);
    }
  }
}

}  // namespace
}  // namespace oases
