// Constants and generators: Constant, ConstantOfShape, Range (all folded before execution when
// their operands are known), EyeLike (ones on the k-th diagonal of a matrix shaped like its input,
// of attr dtype or the input's) and Dropout (identity at inference; training mode draws a mask from
// a counter-based generator keyed by the node so recomputation replays it).
#include "graph/autodiff.h"
#include "graph/lowering.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

#include <cmath>

namespace oases {

using namespace ops;

namespace ops {

// The mask is drawn from each element's index in the whole tensor, so every layout replays the
// same mask: record the whole shape (once) and the axis splitting each dim.
Status lower_dropout_mask(LowerContext& c) {
  Node& n = c.node();
  const ShardingSpec s = c.spec(n.inputs[0]);
  if (s.is_replicated()) return Status::ok();
  if (!n.attrs.has("mask_shape")) n.attrs.set_ints("mask_shape", c.global_shape(n.inputs[0]));
  std::vector<int64_t> axes = n.attrs.get_ints("shard_axes", std::vector<int64_t>(s.rank(), -1));
  for (size_t d = 0; d < s.rank(); ++d) {
    if (s.dims[d].axis >= 0) axes[d] = s.dims[d].axis;
  }
  n.attrs.set_ints("shard_axes", axes);
  return Status::ok();
}

}  // namespace ops

namespace {

// Constants and generators: no inputs to differentiate (EyeLike's only input gives its shape);
// folded before execution or written whole on every rank.
OpSchema generator(const char* op) {
  OpSchema s;
  s.op_type = op;
  s.differentiable = false;
  s.shard = shard_replicated_only;
  return s;
}

OpCost output_bytes_cost(const Graph& g, const Node& n) {
  return OpCost{0, static_cast<double>(g.value(n.outputs[0]).nbytes())};
}

}  // namespace

void register_misc_ops(OpRegistry& r) {
  {
    OpSchema s = generator("Constant");
    s.min_inputs = s.max_inputs = 0;
    s.oldest_version = 1;  // the value attributes of every version are read below (sparse_value is not)
    s.infer = [](InferContext& c) {
      const AttrMap& a = c.attrs();
      Tensor t;
      if (const Attribute* v = a.find("value")) {
        t = v->t;
      } else if (const Attribute* v = a.find("value_float")) {
        t = Tensor::scalar_f32(v->f);
      } else if (const Attribute* v = a.find("value_floats")) {
        t = Tensor::from_f32(v->floats, {static_cast<int64_t>(v->floats.size())});
      } else if (const Attribute* v = a.find("value_int")) {
        t = Tensor::from_int64({v->i}, {});
      } else if (const Attribute* v = a.find("value_ints")) {
        t = Tensor::from_int64(v->ints, {static_cast<int64_t>(v->ints.size())});
      } else {
        return c.fail("no supported value attribute (value, value_float(s), value_int(s))");
      }
      if (!t.defined()) return c.fail("empty value");
      c.set_output(0, t.dtype(), t.shape());
      c.graph().set_constant(c.node().outputs[0], t);
      return Status::ok();
    };
    s.cost = zero_cost;  // folded into a constant before execution
    r.add(std::move(s));
  }
  {
    OpSchema s = generator("ConstantOfShape");
    s.min_inputs = 0;
    s.max_inputs = 1;
    s.normalize = [](InferContext& c) -> Status {
      auto moved = operand_to_ints_attr(c, 0, "shape");
      if (!moved) return moved.status();
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      std::vector<int64_t> shape = c.attrs().get_ints("shape");
      for (int64_t d : shape) {
        if (d < 0) return c.fail("negative dim in shape [{}]", fmt::join(shape, ","));
      }
      DType dt = DType::kF32;
      if (const Attribute* v = c.attrs().find("value")) dt = v->t.dtype();
      c.set_output(0, dt, shape);
      return Status::ok();
    };
    s.lower = [](LowerContext& c) {
      c.node().attrs.set_ints("shape", c.local_shape(c.node().outputs[0]));
      return Status::ok();
    };
    s.cost = output_bytes_cost;
    r.add(std::move(s));
  }
  {
    OpSchema s = generator("Range");
    s.min_inputs = s.max_inputs = 3;
    s.infer = [](InferContext& c) {
      const Tensor *a = c.constant(0), *b = c.constant(1), *d = c.constant(2);
      if (!a || !b || !d) return c.fail("start, limit and delta must be known before run time (static shapes)");
      double start = a->item(), limit = b->item(), delta = d->item();
      if (delta == 0) return c.fail("delta is 0");
      double count = std::ceil((limit - start) / delta);
      if (!(count < 9.2e18)) return c.fail("Range({}, {}, {}) has {} elements", start, limit, delta, count);  // NaN too
      int64_t n = std::max<int64_t>(0, static_cast<int64_t>(count));
      c.set_output(0, c.dtype(0), {n});
      return Status::ok();
    };
    s.cost = output_bytes_cost;
    r.add(std::move(s));
  }
  {
    OpSchema s = generator("EyeLike");
    s.min_inputs = s.max_inputs = 1;
    s.non_differentiable_inputs = {0};
    s.infer = [](InferContext& c) {
      if (c.rank(0) != 2) return c.fail("input must be a matrix, got {}", shape_str(c.shape(0)));
      DType dt = c.dtype(0);
      if (c.attrs().has("dtype")) {
        dt = dtype_from_onnx(static_cast<int>(c.attrs().get_int("dtype", 0)));
        if (dt == DType::kUndefined) return c.fail("unsupported dtype {} (ONNX data type number)", c.attrs().get_int("dtype", 0));
      }
      c.set_output(0, dt, c.shape(0));
      return Status::ok();
    };
    s.cost = output_bytes_cost;
    s.examples = examples_of({example("wide", {ex_float({4, 6})}, AttrMap{{"k", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
  {
    // Dropout(data, ratio?, training_mode?) -> (output, mask?). Canonical attrs: ratio, training_mode
    // when the operands are constant; a training_mode known only at run time stays input 2 (and a
    // ratio then input 1). Outside training the ratio does not matter and is dropped.
    OpSchema s;
    s.op_type = "Dropout";
    s.oldest_version = 10;  // Dropout-10: ratio attribute, no training_mode (inference copies)
    s.traits |= kTraitRandom;
    s.min_inputs = 1;
    s.max_inputs = 3;
    s.max_outputs = 2;
    s.foldable = false;
    s.non_differentiable_inputs = {1, 2};
    s.float32_inputs = {1};  // ratio
    s.normalize = [](InferContext& c) -> Status {
      if (c.has_input(2) && c.constant(2)) {
        c.node().attrs.set_int("training_mode", c.constant(2)->item() != 0 ? 1 : 0);
        c.graph().set_input(c.node().id, 2, kNoId);
      }
      bool inference = !c.has_input(2) && c.attrs().get_int("training_mode", 0) == 0;
      if (inference && c.has_input(1) && !c.constant(1)) {
        c.graph().set_input(c.node().id, 1, kNoId);
      } else {
        auto m1 = operand_to_float_attr(c, 1, "ratio", /*required_constant=*/false);
        if (!m1) return m1.status();
      }
      trim_inputs(c);
      return Status::ok();
    };
    s.infer = [](InferContext& c) {
      float ratio = c.attrs().get_float("ratio", 0.5f);
      if (ratio < 0.f || ratio >= 1.f) return c.fail("ratio {} is outside [0, 1)", ratio);
      if (c.has_input(1) && (c.shape(1).size() != 0 || !is_floating(c.dtype(1)))) {
        return c.fail("ratio must be a floating scalar, got {}", describe_value(c.graph(), c.node().inputs[1]));
      }
      if (c.has_input(2) && (c.shape(2).size() != 0 || c.dtype(2) != DType::kBool)) {
        return c.fail("training_mode must be a bool scalar, got {}", describe_value(c.graph(), c.node().inputs[2]));
      }
      c.set_output(0, c.dtype(0), c.shape(0));
      if (c.has_output(1)) c.set_output(1, DType::kBool, c.shape(0));
      return Status::ok();
    };
    // the mask is replayed from the forward node's RNG key, never stored
    s.grad = [](GradContext& c) {
      AttrMap a{{"ratio", Attribute::of_float(c.attrs().get_float("ratio", 0.5f))},
                {"training_mode", Attribute::of_int(c.attrs().get_int("training_mode", 0))},
                {"key_node", Attribute::of_string(c.attrs().get_string("key_node", c.node().name))}};
      for (const char* k : {"mask_shape", "mask_offsets", "shard_axes"}) {
        if (const Attribute* v = c.attrs().find(k)) a.set(k, *v);
      }
      c.add_grad(0, c.op("DropoutGrad", {c.grad_out(0)}, a, kOasesDomain));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) { return shard_same_as_input(c, PartialPolicy::kNone); };
    s.lower = lower_dropout_mask;
    s.cost = [](const Graph& g, const Node& n) { return elementwise_cost(g, n, 2.0); };
    // the mask is replayed from the node's key, so repeated runs agree
    s.examples = examples_of(
        {example("training", {ex_float({4, 6})}, AttrMap{{"ratio", Attribute::of_float(0.3f)}, {"training_mode", Attribute::of_int(1)}})});
    r.add(std::move(s));
  }
}

}  // namespace oases
