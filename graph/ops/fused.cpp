// The executors' fused ops (domain "oases.cpu" for the CPU kernels, "oases.device" for a device's:
// FusedMatMul, Attention, AttentionGrad and the 16-bit losses; made by the executor's fusion from
// the canonical graph of one rank: never sharded, never differentiated). Their shape and cost rules
// live here like every other op's, so the profiler and the simulator charge them without special
// cases.
//   FusedMatMul(A, B[, bias[, residual]]; trans_a, trans_b, activation) -> Y[, P]
//     Y = act(op(A)·op(B) + bias) [+ residual]: A [..., M, K] ([..., K, M] with trans_a), B [..., K, N]
//     ([..., N, K] with trans_b), bias [N], residual shaped as Y; batch dims broadcast as in MatMul,
//     a rank-1 A or B promoted as in MatMul. oases.device.FusedMatMul may also write P =
//     op(A)·op(B) + bias, the activation's input (what its gradient reads), beside Y.
//   oases.device.MatMulGeluGrad(A, B, X; trans_a, trans_b, approximate) -> (dX[, dbias]):
//     dX = GeluGrad(op(A)·op(B), X), dbias = dX summed over every axis but the last ([1, ..., N]).
//   Attention(q_src, k_src, v_src[, mask]; dims [B, H, Hkv, Tq, Tk, D, Dv], q/k/v/o_layout, causal,
//     scale) -> (O, lse): oases.Attention reading q, k, v with strides from their sources; O is
//     [B, H, Tq, Dv], or [B, Tq, H, Dv] when o_layout's head stride is not above its time stride
//     (the head transpose that followed is folded in); lse [B, H, Tq] float32.
//     oases.device.Attention: the same for a device program.
//   oases.device.AttentionGrad(dO_src, q_src, k_src, v_src, O_src, lse[, mask]; dims, q/k/v_layout,
//     o_layout, dout_layout, dq/dk/dv_layout [offset, batch, head, time strides], packed_shape,
//     causal, scale) -> (dq, dk, dv), or one output holding all three (packed_shape [B, T, W]: the
//     gradient of a fused qkv projection, the Concat of the Split's gradient folded in); each
//     unpacked gradient is [B, H, T, E] or, with its head transpose folded in, [B, T, H, E].
//   AddGatherGrad(X, dy, indices; axis) -> Y = X + GatherGrad(dy, indices), shaped as X.
//   oases.device.SoftmaxCrossEntropyLoss(scores16, labels[, weights]; the ONNX op's attributes)
//     -> loss float32: the ONNX op on 16-bit scores widened per element (the Cast to float32 the
//     mixed-precision pass put before the loss is folded in); no log_prob output.
//   oases.device.SoftmaxCrossEntropyGrad(dloss, scores16, labels[, weights]; half_output) ->
//     dscores: float32, or the scores' 16-bit type with half_output 1 (the Cast back after the
//     gradient folded in: rounded once, as the Cast would).
#include "graph/ops/op_utils.h"

namespace oases {

using namespace ops;

namespace {

constexpr const char* kCpuFusedDomain = "oases.cpu";

OpSchema fused_schema(const std::string& op, int min_in, int max_in, int max_out, const std::string& doc,
                      const char* domain = kCpuFusedDomain) {
  OpSchema s;
  s.domain = domain;
  s.op_type = op;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.max_outputs = max_out;
  s.foldable = false;
  s.differentiable = false;  // made after autodiff, in a program's own graph
  s.traits = kTraitPostPartition;
  s.doc = doc;
  return s;
}

}  // namespace

void register_fused_ops(OpRegistry& r) {
  // op(A)·op(B)'s shape (MatMul's rules with the transpose flags), or the failure
  auto product_shape = [](InferContext& c, Shape* out) {
    Shape a = c.shape(0), b = c.shape(1);
    if (a.empty() || b.empty()) return c.fail("operands must have rank >= 1, got {} and {}", shape_str(a), shape_str(b));
    bool a_vec = a.size() == 1, b_vec = b.size() == 1;
    if (a_vec) a.insert(a.begin(), 1);
    if (b_vec) b.push_back(1);
    if (c.attrs().get_int("trans_a", 0)) std::swap(a[a.size() - 1], a[a.size() - 2]);
    if (c.attrs().get_int("trans_b", 0)) std::swap(b[b.size() - 1], b[b.size() - 2]);
    if (a.back() != b[b.size() - 2]) return c.fail("inner dimensions differ: {} x {}", shape_str(a), shape_str(b));
    auto batch = broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
    if (!batch) return c.fail("{}", batch.status().message());
    *out = *batch;
    if (!a_vec) out->push_back(a[a.size() - 2]);
    if (!b_vec) out->push_back(b.back());
    return Status::ok();
  };
  // one GEMM's FLOPs; every operand read once and the results written
  auto product_cost = [](const Graph& g, const Node& n) {
    OpCost c{0, io_bytes(g, n)};
    const Shape& a = g.value(n.inputs[0]).shape;
    if (a.size() >= 2 && n.output(0) != kNoId) {
      double k = static_cast<double>(n.attrs.get_int("trans_a", 0) ? a[a.size() - 2] : a.back());
      c.flops = 2.0 * out_numel(g, n) * k;
    }
    return c;
  };
  for (const char* domain : {kCpuFusedDomain, "oases.device"}) {
    // a device program's product may also write the activation's input (output 1, the GELU's
    // pre-activation that its gradient reads: cuBLASLt's GELU_AUX epilogue)
    const bool device = std::string(domain) == "oases.device";
    OpSchema s = fused_schema("FusedMatMul", 2, 4, device ? 2 : 1, "act(op(A)·op(B) + bias) [+ residual] in one GEMM (executor fusion)", domain);
    s.traits |= kTraitLinear | kTraitComputeBound;
    s.infer = [product_shape](InferContext& c) {
      Shape out;
      OASES_RETURN_IF_ERROR(product_shape(c, &out));
      if (c.has_input(2) && c.shape(2) != Shape{out.empty() ? 1 : out.back()}) {
        return c.fail("bias {} is not [N] for the product {}", shape_str(c.shape(2)), shape_str(out));
      }
      if (c.has_input(3) && c.shape(3) != out)
        return c.fail("residual {} is not shaped as the product {}", shape_str(c.shape(3)), shape_str(out));
      if (c.has_output(1)) {
        std::string act = c.attrs().get_string("activation", "");
        if (act.empty() || act == "none" || c.has_input(3)) return c.fail("a pre-activation output needs an activation and no residual");
        c.set_output(1, c.dtype(0), out);
      }
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = product_cost;
    r.add(std::move(s));
  }
  {
    // oases.device.MatMulGeluGrad(A, B, X; trans_a, trans_b, approximate) -> (dX[, dbias]):
    // dX = GeluGrad(op(A)·op(B), X) and dbias its sums over every axis but the last, shaped
    // [1, ..., 1, N] (the bias gradient's ReduceSum with keepdims): the backward product, the GELU's
    // gradient and the bias gradient in one GEMM (cuBLASLt's DGELU_BGRAD epilogue)
    OpSchema s = fused_schema("MatMulGeluGrad", 3, 3, 2, "GeluGrad(op(A)·op(B), X) and its column sums in one GEMM (device fusion)",
                              "oases.device");
    s.traits |= kTraitComputeBound;
    s.infer = [product_shape](InferContext& c) {
      Shape out;
      OASES_RETURN_IF_ERROR(product_shape(c, &out));
      std::string approx = c.attrs().get_string("approximate", "none");
      if (approx != "none" && approx != "tanh") return c.fail("approximate must be 'none' or 'tanh', got '{}'", approx);
      if (out.empty()) return c.fail("the product must have rank >= 1");
      if (c.shape(2) != out || c.dtype(2) != c.dtype(0))
        return c.fail("the activation's input {} is not the product {} of its type", shape_str(c.shape(2)), shape_str(out));
      c.set_output(0, c.dtype(0), out);
      if (c.has_output(1)) {
        Shape sums(out.size(), 1);
        sums.back() = out.back();
        c.set_output(1, c.dtype(0), sums);
      }
      return Status::ok();
    };
    s.cost = product_cost;
    r.add(std::move(s));
  }
  // oases.Attention's and oases.AttentionGrad's costs (graph/ops/attention.cpp, grad_ops.cpp) from
  // the dims attribute: per score, 2D + 2Dv + 5 flops forward; the backward recomputes q·kᵀ, then
  // dV, dP, dQ, dK. Bytes: the tensors read and written, not the sources they lie in (q, k and v
  // may be three views of one fused projection), plus the mask and lse.
  auto attention_cost = [](bool backward) {
    return [backward](const Graph& g, const Node& n) {
      std::vector<int64_t> d = n.attrs.get_ints("dims");
      if (d.size() != 7) return OpCost{0, io_bytes(g, n)};
      const double D = static_cast<double>(d[5]), Dv = static_cast<double>(d[6]);
      const double queries = static_cast<double>(d[0] * d[1] * d[3]), keys = static_cast<double>(d[0] * d[2] * d[4]);
      double flops = queries * static_cast<double>(d[4]) * (backward ? 6.0 * D + 4.0 * Dv + 8.0 : 2.0 * D + 2.0 * Dv + 5.0);
      if (n.attrs.get_int("causal", 0)) flops *= 0.5;
      const int q_slot = backward ? 1 : 0, mask_slot = backward ? 6 : 3;
      const double es = static_cast<double>(dtype_size(g.value(n.inputs[static_cast<size_t>(q_slot)]).dtype));
      // q, k, v, O (and dO); the backward pass writes dq, dk, dv as well
      double elems = queries * D + keys * (D + Dv) + queries * Dv;
      if (backward) elems += queries * Dv + queries * D + keys * (D + Dv);
      double bytes = elems * es + queries * 4.0;  // and lse
      if (n.has_input(mask_slot)) bytes += static_cast<double>(g.value(n.inputs[static_cast<size_t>(mask_slot)]).nbytes());
      return OpCost{flops, bytes};
    };
  };
  auto check_layouts = [](InferContext& c, std::initializer_list<const char*> four, std::initializer_list<const char*> three) {
    for (const char* l : four) {
      if (c.attrs().get_ints(l).size() != 4) return c.fail("{} must be [offset, batch, head, time strides]", l);
    }
    for (const char* l : three) {
      if (c.attrs().get_ints(l).size() != 3) return c.fail("{} must be [batch, head, time strides]", l);
    }
    return Status::ok();
  };
  // [B, H, T, E] or [B, T, H, E] as the layout's head stride is above its time stride or not
  auto laid_out = [](const std::vector<int64_t>& l, size_t first, int64_t b, int64_t h, int64_t t, int64_t e) {
    return l[first + 1] > l[first + 2] ? Shape{b, h, t, e} : Shape{b, t, h, e};
  };
  for (const char* domain : {kCpuFusedDomain, "oases.device"}) {
    OpSchema s = fused_schema("Attention", 3, 4, 2, "oases.Attention reading and writing through strides (executor fusion)", domain);
    s.traits |= kTraitComputeBound;
    s.float32_inputs = {3};
    s.infer = [check_layouts, laid_out](InferContext& c) {
      std::vector<int64_t> d = c.attrs().get_ints("dims"), o = c.attrs().get_ints("o_layout");
      if (d.size() != 7) return c.fail("dims must be [B, H, Hkv, Tq, Tk, D, Dv], got {} values", d.size());
      OASES_RETURN_IF_ERROR(check_layouts(c, {"q_layout", "k_layout", "v_layout"}, {"o_layout"}));
      c.set_output(0, c.dtype(0), laid_out(o, 0, d[0], d[1], d[3], d[6]));
      if (c.has_output(1)) c.set_output(1, DType::kF32, {d[0], d[1], d[3]});
      return Status::ok();
    };
    s.cost = attention_cost(false);
    r.add(std::move(s));
  }
  {
    OpSchema s = fused_schema("AttentionGrad", 6, 7, 3,
                              "oases.AttentionGrad reading and writing through strides (device fusion)", "oases.device");
    s.traits |= kTraitComputeBound;
    s.float32_inputs = {5, 6};
    s.infer = [check_layouts, laid_out](InferContext& c) {
      std::vector<int64_t> d = c.attrs().get_ints("dims");
      if (d.size() != 7) return c.fail("dims must be [B, H, Hkv, Tq, Tk, D, Dv], got {} values", d.size());
      OASES_RETURN_IF_ERROR(check_layouts(c, {"q_layout", "k_layout", "v_layout", "dq_layout", "dk_layout", "dv_layout"},
                                          {"o_layout", "dout_layout"}));
      std::vector<int64_t> packed = c.attrs().get_ints("packed_shape");
      if (!packed.empty()) {  // dq, dk, dv in one value (the gradient of a fused projection)
        c.set_output(0, c.dtype(1), Shape(packed.begin(), packed.end()));
        return Status::ok();
      }
      const char* names[3] = {"dq_layout", "dk_layout", "dv_layout"};
      const int64_t heads[3] = {d[1], d[2], d[2]}, times[3] = {d[3], d[4], d[4]}, widths[3] = {d[5], d[5], d[6]};
      for (int i = 0; i < 3; ++i) {
        if (c.has_output(i)) c.set_output(i, c.dtype(1), laid_out(c.attrs().get_ints(names[i]), 1, d[0], heads[i], times[i], widths[i]));
      }
      return Status::ok();
    };
    s.cost = attention_cost(true);
    r.add(std::move(s));
  }
  {
    OpSchema s = fused_schema("AddGatherGrad", 3, 3, 1, "X + GatherGrad(dy, indices), in place when X dies (CPU executor fusion)");
    s.non_differentiable_inputs = {2};
    s.infer = [](InferContext& c) {
      if (!is_integer(c.dtype(2))) return c.fail("indices must be integers, got {}", dtype_name(c.dtype(2)));
      if (c.dtype(0) != c.dtype(1))
        return c.fail("X and dy have different types ({} and {})", dtype_name(c.dtype(0)), dtype_name(c.dtype(1)));
      c.set_output(0, c.dtype(0), c.shape(0));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{static_cast<double>(g.value(n.inputs[1]).numel()), io_bytes(g, n)}; };
    r.add(std::move(s));
  }
  {
    OpSchema s = fused_schema("SoftmaxCrossEntropyLoss", 2, 3, 1, "softmax cross-entropy on 16-bit scores, float32 math and loss (device fusion)",
                              "oases.device");
    s.non_differentiable_inputs = {1, 2};
    s.float32_inputs = {2};
    s.infer = [](InferContext& c) {
      const Shape& x = c.shape(0);
      if (x.size() < 2) return c.fail("scores must be [N, C, ...], got {}", shape_str(x));
      Shape rows{x[0]};
      rows.insert(rows.end(), x.begin() + 2, x.end());
      if (c.shape(1) != rows) return c.fail("labels {} are not [N, ...] of the scores {}", shape_str(c.shape(1)), shape_str(x));
      c.set_output(0, DType::kF32, c.attrs().get_string("reduction", "mean") == "none" ? rows : Shape{});
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{6.0 * static_cast<double>(g.value(n.inputs[0]).numel()), io_bytes(g, n)}; };
    r.add(std::move(s));
  }
  {
    OpSchema s = fused_schema("SoftmaxCrossEntropyGrad", 3, 4, 1, "softmax cross-entropy gradient from 16-bit scores (device fusion)",
                              "oases.device");
    s.non_differentiable_inputs = {2, 3};
    s.float32_inputs = {0, 3};
    s.infer = [](InferContext& c) {
      c.set_output(0, c.attrs().get_int("half_output", 0) ? c.dtype(1) : DType::kF32, c.shape(1));
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{6.0 * static_cast<double>(g.value(n.inputs[1]).numel()), io_bytes(g, n)}; };
    r.add(std::move(s));
  }
}

}  // namespace oases
