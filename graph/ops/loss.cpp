// Losses: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.
//   scores [N, C] or [N, C, d1, ...], labels [N] or [N, d1, ...] (int), optional class weights [C];
//   reduction mean (default) | sum | none; ignore_index. Output 0 is the loss (a scalar unless
//   reduction is none); SoftmaxCrossEntropyLoss's optional output 1 is the log-probabilities.
#include "graph/autodiff.h"
#include "graph/ops/op_utils.h"
#include "graph/sharding.h"

namespace oases {

using namespace ops;

namespace {

Status infer_loss(InferContext& c) {
  const Shape& sc = c.shape(0);
  const Shape& lb = c.shape(1);
  if (sc.size() < 2) return c.fail("scores must be [N, C, ...], got {}", shape_str(sc));
  if (lb.size() != sc.size() - 1) return c.fail("labels {} do not match scores {}", shape_str(lb), shape_str(sc));
  for (size_t i = 0; i < lb.size(); ++i) {
    int64_t want = i == 0 ? sc[0] : sc[i + 1];
    if (lb[i] != want) return c.fail("labels {} do not match scores {}", shape_str(lb), shape_str(sc));
  }
  if (!is_integer(c.dtype(1))) return c.fail("labels must be integers, got {}", dtype_name(c.dtype(1)));
  if (c.has_input(2) && c.shape(2) != Shape{sc[1]}) return c.fail("weights must be [C] = [{}], got {}", sc[1], shape_str(c.shape(2)));
  std::string red = c.attrs().get_string("reduction", "mean");
  if (red != "mean" && red != "sum" && red != "none") return c.fail("unknown reduction '{}'", red);
  c.set_output(0, c.dtype(0), red == "none" ? lb : Shape{});
  if (c.has_output(1)) c.set_output(1, c.dtype(0), sc);
  return Status::ok();
}

}  // namespace

// Cross-entropy over scores [N, C, ...]: rows may be split (reduction "sum" then gives a partial
// sum; "mean" needs every row, see planner/partition: it is rewritten to sum / count first), the
// classes may be split over another axis (vocabulary-parallel: the partitioned graph reduces the
// max, the sum of exponentials and the target logit over that axis).
Status shard_cross_entropy(ShardContext& c, int scores, bool grad) {
  ShardingSpec s = c.in(scores).without_partial();
  size_t rank = s.rank();
  for (size_t d = 2; d < rank; ++d) s.dims[d] = DimSpec{};
  if (s.dims[1].segments > 1) s.dims[1] = DimSpec{};
  std::string red = c.node().attrs.get_string("reduction", "mean");
  if (red == "mean" && s.dims[0].axis >= 0) {
    return c.fail("reduction 'mean' over split rows: rewrite the loss as a sum divided by the global count first");
  }
  c.require(scores, s);
  ShardingSpec labels = ShardingSpec::replicated(rank - 1);
  labels.dims[0] = s.dims[0];
  c.require(scores + 1, labels);
  if (c.has_input(scores + 2)) c.require(scores + 2, ShardingSpec::replicated(1));
  if (grad) {
    // dloss: a scalar (sum/mean) or per-row (none)
    ShardingSpec dl = c.in(0);
    if (red == "none") {
      dl = labels;
      dl.partial = c.in(0).partial;
    }
    for (int a = 0; a < c.mesh().num_axes(); ++a) {
      if (dl.is_partial(a) && (a == s.dims[0].axis || a == s.dims[1].axis)) dl = dl.with_partial(a, false);
    }
    c.require(0, dl);
    ShardingSpec out = s;
    out.partial = dl.partial;
    c.set_out(0, out);
    return Status::ok();
  }
  ShardingSpec loss = red == "none" ? labels : ShardingSpec::replicated(0);
  if (red != "none" && s.dims[0].axis >= 0) loss.partial |= 1u << s.dims[0].axis;
  c.set_out(0, loss);
  if (c.has_output(1)) c.set_out(1, s);
  return Status::ok();
}

void register_loss_ops(OpRegistry& r) {
  for (const char* op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
    OpSchema s;
    s.op_type = op;
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.max_outputs = std::string(op) == "SoftmaxCrossEntropyLoss" ? 2 : 1;
    s.non_differentiable_inputs = {1, 2};
    s.infer = infer_loss;
    s.cost = [](const Graph& g, const Node& n) { return OpCost{6.0 * static_cast<double>(g.value(n.inputs[0]).numel()), io_bytes(g, n)}; };
    r.add(std::move(s));
  }

  // --- gradient rules -------------------------------------------------------------------
  for (const char* op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
    bool sce = std::string(op) == "SoftmaxCrossEntropyLoss";
    r.find_mutable("", op)->grad = [sce](GradContext& c) {
      if (c.grad_out(1) != kNoId) return c.fail("the gradient through the log-probability output is not supported");
      AttrMap a{{"reduction", Attribute::of_string(c.attrs().get_string("reduction", "mean"))}};
      if (c.attrs().has("ignore_index")) a.set_int("ignore_index", c.attrs().get_int("ignore_index", -100));
      std::vector<ValueId> ins{c.grad_out(0), c.input(0), c.input(1)};
      if (c.node().has_input(2)) ins.push_back(c.input(2));
      c.add_grad(0, c.op(sce ? "SoftmaxCrossEntropyGrad" : "NLLLossGrad", ins, a, kOasesDomain));
      return Status::ok();
    };
  }

  for (const char* op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
    r.find_mutable("", op)->shard = [](ShardContext& c) { return shard_cross_entropy(c, 0, false); };
  }
}

}  // namespace oases
