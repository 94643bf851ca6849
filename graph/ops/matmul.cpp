// MatMul (numpy semantics: 1-D operands promoted, batch dimensions broadcast) and Gemm
// (Y = alpha·op(A)·op(B) + beta·C, C broadcast to [M, N]).
#include "graph/ops/op_utils.h"

namespace oases {

using namespace ops;

namespace {

Status infer_matmul(InferContext& c) {
  Shape a = c.shape(0), b = c.shape(1);
  if (c.dtype(0) != c.dtype(1)) {
    return c.fail("operands have different types ({} and {})", dtype_name(c.dtype(0)), dtype_name(c.dtype(1)));
  }
  if (a.empty() || b.empty()) return c.fail("operands must have rank >= 1, got {} and {}", shape_str(a), shape_str(b));
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  int64_t k_a = a.back(), k_b = b[b.size() - 2];
  if (k_a != k_b) {
    return c.fail("inner dimensions differ: {} x {} ({} vs {})", shape_str(c.shape(0)), shape_str(c.shape(1)), k_a, k_b);
  }
  Shape batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  auto batch = broadcast_shapes(batch_a, batch_b);
  if (!batch) return c.fail("batch dimensions: {}", batch.status().message());
  Shape out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b.back());
  c.set_output(0, c.dtype(0), out);
  return Status::ok();
}

OpCost matmul_cost(const Graph& g, const Node& n) {
  const Shape& a = g.value(n.inputs[0]).shape;
  int64_t k = a.empty() ? 1 : a.back();
  return OpCost{2.0 * out_numel(g, n) * static_cast<double>(k), io_bytes(g, n)};
}

}  // namespace

void register_matmul_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.op_type = "MatMul";
    s.min_inputs = s.max_inputs = 2;
    s.infer = infer_matmul;
    s.cost = matmul_cost;
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.op_type = "Gemm";
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.infer = [](InferContext& c) {
      const Shape& a = c.shape(0);
      const Shape& b = c.shape(1);
      if (a.size() != 2 || b.size() != 2) return c.fail("A {} and B {} must be matrices", shape_str(a), shape_str(b));
      bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
      int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
      int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
      if (k != kb) return c.fail("inner dimensions differ: A {} B {} (transA={}, transB={})", shape_str(a), shape_str(b), ta, tb);
      if (c.has_input(2)) {
        auto bc = broadcast_shapes(c.shape(2), Shape{m, n});
        if (!bc || *bc != Shape{m, n}) return c.fail("C {} does not broadcast to [{}, {}]", shape_str(c.shape(2)), m, n);
      }
      c.set_output(0, c.dtype(0), {m, n});
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) {
      const Shape& a = g.value(n.inputs[0]).shape;
      int64_t k = n.attrs.get_int("transA", 0) ? a[0] : a[1];
      return OpCost{2.0 * out_numel(g, n) * static_cast<double>(k), io_bytes(g, n)};
    };
    r.add(std::move(s));
  }
}

}  // namespace oases
