// oases.Attention: scaled dot-product attention, the fused form of the
// MatMul(q, kᵀ)·scale (+ mask) → Softmax → MatMul(·, v) chains exporters write.
//   q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], optional additive or boolean mask
//   broadcastable to [B, H, Tq, Tk]; attrs: causal (0/1, lower-triangular aligned to the end),
//   scale (default 1/sqrt(D)). H must be a multiple of Hkv (grouped-query attention).
//   out [B, H, Tq, Dv].
#include "graph/autodiff.h"
#include "graph/lowering.h"
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

// Partition lowering of Attention (q at slot q) and AttentionGrad when q's heads are split over an
// axis of n ranks while k and v keep all their Hkv > 1 heads (n = m·Hkv): rank r's query heads use
// K/V head r / m, which the local kernel would not pick (it pairs local query heads with the local
// K/V heads in order). So the node reads k, v = Gather(k, [r / m], axis 1) [B, 1, T, D] (the index
// a per-rank constant [n] split over the axis), and AttentionGrad's dk, dv [B, 1, T, D] land back
// in their head by a product with the one-hot [n, Hkv, 1, 1] row of the rank: [B, Hkv, T, D], zero
// in the other heads, the partial sum over the axis its spec says (adding those zeros is exact).
Status ops::lower_attention_kv_heads(LowerContext& c, int q, bool grad) {
  Graph& g = c.graph();
  const NodeId id = c.node_id();
  const int axis = c.spec(g.node(id).inputs[q]).dims[1].axis;
  if (axis < 0 || c.spec(g.node(id).inputs[q + 1]).dims[1].axis >= 0) return Status::ok();
  const int64_t n = c.mesh().axis_size(axis), hkv = c.local_shape(g.node(id).inputs[q + 1])[1];
  if (hkv == 1) return Status::ok();  // every query head reads the one K/V head
  if (n % hkv != 0) return c.fail("{} ranks split the query heads, which is not a multiple of the {} key/value heads", n, hkv);
  const int64_t m = n / hkv;
  const std::string base = g.node(id).name;
  auto local_constant = [&](const std::string& name, Tensor global, const ShardingSpec& spec) {
    ValueId v = g.add_constant(name, global);
    Shape gs = g.value(v).shape;
    c.spec(v) = spec;
    c.set_global_shape(v, gs);
    g.value(v).shape = spec.local_shape(gs, c.mesh());
    return v;
  };
  Tensor head_of_rank(DType::kI64, {n});
  for (int64_t r = 0; r < n; ++r) head_of_rank.mutable_data<int64_t>()[r] = r / m;
  ValueId idx = local_constant(base + "_kv_head", head_of_rank, ShardingSpec::replicated(1).with_dim(0, axis));
  for (int i = q + 1; i < q + 3; ++i) {
    ValueId whole = g.node(id).inputs[static_cast<size_t>(i)];
    Shape gs = c.global_shape(whole);
    gs[1] = n;  // one K/V head per rank: [B, n, T, D] split over the axis
    ShardingSpec sp = c.spec(whole).with_dim(1, axis);
    ValueId sel = c.emit("Gather", {whole, idx}, AttrMap{{"axis", Attribute::of_int(1)}}, g.value(whole).dtype, gs, sp,
                         base + (i == q + 1 ? "_k_head" : "_v_head"));
    g.set_input(id, static_cast<size_t>(i), sel);
  }
  if (!grad) return Status::ok();
  Tensor one_hot(DType::kF32, {n, hkv, 1, 1});
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < hkv; ++h) one_hot.mutable_data<float>()[r * hkv + h] = h == r / m ? 1.f : 0.f;
  }
  ValueId onehot = local_constant(base + "_kv_head_one_hot", one_hot, ShardingSpec::replicated(4).with_dim(0, axis));
  for (size_t k = 1; k < 3; ++k) {
    ValueId out = g.node(id).outputs[k];
    if (out == kNoId) continue;
    ValueId in = g.node(id).inputs[static_cast<size_t>(q) + k];  // the selected head [B, 1, T, D]
    ValueId part = g.add_value(g.unique_name(g.value(out).name + "_head"), g.value(out).dtype, g.value(in).shape, true);
    c.spec(part) = c.spec(in);
    c.set_global_shape(part, c.global_shape(in));
    g.set_output(id, k, part);
    NodeId mul = g.add_node("Mul", {part, onehot}, {out}, {}, g.unique_name(base + (k == 1 ? "_dk_head" : "_dv_head")));
    g.node(mul).scope = g.node(id).scope;
    g.node(mul).phase = g.node(id).phase;
    g.node(mul).chunk = g.node(id).chunk;
  }
  return Status::ok();
}

namespace {

// Examples: q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv].
std::vector<OpExample> attention_examples() {
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
  return {example("plain", qkv(2, 2)), example("multi-query", qkv(2, 1)),
          example("causal GQA", qkv(4, 2), AttrMap{{"causal", Attribute::of_int(1)}, {"scale", Attribute::of_float(0.3f)}}),
          example("additive mask", add_mask), example("bool mask causal", bool_mask, AttrMap{{"causal", Attribute::of_int(1)}})};
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  OpSchema s;
  s.domain = kOasesDomain;
  s.op_type = "Attention";
  s.doc = "softmax(q k^T * scale + mask, causal) v";
  s.min_inputs = 3;
  s.max_inputs = 4;
  s.max_outputs = 2;  // optional log-sum-exp of each query row [B, H, Tq] for the backward pass
  s.non_differentiable_inputs = {3};
  s.float32_inputs = {3};  // the additive mask: the kernels read float32
  s.traits = kTraitComputeBound;
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
  // recomputes the probabilities from q, k and the saved log-sum-exp
  s.grad = [](GradContext& c) {
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
  s.shard = [](ShardContext& c) { return shard_attention(c, 0, false); };
  s.lower = [](LowerContext& c) { return lower_attention_kv_heads(c, 0, false); };
  s.cost = [](const Graph& g, const Node& n) {
    const Shape& q = g.value(n.inputs[0]).shape;
    const Shape& k = g.value(n.inputs[1]).shape;
    const Shape& v = g.value(n.inputs[2]).shape;
    double bh = static_cast<double>(q[0] * q[1]);
    double flops = bh * static_cast<double>(q[2] * k[2]) * (2.0 * static_cast<double>(q[3]) + 2.0 * static_cast<double>(v[3]) + 5.0);
    if (n.attrs.get_int("causal", 0)) flops *= 0.5;
    return OpCost{flops, io_bytes(g, n)};
  };
  s.examples = examples_of(attention_examples());
  r.add(std::move(s));
}

}  // namespace oases
