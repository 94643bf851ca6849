// Losses: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.
//   scores [N, C] or [N, C, d1, ...], labels [N] or [N, d1, ...] (int), optional class weights [C];
//   reduction mean (default) | sum | none; ignore_index. Output 0 is the loss (a scalar unless
//   reduction is none); SoftmaxCrossEntropyLoss's optional output 1 is the log-probabilities.
#include "graph/autodiff.h"
#include "graph/lowering.h"
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
  // class weights: the classes whole (the vocabulary-parallel lowering does not weigh them)
  if (c.has_input(scores + 2)) s.dims[1] = DimSpec{};
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

// --- partition lowering: the vocabulary-parallel loss -----------------------------------------
// With scores [N, C, ...] split over their classes (mesh axis a), each rank holds a slice of
// every row: the ranks' row maxima, sums of exponentials and target logits are gathered over a in
// one collective and combined on every rank.

namespace {

// Where the forward loss leaves its all-reduced row statistics of `scores` for the gradient.
std::string softmax_stats_key(ValueId scores, ValueId labels, const char* what) {
  return fmt::format("vocab_parallel_softmax/{}/{}/{}", scores, labels, what);
}

// A scalar constant in the scores' type (float64 graphs stay float64).
ValueId add_scalar_constant(Graph& g, const std::string& name, double v, DType dt) {
  Tensor t(dt, {});
  store_from_double(t.raw_mutable(), dt, 0, v);
  return g.add_constant(name, t);
}

}  // namespace

namespace ops {

Status lower_cross_entropy(LowerContext& c, bool nll) {
  Graph& g = c.graph();
  NodeId id = c.node_id();
  Node n = g.node(id);
  int a = c.spec(n.inputs[0]).dims[1].axis;
  if (a < 0) return Status::ok();
  if (n.has_input(2)) return error("{}: class weights with a vocabulary-parallel loss are not supported", n.describe());
  ValueId scores = n.inputs[0], labels = n.inputs[1];
  ShardingSpec ss = c.spec(scores);
  Shape gs = c.global_shape(scores);
  Shape rows_g = c.global_shape(labels);
  ShardingSpec rows_spec = c.spec(labels);
  ShardingSpec stat_spec = ss.with_dim(1, -1);  // [N, 1, ...]
  Shape stat_g = gs;
  stat_g[1] = 1;
  DType dt = g.value(scores).dtype;
  std::string base = n.name + "/vocab_parallel";
  ValueId s = kNoId, m = kNoId, t = kNoId, m_rows = kNoId;  // m_rows: the max per row (m is it as [N, 1, ...])
  if (nll) {
    ValueId t_loc = c.emit("ShardedPick", {scores, labels}, c.collective_attrs(a), dt, rows_g, rows_spec, base + "/pick", kOasesDomain);
    t = c.emit("AllReduce", {t_loc}, c.collective_attrs(a), dt, rows_g, rows_spec, base + "/all_reduce_pick", kOasesDomain);
    c.add_collectives(1);
  } else {
    // Each rank's statistics of its classes, per row: the max m_r, the sum of exp(x - m_r) and the
    // target's logit t_r (0 where another rank holds the target), side by side, gathered in one
    // collective; every rank then combines them: M = max_r m_r, S = sum_r s_r exp(m_r - M),
    // t = sum_r t_r, and the row's loss is log S + M - t. (A max all-reduce and then a sum
    // all-reduce would be two collectives in a row, each paying the link's latency.)
    const int64_t p = c.mesh().axis_size(a);
    const int64_t last = static_cast<int64_t>(rows_g.size());
    AttrMap at_end{{"axes", Attribute::of_ints({last})}};
    ValueId m_stat = c.emit("ReduceMax", {scores}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(1)}}, dt,
                            stat_g, stat_spec, base + "/max");
    ValueId e = c.emit("Exp", {c.emit("Sub", {scores, m_stat}, {}, dt, gs, ss, base + "/shift")}, {}, dt, gs, ss, base + "/exp");
    ValueId s_loc = c.emit("ReduceSum", {e}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(0)}}, dt, rows_g,
                           rows_spec, base + "/sum_exp");
    ValueId m_loc = c.emit("Squeeze", {m_stat}, AttrMap{{"axes", Attribute::of_ints({1})}}, dt, rows_g, rows_spec, base + "/max_rows");
    ValueId t_loc = c.emit("ShardedPick", {scores, labels}, c.collective_attrs(a), dt, rows_g, rows_spec, base + "/pick", kOasesDomain);
    // [rows..., 3] on each rank: its part of [rows..., 3 p], gathered over the axis
    Shape cols_g = rows_g, col_g = rows_g, packed_g = rows_g, each_g = rows_g;
    cols_g.push_back(p);  // a column per rank: each rank holds its own
    col_g.push_back(1);
    packed_g.push_back(3 * p);
    each_g.push_back(p);
    ShardingSpec own = rows_spec, whole = rows_spec;
    own.dims.push_back(DimSpec{a, 1});
    whole.dims.push_back(DimSpec{});
    std::vector<ValueId> cols;
    for (auto [v, name] : {std::pair{m_loc, "/max_col"}, std::pair{s_loc, "/sum_exp_col"}, std::pair{t_loc, "/pick_col"}})
      cols.push_back(c.emit("Unsqueeze", {v}, at_end, dt, cols_g, own, base + name));
    ValueId mine = c.emit("Concat", cols, AttrMap{{"axis", Attribute::of_int(last)}}, dt, packed_g, own, base + "/stats");
    AttrMap ag = c.collective_attrs(a);
    ag.set_int("dim", last);
    ag.set_int("segments", 1);
    ValueId all = c.emit("AllGather", {mine}, ag, dt, packed_g, whole, base + "/all_gather_stats", kOasesDomain);
    c.add_collectives(1);
    auto field = [&](int64_t k, const char* name) {  // rank r's field k sits at 3 r + k
      std::vector<int64_t> idx;
      for (int64_t r = 0; r < p; ++r) idx.push_back(3 * r + k);
      ValueId ix = g.add_constant(base + "/field", Tensor::from_int64(idx, {p}));
      return c.emit("Gather", {all, ix}, AttrMap{{"axis", Attribute::of_int(last)}}, dt, each_g, whole, base + name);
    };
    ValueId ms = field(0, "/maxes"), ss_r = field(1, "/sums"), ts = field(2, "/picks");
    AttrMap over_ranks{{"axes", Attribute::of_ints({last})}, {"keepdims", Attribute::of_int(0)}};
    m_rows = c.emit("ReduceMax", {ms}, over_ranks, dt, rows_g, rows_spec, base + "/max_all");
    ValueId w = c.emit("Exp",
                       {c.emit("Sub", {ms, c.emit("Unsqueeze", {m_rows}, at_end, dt, col_g, whole, base + "/max_all_col")}, {}, dt, each_g,
                               whole, base + "/rescale_shift")},
                       {}, dt, each_g, whole, base + "/rescale");
    s = c.emit("ReduceSum", {c.emit("Mul", {ss_r, w}, {}, dt, each_g, whole, base + "/sums_rescaled")}, over_ranks, dt, rows_g, rows_spec,
               base + "/sum_exp_all");
    t = c.emit("ReduceSum", {ts}, over_ranks, dt, rows_g, rows_spec, base + "/pick_all");
    m = c.emit("Unsqueeze", {m_rows}, AttrMap{{"axes", Attribute::of_ints({1})}}, dt, stat_g, stat_spec, base + "/max_stat");
    // for the gradient: the same statistics, so its backward repeats no collective
    c.shared()[softmax_stats_key(scores, labels, "max")] = m;
    c.shared()[softmax_stats_key(scores, labels, "sum")] = s;
  }
  // per row: -t (NLL), or log S + M - t (the target's logit is the raw score, so the max goes back in)
  ValueId per_row = nll ? c.emit("Neg", {t}, {}, dt, rows_g, rows_spec, base + "/nll")
                        : c.emit("Sub",
                                 {c.emit("Add", {c.emit("Log", {s}, {}, dt, rows_g, rows_spec, base + "/log_sum"), m_rows}, {}, dt, rows_g,
                                         rows_spec, base + "/log_sum_exp"),
                                  t},
                                 {}, dt, rows_g, rows_spec, base + "/loss_rows");
  ValueId valid = kNoId;
  if (n.attrs.has("ignore_index")) {
    ValueId ig = g.add_constant("ignore_index", Tensor::from_int64({n.attrs.get_int("ignore_index", -100)}, {}));
    ValueId lab = labels;
    if (g.value(labels).dtype != DType::kI64) {
      lab = c.emit("Cast", {labels}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kI64))}}, DType::kI64, rows_g, rows_spec,
                   base + "/labels64");
    }
    ValueId eq = c.emit("Equal", {lab, ig}, {}, DType::kBool, rows_g, rows_spec, base + "/ignored");
    ValueId keep = c.emit("Not", {eq}, {}, DType::kBool, rows_g, rows_spec, base + "/kept");
    valid = c.emit("Cast", {keep}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(dt))}}, dt, rows_g, rows_spec, base + "/valid");
    per_row = c.emit("Mul", {per_row, valid}, {}, dt, rows_g, rows_spec, base + "/masked");
  }
  std::string red = n.attrs.get_string("reduction", "mean");
  ValueId loss_out = n.outputs[0];
  std::vector<int64_t> all;
  for (size_t d = 0; d < rows_g.size(); ++d) all.push_back(static_cast<int64_t>(d));
  ValueId result = per_row;
  if (red != "none") {
    ShardingSpec scalar_spec = c.spec(loss_out);
    ValueId total = c.emit("ReduceSum", {per_row}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt, {},
                           scalar_spec, base + "/total");
    result = total;
    if (red == "mean") {
      ValueId count = valid != kNoId
                          ? c.emit("ReduceSum", {valid}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt,
                                   {}, scalar_spec, base + "/count")
                          : add_scalar_constant(g, "rows", static_cast<double>(shape_numel(rows_g)), dt);
      result = c.emit("Div", {total, count}, {}, dt, {}, scalar_spec, base + "/mean");
    }
  }
  // the loss value keeps its id: re-point its producer
  NodeId last = g.value(result).producer;
  std::vector<ValueId> log_prob;
  if (!nll && n.output(1) != kNoId) log_prob.push_back(n.outputs[1]);
  g.remove_node(id);
  g.set_output(last, 0, loss_out);
  if (!log_prob.empty()) {
    // emitted after the loss node is gone: these nodes take no scope from it
    ValueId ls = c.emit("Unsqueeze", {c.emit("Log", {s}, {}, dt, rows_g, rows_spec, base + "/log_sum2")},
                        AttrMap{{"axes", Attribute::of_ints({1})}}, dt, stat_g, stat_spec, base + "/lse");
    ValueId z = c.emit("Sub", {scores, m}, {}, dt, gs, ss, base + "/shifted");
    NodeId lp = g.value(c.emit("Sub", {z, ls}, {}, dt, gs, ss, base + "/log_prob")).producer;
    g.set_output(lp, 0, log_prob[0]);
  }
  return Status::ok();
}

// Gradient of the vocabulary-parallel cross-entropy: (softmax - onehot) · coefficient.
Status lower_cross_entropy_grad(LowerContext& c, bool nll) {
  Graph& g = c.graph();
  NodeId id = c.node_id();
  Node n = g.node(id);
  int a = c.spec(n.inputs[1]).dims[1].axis;
  if (a < 0) return Status::ok();
  if (n.has_input(3)) return error("{}: class weights with a vocabulary-parallel loss are not supported", n.describe());
  ValueId dloss = n.inputs[0], scores = n.inputs[1], labels = n.inputs[2];
  ShardingSpec ss = c.spec(scores);
  Shape gs = c.global_shape(scores), rows_g = c.global_shape(labels);
  ShardingSpec rows_spec = c.spec(labels);
  Shape stat_g = gs;
  stat_g[1] = 1;
  ShardingSpec stat_spec = ss.with_dim(1, -1);
  DType dt = g.value(scores).dtype;
  std::string base = n.name + "/vocab_parallel";
  ValueId p;
  auto fwd_max = c.shared().find(softmax_stats_key(scores, labels, "max"));
  auto fwd_sum = c.shared().find(softmax_stats_key(scores, labels, "sum"));
  if (nll) {
    p = c.emit("Mul", {scores, add_scalar_constant(g, "partition_const", 0.0, dt)}, {}, dt, gs, ss, base + "/zeros");
  } else if (fwd_max != c.shared().end() && fwd_sum != c.shared().end() && g.value(fwd_max->second).producer != kNoId &&
             g.value(fwd_sum->second).producer != kNoId) {
    // the forward's all-reduced max and sum of exponentials (the same values a recomputation would
    // all-reduce again): softmax = exp(scores - max) / sum, no collective
    ValueId e = c.emit("Exp", {c.emit("Sub", {scores, fwd_max->second}, {}, dt, gs, ss, base + "/shift")}, {}, dt, gs, ss, base + "/exp");
    ValueId s = c.emit("Unsqueeze", {fwd_sum->second}, AttrMap{{"axes", Attribute::of_ints({1})}}, dt, stat_g, stat_spec, base + "/sum_exp");
    p = c.emit("Div", {e, s}, {}, dt, gs, ss, base + "/softmax");
  } else {
    ValueId m_loc = c.emit("ReduceMax", {scores}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(1)}}, dt,
                           stat_g, stat_spec, base + "/max");
    AttrMap mx = c.collective_attrs(a);
    mx.set_string("op", "max");
    ValueId m = c.emit("AllReduce", {m_loc}, mx, dt, stat_g, stat_spec, base + "/all_reduce_max", kOasesDomain);
    ValueId e = c.emit("Exp", {c.emit("Sub", {scores, m}, {}, dt, gs, ss, base + "/shift")}, {}, dt, gs, ss, base + "/exp");
    ValueId s_loc = c.emit("ReduceSum", {e}, AttrMap{{"axes", Attribute::of_ints({1})}, {"keepdims", Attribute::of_int(1)}}, dt, stat_g,
                           stat_spec, base + "/sum_exp");
    ValueId s = c.emit("AllReduce", {s_loc}, c.collective_attrs(a), dt, stat_g, stat_spec, base + "/all_reduce_sum", kOasesDomain);
    p = c.emit("Div", {e, s}, {}, dt, gs, ss, base + "/softmax");
    c.add_collectives(2);
  }
  AttrMap oh = c.collective_attrs(a);
  if (n.attrs.has("ignore_index")) oh.set_int("ignore_index", n.attrs.get_int("ignore_index", -100));
  ValueId diff = c.emit("ShardedOneHotSub", {p, labels}, oh, dt, gs, ss, base + "/minus_onehot", kOasesDomain);
  std::string red = n.attrs.get_string("reduction", "mean");
  ValueId coef = dloss;
  if (red == "none") {
    coef = c.emit("Unsqueeze", {dloss}, AttrMap{{"axes", Attribute::of_ints({1})}}, dt, stat_g, stat_spec, base + "/coef");
  } else if (red == "mean") {
    ValueId count;
    std::vector<int64_t> all;
    for (size_t d = 0; d < rows_g.size(); ++d) all.push_back(static_cast<int64_t>(d));
    if (n.attrs.has("ignore_index")) {
      ValueId ig = g.add_constant("ignore_index", Tensor::from_int64({n.attrs.get_int("ignore_index", -100)}, {}));
      ValueId lab = labels;
      if (g.value(labels).dtype != DType::kI64) {
        lab = c.emit("Cast", {labels}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(DType::kI64))}}, DType::kI64, rows_g, rows_spec,
                     base + "/labels64");
      }
      ValueId keep = c.emit("Not", {c.emit("Equal", {lab, ig}, {}, DType::kBool, rows_g, rows_spec, base + "/ignored")}, {}, DType::kBool,
                            rows_g, rows_spec, base + "/kept");
      ValueId valid = c.emit("Cast", {keep}, AttrMap{{"to", Attribute::of_int(dtype_to_onnx(dt))}}, dt, rows_g, rows_spec, base + "/valid");
      count = c.emit("ReduceSum", {valid}, AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}, dt, {},
                     ShardingSpec::replicated(0), base + "/count");
    } else {
      count = add_scalar_constant(g, "rows", static_cast<double>(shape_numel(rows_g)), dt);
    }
    coef = c.emit("Div", {dloss, count}, {}, dt, {}, c.spec(dloss), base + "/coef");
  }
  ValueId result = c.emit("Mul", {diff, coef}, {}, dt, gs, c.spec(n.outputs[0]), base + "/grad");
  NodeId last = g.value(result).producer;
  ValueId out = n.outputs[0];
  g.remove_node(id);
  g.set_output(last, 0, out);
  return Status::ok();
}

}  // namespace ops

namespace {

std::vector<OpExample> cross_entropy_examples() {
  std::vector<OpExample> sce;
  for (const char* red : {"mean", "sum", "none"}) {
    sce.push_back(example(red, {ex_float({4, 6}, -2, 2), ex_ints({1, 0, 5, 2}, {4})}, AttrMap{{"reduction", Attribute::of_string(red)}}));
  }
  Tensor w(DType::kF64, {6});
  for (int i = 0; i < 6; ++i) w.mutable_data<double>()[i] = 0.5 + 0.17 * i;
  sce.push_back(example("ignore index, weights, extra dims",
                        {ex_float({2, 6, 4}, -2, 2), ex_ints({1, -100, 4, 2, 0, 3, 5, 1}, {2, 4}), ex_data(w)},
                        AttrMap{{"ignore_index", Attribute::of_int(-100)}}));
  return sce;
}

}  // namespace

void register_loss_ops(OpRegistry& r) {
  for (const char* op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
    const bool nll = std::string(op) == "NegativeLogLikelihoodLoss";
    OpSchema s;
    s.op_type = op;
    s.min_inputs = 2;
    s.max_inputs = 3;
    s.max_outputs = nll ? 1 : 2;
    s.non_differentiable_inputs = {1, 2};
    s.traits = kTraitLoss;
    s.infer = infer_loss;
    s.grad = [nll](GradContext& c) {
      if (c.grad_out(1) != kNoId) return c.fail("the gradient through the log-probability output is not supported");
      AttrMap a{{"reduction", Attribute::of_string(c.attrs().get_string("reduction", "mean"))}};
      if (c.attrs().has("ignore_index")) a.set_int("ignore_index", c.attrs().get_int("ignore_index", -100));
      std::vector<ValueId> ins{c.grad_out(0), c.input(0), c.input(1)};
      if (c.node().has_input(2)) ins.push_back(c.input(2));
      c.add_grad(0, c.op(nll ? "NLLLossGrad" : "SoftmaxCrossEntropyGrad", ins, a, kOasesDomain));
      return Status::ok();
    };
    s.shard = [](ShardContext& c) { return shard_cross_entropy(c, 0, false); };
    s.lower = [nll](LowerContext& c) { return lower_cross_entropy(c, nll); };
    s.cost = [](const Graph& g, const Node& n) { return OpCost{6.0 * static_cast<double>(g.value(n.inputs[0]).numel()), io_bytes(g, n)}; };
    s.examples = nll ? examples_of({example("mean", {ex_float({4, 6}), ex_ints({1, 0, 5, 2}, {4})},
                                            AttrMap{{"reduction", Attribute::of_string("mean")}})})
                     : examples_of(cross_entropy_examples());
    r.add(std::move(s));
  }
}

}  // namespace oases
