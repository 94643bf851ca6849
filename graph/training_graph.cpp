#include "graph/training_graph.h"

#include "graph/parameters.h"

#include <algorithm>
#include <optional>
#include <regex>

#include <fmt/ranges.h>

#include "graph/autodiff.h"
#include "graph/passes/pass.h"

namespace oases {

namespace {

bool is_scalar_float(const Value& v) {
  return is_floating(v.dtype) && v.numel() == 1 && v.shape.size() <= 1;
}

// The rows of the largest 2-D initializer a Gather indexes (0: none).
int64_t gathered_table_rows(const Graph& g) {
  int64_t rows = 0;
  for (ValueId v : g.initializers()) {
    const Value& val = g.value(v);
    for (const Use& u : val.uses) {
      if (g.node(u.node).op_type == "Gather" && u.slot == 0 && val.shape.size() == 2) rows = std::max(rows, val.shape[0]);
    }
  }
  return rows;
}

}  // namespace

Expected<TrainingGraph> build_training_graph(Graph g, const TrainingSpec& spec) {
  TrainingGraph tg;
  tg.roles = classify_initializers(g);
  OASES_RETURN_IF_ERROR(apply_parameter_overrides(g, tg.roles, spec.train, spec.freeze));
  if (spec.loss != "auto" && spec.loss != "cross_entropy") return error("unknown loss '{}' (auto or cross_entropy)", spec.loss);
  ValueId loss = kNoId, logits = kNoId;
  for (ValueId o : g.outputs()) {
    const Value& v = g.value(o);
    if (is_scalar_float(v) && loss == kNoId) loss = o;
    if (is_floating(v.dtype) && v.shape.size() >= 2 && logits == kNoId) logits = o;
  }
  if (spec.loss == "cross_entropy" || loss == kNoId) {
    if (logits == kNoId) {
      std::vector<std::string> outs;
      for (ValueId o : g.outputs()) outs.push_back(describe_value(g, o));
      return error(
          "the model has no scalar output to use as the loss and no logits output [..., V] to attach a "
          "cross-entropy loss to (outputs: {})",
          fmt::join(outs, ", "));
    }
    const Shape ls = g.value(logits).shape;
    if (shape_numel(ls) == 0) return error("logits output {} is empty: no cross-entropy loss to train on", describe_value(g, logits));
    int64_t vocab = ls.back();
    int64_t rows = shape_numel(ls) / vocab;
    Shape tshape(ls.begin(), ls.end() - 1);
    tg.targets = g.add_input("oases_targets", DType::kI64, tshape);
    auto add = [&](const std::string& op, std::vector<ValueId> ins, AttrMap a, DType dt, Shape s) {
      ValueId out = g.add_value(g.unique_name("oases_loss/" + op), dt, s, true);
      NodeId n = g.add_node(op, ins, {out}, std::move(a), g.unique_name("oases_loss/" + op));
      g.node(n).phase = Node::Phase::kLoss;
      g.node(n).scope = "loss";
      return out;
    };
    ValueId l2 = add("Reshape", {logits}, AttrMap{{"shape", Attribute::of_ints({rows, vocab})}}, g.value(logits).dtype, {rows, vocab});
    ValueId t2 = add("Reshape", {tg.targets}, AttrMap{{"shape", Attribute::of_ints({rows})}}, DType::kI64, {rows});
    loss = add("SoftmaxCrossEntropyLoss", {l2, t2},
               AttrMap{{"reduction", Attribute::of_string("mean")}, {"ignore_index", Attribute::of_int(spec.ignore_index)}},
               g.value(logits).dtype, {});
    tg.appended_loss = true;
    tg.vocab = vocab;
  }
  if (!is_floating(g.value(loss).dtype)) return error("loss '{}' is not floating-point", g.value(loss).name);
  {
    // sum / count instead of a mean: the same value, and a form that splits over data-parallel ranks
    auto rw = make_loss_sum_over_count_pass()->run(g);
    if (!rw) return rw.status();
  }
  if (spec.before_autodiff) {
    g.set_outputs({loss});
    OASES_ASSIGN_OR_RETURN(g, spec.before_autodiff(std::move(g)));
    loss = g.outputs().at(0);
  }

  // parameters vs buffers (graph/parameters.h), decided on the forward graph the exporter wrote;
  // the ValueIds of initializers survive the loss and before_autodiff rewrites
  std::vector<ValueId> candidates;
  for (const InitializerRole& r : tg.roles) {
    const Value& val = g.value(r.value);
    if (!r.trainable || val.dtype != DType::kF32) {
      tg.frozen.push_back(val.name);
      continue;
    }
    candidates.push_back(r.value);
  }
  if (candidates.empty()) {
    return error("there is no float32 initializer to train{}", tg.frozen.empty() ? "" : fmt::format(" ({} are frozen)", tg.frozen.size()));
  }
  OASES_ASSIGN_OR_RETURN(BackwardResult bw, build_backward(g, loss, candidates));
  std::vector<ValueId> outs{loss};
  for (ValueId p : candidates) {
    auto it = bw.grads.find(p);
    if (it == bw.grads.end()) {
      tg.frozen.push_back(g.value(p).name);  // does not influence the loss
      for (InitializerRole& r : tg.roles) {
        if (r.value == p) {
          r.trainable = false;
          r.reason = "does not influence the loss";
        }
      }
      continue;
    }
    tg.params.push_back(p);
    tg.grads.push_back(it->second);
    outs.push_back(it->second);
  }
  if (tg.params.empty()) return Status::error("no float32 initializer influences the loss");
  g.set_outputs(outs);
  DeadCodePass dce;
  auto d = dce.run(g);
  if (!d) return d.status();
  // on the graph as trained, dead code gone: a table whose rows never reach the loss sets no bound
  if (!tg.appended_loss) tg.vocab = gathered_table_rows(g);
  tg.loss = loss;
  tg.graph = std::move(g);
  return tg;
}

}  // namespace oases
