// The project's own ops that backward passes use. Each is a fused kernel for a gradient that
// would otherwise take many small nodes:
//   oases.MatMulT(a, b; trans_a, trans_b)        batched a·b with optional transposes (no copies)
//   oases.UnaryGrad(dy, x, y; op)                dx of a unary op from its input x and/or output y
//   oases.GeluGrad(dy, x; approximate)           dx of Gelu
//   oases.SwiGLUGrad(dy, gate, up) -> (dg, du)
//   oases.SoftmaxGrad(dy, y; axis, log)          dx of Softmax (log=0) or LogSoftmax (log=1)
//   oases.LayerNormGrad(dy, x, scale, mean, rstd; axis) -> (dx, dscale, dbias)
//   oases.RMSNormGrad(dy, x, scale, rstd; axis)  -> (dx, dscale)
//   oases.AttentionGrad(dO, q, k, v, O, lse, mask?; causal, scale) -> (dq, dk, dv)
//   oases.SoftmaxCrossEntropyGrad(dloss, scores, labels, weights?; reduction, ignore_index)
//   oases.NLLLossGrad(dloss, logp, labels, weights?; reduction, ignore_index)
//   oases.GatherGrad(dy, indices; axis, data_shape)   scatter-add into zeros of data_shape
//   oases.SliceGrad(dy; Slice's resolved attrs, input_shape)
//   oases.DropoutGrad(dy; ratio, key_node)        replays the forward mask from its RNG key
#include "graph/ops/op_utils.h"

namespace oases {

using namespace ops;

namespace {

OpSchema grad_schema(const std::string& op, int min_in, int max_in, int outs) {
  OpSchema s;
  s.domain = kOasesDomain;
  s.op_type = op;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.min_outputs = 1;
  s.max_outputs = outs;
  s.foldable = false;
  s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 4.0); };
  return s;
}

// Output i takes the dtype and shape of input j.
std::function<Status(InferContext&)> like_inputs(std::vector<int> js) {
  return [js](InferContext& c) {
    for (size_t i = 0; i < js.size(); ++i) {
      if (c.has_output(static_cast<int>(i))) c.set_output(static_cast<int>(i), c.dtype(js[i]), c.shape(js[i]));
    }
    return Status::ok();
  };
}

}  // namespace

void register_grad_ops(OpRegistry& r) {
  {
    OpSchema s = grad_schema("MatMulT", 2, 2, 1);
    s.foldable = true;
    s.infer = [](InferContext& c) {
      Shape a = c.shape(0), b = c.shape(1);
      if (a.size() < 2 || b.size() < 2) return c.fail("operands must have rank >= 2");
      if (c.attrs().get_int("trans_a", 0)) std::swap(a[a.size() - 1], a[a.size() - 2]);
      if (c.attrs().get_int("trans_b", 0)) std::swap(b[b.size() - 1], b[b.size() - 2]);
      if (a.back() != b[b.size() - 2]) return c.fail("inner dimensions differ: {} x {}", shape_str(a), shape_str(b));
      auto batch = broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
      if (!batch) return c.fail("{}", batch.status().message());
      Shape out = *batch;
      out.push_back(a[a.size() - 2]);
      out.push_back(b.back());
      c.set_output(0, c.dtype(0), out);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) {
      const Shape& a = g.value(n.inputs[0]).shape;
      double k = static_cast<double>(n.attrs.get_int("trans_a", 0) ? a[a.size() - 2] : a.back());
      return OpCost{2.0 * out_numel(g, n) * k, io_bytes(g, n)};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("UnaryGrad", 3, 3, 1);
    s.min_inputs = 2;
    s.infer = like_inputs({0});
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("GeluGrad", 2, 2, 1);
    s.infer = like_inputs({1});
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("SwiGLUGrad", 3, 3, 2);
    s.infer = like_inputs({1, 2});
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("SoftmaxGrad", 2, 2, 1);
    s.infer = like_inputs({1});
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("LayerNormGrad", 5, 5, 3);
    s.infer = [](InferContext& c) {
      int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), c.rank(1));
      Shape ns(c.shape(1).begin() + axis, c.shape(1).end());
      c.set_output(0, c.dtype(1), c.shape(1));
      if (c.has_output(1)) c.set_output(1, c.dtype(2), ns);
      if (c.has_output(2)) c.set_output(2, c.dtype(2), ns);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 10.0); };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("RMSNormGrad", 4, 4, 2);
    s.infer = [](InferContext& c) {
      int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), c.rank(1));
      Shape ns(c.shape(1).begin() + axis, c.shape(1).end());
      c.set_output(0, c.dtype(1), c.shape(1));
      if (c.has_output(1)) c.set_output(1, c.dtype(2), ns);
      return Status::ok();
    };
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 8.0); };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("AttentionGrad", 6, 7, 3);
    s.infer = like_inputs({1, 2, 3});
    s.cost = [](const Graph& g, const Node& n) {
      const Shape& q = g.value(n.inputs[1]).shape;
      const Shape& k = g.value(n.inputs[2]).shape;
      const Shape& v = g.value(n.inputs[3]).shape;
      double bh = static_cast<double>(q[0] * q[1]);
      // recompute q·kᵀ, then dV, dP, dQ, dK: five products
      double flops = bh * static_cast<double>(q[2] * k[2]) * (6.0 * static_cast<double>(q[3]) + 4.0 * static_cast<double>(v[3]) + 8.0);
      if (n.attrs.get_int("causal", 0)) flops *= 0.5;
      return OpCost{flops, io_bytes(g, n)};
    };
    r.add(std::move(s));
  }
  for (const char* op : {"SoftmaxCrossEntropyGrad", "NLLLossGrad"}) {
    OpSchema s = grad_schema(op, 3, 4, 1);
    s.infer = like_inputs({1});
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("GatherGrad", 2, 2, 1);
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.attrs().get_ints("data_shape"));
      return Status::ok();
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("SliceGrad", 1, 1, 1);
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.attrs().get_ints("input_shape"));
      return Status::ok();
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("DropoutGrad", 1, 2, 1);
    s.infer = like_inputs({0});
    r.add(std::move(s));
  }
}

}  // namespace oases
