// MatMul (numpy semantics: 1-D operands promoted, batch dimensions broadcast) and Gemm
// (Y = alpha·op(A)·op(B) + beta·C, C broadcast to [M, N]).
#include "graph/autodiff.h"
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

  // --- gradient rules -------------------------------------------------------------------
  // MatMul: dA = dY·Bᵀ, dB = Aᵀ·dY through oases.MatMulT (no transposed copies). A weight
  // (rank-2 B under batched A) gets its gradient as one [batch·M, K]ᵀ x [batch·M, N] product.
  r.find_mutable("", "MatMul")->grad = [](GradContext& c) {
    ValueId a = c.input(0), b = c.input(1), dy = c.grad_out(0);
    Shape sa = c.shape(a), sb = c.shape(b);
    if (sa.size() == 1 || sb.size() == 1) {
      // promote vectors to matrices, then reshape the gradients back
      ValueId a2 = sa.size() == 1 ? c.op("Reshape", {a}, AttrMap{{"shape", Attribute::of_ints({1, sa[0]})}}) : a;
      ValueId b2 = sb.size() == 1 ? c.op("Reshape", {b}, AttrMap{{"shape", Attribute::of_ints({sb[0], 1})}}) : b;
      Shape sa2 = c.shape(a2), sb2 = c.shape(b2);
      auto bs = broadcast_shapes(Shape(sa2.begin(), sa2.end() - 2), Shape(sb2.begin(), sb2.end() - 2));
      Shape full = *bs;
      full.push_back(sa2[sa2.size() - 2]);
      full.push_back(sb2.back());
      ValueId dy2 = c.op("Reshape", {dy}, AttrMap{{"shape", Attribute::of_ints(full)}});
      if (c.needs(0)) {
        ValueId da = c.unbroadcast(c.op("MatMulT", {dy2, b2}, AttrMap{{"trans_b", Attribute::of_int(1)}}, kOasesDomain), c.shape(a2));
        c.add_grad(0, c.op("Reshape", {da}, AttrMap{{"shape", Attribute::of_ints(sa)}}));
      }
      if (c.needs(1)) {
        ValueId db = c.unbroadcast(c.op("MatMulT", {a2, dy2}, AttrMap{{"trans_a", Attribute::of_int(1)}}, kOasesDomain), c.shape(b2));
        c.add_grad(1, c.op("Reshape", {db}, AttrMap{{"shape", Attribute::of_ints(sb)}}));
      }
      return Status::ok();
    }
    if (c.needs(0)) {
      c.add_grad(0, c.unbroadcast(c.op("MatMulT", {dy, b}, AttrMap{{"trans_b", Attribute::of_int(1)}}, kOasesDomain), sa));
    }
    if (c.needs(1)) {
      if (sb.size() == 2 && sa.size() > 2) {
        int64_t rows = shape_numel(sa) / sa.back();
        ValueId a2 = c.op("Reshape", {a}, AttrMap{{"shape", Attribute::of_ints({rows, sa.back()})}});
        ValueId d2 = c.op("Reshape", {dy}, AttrMap{{"shape", Attribute::of_ints({rows, sb.back()})}});
        c.add_grad(1, c.op("MatMulT", {a2, d2}, AttrMap{{"trans_a", Attribute::of_int(1)}}, kOasesDomain));
      } else {
        c.add_grad(1, c.unbroadcast(c.op("MatMulT", {a, dy}, AttrMap{{"trans_a", Attribute::of_int(1)}}, kOasesDomain), sb));
      }
    }
    return Status::ok();
  };
  // Gemm: Y = α·op(A)·op(B) + β·C
  r.find_mutable("", "Gemm")->grad = [](GradContext& c) {
    bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
    float alpha = c.attrs().get_float("alpha", 1.f), beta = c.attrs().get_float("beta", 1.f);
    ValueId a = c.input(0), b = c.input(1), dy = c.grad_out(0);
    ValueId sdy = alpha == 1.f ? dy : c.op("Mul", {dy, c.scalar(alpha, c.dtype(dy))});
    auto mm = [&](ValueId x, ValueId y, bool tx, bool ty) {
      return c.op("MatMulT", {x, y}, AttrMap{{"trans_a", Attribute::of_int(tx)}, {"trans_b", Attribute::of_int(ty)}}, kOasesDomain);
    };
    // op(A) = A or Aᵀ: d op(A) = dY·op(B)ᵀ
    if (c.needs(0)) c.add_grad(0, ta ? mm(b, sdy, tb, true) : mm(sdy, b, false, !tb));
    if (c.needs(1)) c.add_grad(1, tb ? mm(sdy, a, true, ta) : mm(a, sdy, !ta, false));
    if (c.node().has_input(2) && c.needs(2)) {
      ValueId g = beta == 1.f ? dy : c.op("Mul", {dy, c.scalar(beta, c.dtype(dy))});
      c.add_grad(2, c.unbroadcast(g, c.shape(c.input(2))));
    }
    return Status::ok();
  };
}

}  // namespace oases
