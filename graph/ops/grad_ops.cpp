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
//   oases.GatherGrad(dy, indices, table?; axis, data_shape) scatter-add into zeros of data_shape (the
//                                                table input only carries its sharding; no data read)
//   oases.SliceGrad(dy; Slice's resolved attrs, input_shape)
//   oases.DropoutGrad(dy; ratio, key_node)        replays the forward mask from its RNG key
#include "graph/lowering.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

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
  s.differentiable = false;  // backward ops: no second derivatives
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

// Gradients are linear in dy (input 0): a partial dy gives partial gradients.
Status shard_linear_in_dy(ShardContext& c) {
  return shard_elementwise(c, PartialPolicy::kFirstOnly);
}

// Norm gradients: dx like x; the parameter gradients sum over rows, so split rows make them partial.
Status shard_norm_grad(ShardContext& c) {
  int64_t rank = static_cast<int64_t>(c.in(1).rank());
  int64_t axis = normalize_axis(c.node().attrs.get_int("axis", -1), rank);
  ShardingSpec x = c.in(1).without_partial();
  for (int64_t d = axis; d < rank; ++d) x.dims[d] = DimSpec{};
  c.require(1, x);
  // dy whole: reducing it once here is cheaper than reducing dx, dscale and dbias after
  ShardingSpec dy = x;
  c.require(0, dy);
  c.require(2, ShardingSpec::replicated(c.in(2).rank()));
  for (int i = 3; i < c.num_inputs(); ++i) c.require(i, x);  // saved statistics
  ShardingSpec dx = x;
  dx.partial = dy.partial;
  c.set_out(0, dx);
  ShardingSpec dp = ShardingSpec::replicated(static_cast<size_t>(rank - axis));
  dp.partial = dy.partial;
  for (int64_t d = 0; d < axis; ++d) {
    if (x.dims[d].axis >= 0) dp.partial |= 1u << x.dims[d].axis;
  }
  for (int k = 1; k < c.num_outputs(); ++k) {
    if (c.has_output(k)) c.set_out(k, dp);
  }
  return Status::ok();
}

}  // namespace

void register_grad_ops(OpRegistry& r) {
  {
    OpSchema s = grad_schema("MatMulT", 2, 2, 1);
    s.traits |= kTraitComputeBound;
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
    s.shard = [](ShardContext& c) {
      return shard_matmul(c, c.node().attrs.get_int("trans_a", 0) != 0, c.node().attrs.get_int("trans_b", 0) != 0);
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("UnaryGrad", 3, 3, 1);
    s.min_inputs = 2;
    s.infer = like_inputs({0});
    s.shard = shard_linear_in_dy;
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("GeluGrad", 2, 2, 1);
    s.infer = like_inputs({1});
    s.shard = shard_linear_in_dy;
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("SwiGLUGrad", 3, 3, 2);
    s.infer = like_inputs({1, 2});
    s.shard = shard_linear_in_dy;
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("SoftmaxGrad", 2, 2, 1);
    s.infer = like_inputs({1});
    s.shard = [](ShardContext& c) {
      int64_t axis = normalize_axis(c.node().attrs.get_int("axis", -1), static_cast<int64_t>(c.in(0).rank()));
      c.require_replicated_dims(0, axis, axis + 1);
      c.require_replicated_dims(1, axis, axis + 1);
      return shard_elementwise(c, PartialPolicy::kFirstOnly);
    };
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
    s.shard = shard_norm_grad;
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
    s.shard = shard_norm_grad;
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("AttentionGrad", 6, 7, 3);
    s.traits |= kTraitComputeBound;
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
    s.shard = [](ShardContext& c) { return shard_attention(c, 1, true); };
    s.lower = [](LowerContext& c) { return lower_attention_kv_heads(c, 1, true); };
    r.add(std::move(s));
  }
  for (const char* op : {"SoftmaxCrossEntropyGrad", "NLLLossGrad"}) {
    const bool nll = std::string(op) == "NLLLossGrad";
    OpSchema s = grad_schema(op, 3, 4, 1);
    s.infer = like_inputs({1});
    s.shard = [](ShardContext& c) { return shard_cross_entropy(c, 1, true); };
    s.lower = [nll](LowerContext& c) { return lower_cross_entropy_grad(c, nll); };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("GatherGrad", 2, 3, 1);
    s.non_differentiable_inputs = {1, 2};
    s.infer = [](InferContext& c) {
      c.set_output(0, c.dtype(0), c.attrs().get_ints("data_shape"));
      return Status::ok();
    };
    // rows follow the table's spec (vocabulary-parallel: each rank scatters into the rows it
    // holds); split index dims (data parallel) make it a partial sum
    s.shard = [](ShardContext& c) {
      size_t axis = static_cast<size_t>(c.node().attrs.get_int("axis", 0));
      Shape ds = c.node().attrs.get_ints("data_shape");
      ShardingSpec table = c.has_input(2) ? c.in(2).without_partial() : ShardingSpec::replicated(ds.size());
      if (table.dims[axis].segments > 1) table.dims[axis] = DimSpec{};
      if (c.has_input(2)) c.require(2, table);
      size_t nidx = c.in(1).rank();
      ShardingSpec dy = c.in(0);
      // dy = [data[:axis], indices..., data[axis+1:]]
      for (size_t d = 0; d < axis; ++d) dy.dims[d] = table.dims[d];
      for (size_t d = axis + 1; d < ds.size(); ++d) dy.dims[d - 1 + nidx] = table.dims[d];
      ShardingSpec idx = ShardingSpec::replicated(nidx);
      for (size_t j = 0; j < nidx; ++j) {
        const DimSpec& dj = dy.dims[axis + j];
        if (dj.axis >= 0 && !table.uses_axis(dj.axis)) {
          idx.dims[j] = dj;
        } else {
          dy.dims[axis + j] = DimSpec{};
        }
      }
      for (int a = 0; a < c.mesh().num_axes(); ++a) {
        if (dy.is_partial(a) && table.uses_axis(a)) dy = dy.with_partial(a, false);
      }
      c.require(0, dy);
      c.require(1, idx);
      ShardingSpec out = table;
      out.partial = dy.partial;
      for (const auto& d : idx.dims) {
        if (d.axis >= 0) out.partial |= 1u << d.axis;
      }
      c.set_out(0, out);
      return Status::ok();
    };
    // scatter into the local rows; a vocabulary-split table scatters the ids of its own rows only
    s.lower = [](LowerContext& c) {
      Node& n = c.node();
      n.attrs.set_ints("data_shape", c.local_shape(n.outputs[0]));
      size_t axis = static_cast<size_t>(n.attrs.get_int("axis", 0));
      int split = c.spec(n.outputs[0]).dims[axis].axis;
      if (split >= 0) {
        if (axis != 0) return error("{}: a table split along gathered axis {} is not supported", n.describe(), axis);
        n.attrs.set_int("row_mesh_axis", split);
      }
      if (n.inputs.size() > 2) c.graph().set_input(c.node_id(), 2, kNoId);  // the table only carried its spec
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
    s.shard = [](ShardContext& c) {
      const AttrMap& at = c.node().attrs;
      std::vector<int64_t> axes = at.get_ints("axes"), starts = at.get_ints("starts"), steps = at.get_ints("steps");
      std::vector<int64_t> lens = at.get_ints("lengths"), in = at.get_ints("input_shape");
      ShardingSpec s = c.in(0);
      for (size_t i = 0; i < axes.size(); ++i) {
        size_t a = static_cast<size_t>(axes[i]);
        if (!(starts[i] == 0 && steps[i] == 1 && lens[i] == in[a])) s.dims[a] = DimSpec{};
      }
      c.require(0, s);
      c.set_out(0, s);
      return Status::ok();
    };
    s.lower = [](LowerContext& c) { return lower_slice_lengths(c, true); };
    r.add(std::move(s));
  }
  {
    OpSchema s = grad_schema("DropoutGrad", 1, 2, 1);
    s.traits |= kTraitRandom;
    s.infer = like_inputs({0});
    s.shard = shard_linear_in_dy;
    s.lower = lower_dropout_mask;
    r.add(std::move(s));
  }
}

}  // namespace oases
