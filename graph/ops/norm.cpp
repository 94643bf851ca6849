// Normalisations: LayerNormalization (ONNX 17; also the fused form of the ReduceMean/Sub/Pow/
// Sqrt/Div decomposition older exports write) and oases.RMSNormalization (LLaMA's RMSNorm):
//   LayerNorm: y = (x - mean) / sqrt(var + eps) * scale + bias, over the axes from `axis` on
//   RMSNorm:   y = x / sqrt(mean(x²) + eps) * scale
// LayerNorm's optional outputs 1 and 2 are the mean and the inverse standard deviation, RMSNorm's
// output 1 the inverse rms; shaped like x with the normalised axes set to 1, float32.
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

namespace {

Status infer_norm(InferContext& c, bool has_bias_input) {
  int64_t rank = c.rank(0);
  int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), rank);
  if (axis < 0) return c.fail("axis {} out of range for rank {}", c.attrs().get_int("axis", -1), rank);
  if (!is_floating(c.dtype(0))) return c.fail("input must be floating, got {}", dtype_name(c.dtype(0)));
  Shape norm_shape(c.shape(0).begin() + axis, c.shape(0).end());
  for (int i = 1; i < (has_bias_input ? 3 : 2); ++i) {
    if (!c.has_input(i)) continue;
    auto b = broadcast_shapes(c.shape(i), norm_shape);
    if (!b || *b != norm_shape) {
      return c.fail("{} has shape {}, which does not broadcast to the normalised shape {}", i == 1 ? "scale" : "bias",
                    shape_str(c.shape(i)), shape_str(norm_shape));
    }
  }
  c.node().attrs.set_int("axis", axis);
  c.set_output(0, c.dtype(0), c.shape(0));
  Shape stat = c.shape(0);
  for (int64_t i = axis; i < rank; ++i) stat[i] = 1;
  if (c.has_output(1)) c.set_output(1, DType::kF32, stat);
  if (c.has_output(2)) c.set_output(2, DType::kF32, stat);
  return Status::ok();
}

// The normalised dims whole, rows may be split.
Status shard_norm(ShardContext& c) {
  int64_t rank = static_cast<int64_t>(c.in(0).rank());
  int64_t axis = normalize_axis(c.node().attrs.get_int("axis", -1), rank);
  c.require_no_partial();
  c.require_replicated_dims(0, axis, rank);
  for (int i = 1; i < c.num_inputs(); ++i) {
    if (c.has_input(i)) c.require(i, ShardingSpec::replicated(c.in(i).rank()));
  }
  c.set_out(0, c.in(0));
  for (int k = 1; k < c.num_outputs(); ++k) {
    if (c.has_output(k)) c.set_out(k, c.in(0));  // statistics: rows split alike, normalised dims size 1
  }
  return Status::ok();
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.op_type = "LayerNormalization";
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.max_outputs = 3;
    s.traits = kTraitNorm;
    s.infer = [](InferContext& c) { return infer_norm(c, true); };
    s.grad = [](GradContext& c) {
      ValueId x = c.input(0);
      int64_t axis = c.attrs().get_int("axis", -1);
      Shape stat = c.shape(x);
      for (size_t i = static_cast<size_t>(axis); i < stat.size(); ++i) stat[i] = 1;
      ValueId mean = c.ensure_output(1, DType::kF32, stat), rstd = c.ensure_output(2, DType::kF32, stat);
      bool bias = c.node().has_input(2);
      auto d = c.op_n("LayerNormGrad", {c.grad_out(0), x, c.input(1), mean, rstd}, bias ? 3 : 2, AttrMap{{"axis", Attribute::of_int(axis)}},
                      kOasesDomain);
      c.add_grad(0, d[0]);
      if (c.needs(1)) c.add_grad(1, c.unbroadcast(d[1], c.shape(c.input(1))));
      if (bias && c.needs(2)) c.add_grad(2, c.unbroadcast(d[2], c.shape(c.input(2))));
      return Status::ok();
    };
    s.shard = shard_norm;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 8.0); };
    s.examples = examples_of(
        {example("scale and bias", {ex_float({2, 4, 6}), ex_float({6}), ex_float({6})}, AttrMap{{"epsilon", Attribute::of_float(1e-5f)}}),
         example("two axes", {ex_float({2, 4, 6}), ex_float({4, 6})}, AttrMap{{"axis", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.domain = kOasesDomain;
    s.op_type = "RMSNormalization";
    s.doc = "x / sqrt(mean(x^2) + epsilon) * scale";
    s.min_inputs = 2;
    s.max_inputs = 2;
    s.max_outputs = 2;  // y, inverse rms
    s.traits = kTraitNorm;
    s.infer = [](InferContext& c) { return infer_norm(c, false); };
    s.grad = [](GradContext& c) {
      ValueId x = c.input(0);
      int64_t axis = c.attrs().get_int("axis", -1);
      Shape stat = c.shape(x);
      for (size_t i = static_cast<size_t>(axis); i < stat.size(); ++i) stat[i] = 1;
      ValueId rstd = c.ensure_output(1, DType::kF32, stat);
      auto d = c.op_n("RMSNormGrad", {c.grad_out(0), x, c.input(1), rstd}, 2, AttrMap{{"axis", Attribute::of_int(axis)}}, kOasesDomain);
      c.add_grad(0, d[0]);
      if (c.needs(1)) c.add_grad(1, c.unbroadcast(d[1], c.shape(c.input(1))));
      return Status::ok();
    };
    s.shard = shard_norm;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 5.0); };
    s.examples = examples_of({example("scale", {ex_float({2, 4, 6}), ex_float({6})}, AttrMap{{"epsilon", Attribute::of_float(1e-6f)}})});
    r.add(std::move(s));
  }
}

}  // namespace oases
