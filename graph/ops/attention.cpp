// oases.Attention: scaled dot-product attention, the fused form of the
// MatMul(q, kᵀ)·scale (+ mask) → Softmax → MatMul(·, v) chains exporters write.
//   q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], optional additive or boolean mask
//   broadcastable to [B, H, Tq, Tk]; attrs: causal (0/1, lower-triangular aligned to the end),
//   scale (default 1/sqrt(D)). H must be a multiple of Hkv (grouped-query attention).
//   out [B, H, Tq, Dv].
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

#include <cmath>

namespace oases {

using namespace ops;

// Attention (q at slot q) and its gradient: batch and heads may be split (heads over the tensor-
// parallel axis), sequence and head dims stay whole; a mask follows the dims it does not broadcast.
// Grouped-query attention with fewer key/value heads than ranks (Megatron's rule, tp a multiple of
// Hkv): q splits by heads while k and v stay whole on every rank, each rank's query heads reading
// the K/V head they use (with Hkv > 1 the partition lowering selects it); the gradients of k and v
// are then partial sums over the axis, each rank contributing its query heads' part.
Status shard_attention(ShardContext& c, int q, bool grad) {
  DimSpec batch, heads;
  for (int i = q; i < q + 3 && batch.axis < 0; ++i) batch = c.in(i).dims[0];
  for (int i = q; i < q + 3 && heads.axis < 0; ++i) heads = c.in(i).dims[1];
  if (batch.axis >= 0 && batch.axis == heads.axis) heads = DimSpec{};
  const int64_t h = c.in_shape(q)[1], hkv = c.in_shape(q + 1)[1];
  if (heads.axis >= 0) {
    int64_t n = c.mesh().axis_size(heads.axis);
    if (h % n != 0 || (hkv % n != 0 && n % hkv != 0)) heads = DimSpec{};
  }
  // k and v keep their heads whole when the axis splitting the query heads exceeds them
  bool kv_whole = heads.axis >= 0 && hkv % c.mesh().axis_size(heads.axis) != 0;
  auto bhrr = [&](size_t rank, bool whole_heads = false) {
    ShardingSpec s = ShardingSpec::replicated(rank);
    s.dims[0] = batch;
    if (!whole_heads) s.dims[1] = heads;
    return s;
  };
  c.require(q, bhrr(4));
  for (int i = q + 1; i < q + 3; ++i) c.require(i, bhrr(4, kv_whole));
  if (grad) {
    c.require(4, bhrr(4));  // O
    c.require(5, bhrr(3));  // lse
    ShardingSpec d = bhrr(4);
    d.partial = c.in(0).partial;
    for (int a = 0; a < c.mesh().num_axes(); ++a) {
      if ((a == batch.axis || a == heads.axis) && d.is_partial(a)) d = d.with_partial(a, false);
    }
    c.require(0, d);
  }
  int mask = q + (grad ? 5 : 3);
  if (c.has_input(mask)) {
    Shape ms = c.in_shape(mask), qs = c.in_shape(q);
    ShardingSpec want = ShardingSpec::replicated(ms.size());
    Shape scores{qs[0], qs[1], qs[2], c.in_shape(q + 1)[2]};
    for (size_t j = 0; j < ms.size(); ++j) {
      size_t d = 4 - ms.size() + j;
      if (d == 0 && ms[j] == scores[0]) want.dims[j] = batch;
      if (d == 1 && ms[j] == scores[1]) want.dims[j] = heads;
    }
    c.require(mask, want);
  }
  if (grad) {
    uint32_t p = c.in(0).partial;
    for (int k = 0; k < 3; ++k) {
      ShardingSpec s = c.in(q + k);
      s.partial = p;
      if (k > 0 && kv_whole) s = s.with_partial(heads.axis);
      c.set_out(k, s);
    }
  } else {
    c.set_out(0, bhrr(4));
    if (c.has_output(1)) c.set_out(1, bhrr(3));
  }
  return Status::ok();
}

void register_attention_ops(OpRegistry& r) {
  OpSchema s;
  s.domain = kOasesDomain;
  s.op_type = "Attention";
  s.doc = "softmax(q k^T * scale + mask, causal) v";
  s.min_inputs = 3;
  s.max_inputs = 4;
  s.max_outputs = 2;  // optional log-sum-exp of each query row [B, H, Tq] for the backward pass
  s.non_differentiable_inputs = {3};
  s.infer = [](InferContext& c) {
    const Shape &q = c.shape(0), &k = c.shape(1), &v = c.shape(2);
    if (q.size() != 4 || k.size() != 4 || v.size() != 4) {
      return c.fail("q {}, k {}, v {} must be [B, H, T, D]", shape_str(q), shape_str(k), shape_str(v));
    }
    if (q[0] != k[0] || k[0] != v[0] || q[3] != k[3] || k[1] != v[1] || k[2] != v[2] || k[1] == 0 || q[1] % k[1] != 0) {
      return c.fail("q {}, k {}, v {} do not fit together", shape_str(q), shape_str(k), shape_str(v));
    }
    if (c.has_input(3)) {
      Shape scores{q[0], q[1], q[2], k[2]};
      auto b = broadcast_shapes(c.shape(3), scores);
      if (!b || *b != scores) return c.fail("mask {} does not broadcast to the scores {}", shape_str(c.shape(3)), shape_str(scores));
    }
    if (!c.attrs().has("scale")) c.node().attrs.set_float("scale", 1.0f / std::sqrt(static_cast<float>(q[3])));
    c.set_output(0, c.dtype(0), {q[0], q[1], q[2], v[3]});
    if (c.has_output(1)) c.set_output(1, DType::kF32, {q[0], q[1], q[2]});
    return Status::ok();
  };
  s.cost = [](const Graph& g, const Node& n) {
    const Shape& q = g.value(n.inputs[0]).shape;
    const Shape& k = g.value(n.inputs[1]).shape;
    const Shape& v = g.value(n.inputs[2]).shape;
    double bh = static_cast<double>(q[0] * q[1]);
    double flops = bh * static_cast<double>(q[2] * k[2]) * (2.0 * static_cast<double>(q[3]) + 2.0 * static_cast<double>(v[3]) + 5.0);
    if (n.attrs.get_int("causal", 0)) flops *= 0.5;
    return OpCost{flops, io_bytes(g, n)};
  };
  r.add(std::move(s));

  // --- gradient rule: recomputes the probabilities from q, k and the saved log-sum-exp ------
  r.find_mutable(kOasesDomain, "Attention")->grad = [](GradContext& c) {
    const Shape& q = c.shape(c.input(0));
    ValueId lse = c.ensure_output(1, DType::kF32, {q[0], q[1], q[2]});
    std::vector<ValueId> ins{c.grad_out(0), c.input(0), c.input(1), c.input(2), c.output(0), lse};
    if (c.node().has_input(3)) ins.push_back(c.input(3));
    AttrMap a{{"causal", Attribute::of_int(c.attrs().get_int("causal", 0))},
              {"scale", Attribute::of_float(c.attrs().get_float("scale", 1.f))}};
    auto d = c.op_n("AttentionGrad", ins, 3, a, kOasesDomain);
    for (int i = 0; i < 3; ++i) c.add_grad(i, d[i]);
    return Status::ok();
  };

  r.find_mutable(kOasesDomain, "Attention")->shard = [](ShardContext& c) { return shard_attention(c, 0, false); };
  r.find_mutable(kOasesDomain, "Attention")->traits |= kTraitComputeBound;
  r.find_mutable(kOasesDomain, "Attention")->float32_inputs = {3};  // the additive mask: the kernels read float32

  // --- examples: q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] ----------------------
  {
    auto qkv = [](int64_t h, int64_t hk) {
      return std::vector<ExampleInput>{ex_float({2, h, 4, 4}), ex_float({2, hk, 6, 4}), ex_float({2, hk, 6, 2})};
    };
    std::vector<ExampleInput> add_mask = qkv(2, 2);
    Tensor m(DType::kF32, {2, 1, 1, 6});
    for (int i = 0; i < 12; ++i) m.mutable_data<float>()[i] = i % 6 == 5 ? -1e9f : 0.1f * static_cast<float>(i);
    add_mask.push_back(ex_data(m));
    std::vector<ExampleInput> bool_mask = qkv(2, 2);
    Tensor bm(DType::kBool, {1, 1, 4, 6});
    for (int i = 0; i < 24; ++i) bm.mutable_data<uint8_t>()[i] = (i % 3) != 1;
    bool_mask.push_back(ex_data(bm));
    set_examples(r, kOasesDomain, "Attention",
                 {example("plain", qkv(2, 2)),
                  example("causal GQA", qkv(4, 2), AttrMap{{"causal", Attribute::of_int(1)}, {"scale", Attribute::of_float(0.3f)}}),
                  example("additive mask", add_mask), example("bool mask causal", bool_mask, AttrMap{{"causal", Attribute::of_int(1)}})});
  }
}

}  // namespace oases
