#include "planner/analysis.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "graph/op_registry.h"
#include "planner/hybrid.h"
#include "planner/propagation.h"

namespace oases {

double TensorRecord::local_elements(int64_t t, int64_t dpk) const {
  double n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    double x = static_cast<double>(shape[d]);
    if (mark[d] == 'b') x /= static_cast<double>(dpk);
    if (mark[d] == 't') x /= static_cast<double>(t);
    n *= x;
  }
  return n;
}

Shape TensorRecord::local_shape(int64_t t, int64_t dpk) const {
  Shape s = shape;
  for (size_t d = 0; d < s.size(); ++d) {
    if (mark[d] == 'b') s[d] /= dpk;
    if (mark[d] == 't') s[d] /= t;
  }
  return s;
}

namespace {

TensorRecord record_of(const Graph& g, ValueId v, const ShardingSpec& s, int dp, int tp) {
  TensorRecord r;
  const Value& val = g.value(v);
  r.dtype = val.dtype;
  r.shape = val.shape;
  r.mark.assign(val.shape.size(), '-');
  for (size_t d = 0; d < s.dims.size() && d < r.mark.size(); ++d) {
    if (s.dims[d].axis == dp && dp >= 0) r.mark[d] = 'b';
    if (s.dims[d].axis == tp && tp >= 0) r.mark[d] = 't';
  }
  return r;
}

bool has_mark(const TensorRecord& r, char m) {
  return std::find(r.mark.begin(), r.mark.end(), m) != r.mark.end();
}

std::string record_text(const TensorRecord& r) {
  std::string s = dtype_name(r.dtype);
  s += "[";
  for (size_t d = 0; d < r.shape.size(); ++d) s += fmt::format("{}{}{}", d ? "," : "", r.shape[d], r.mark[d]);
  return s + "]";
}

struct Reference {
  ShardingResult sr;
  Mesh mesh;
  int dp = 0, tp = 1;
};

Expected<Reference> reference_split(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, int64_t tp, bool seqpar) {
  StrategyOptions so;
  so.tp = tp;
  so.dp = 1;
  so.sequence_parallel = seqpar;
  OASES_ASSIGN_OR_RETURN(Strategy st, megatron_strategy(forward, so));
  Reference r;
  r.mesh = st.mesh;
  r.dp = st.mesh.axis("dp");
  r.tp = st.mesh.axis("tp");
  std::map<ValueId, ShardingSpec> seeds = st.specs;
  // the reference splits the batch over a dp axis of one rank (so that batch dimensions are
  // marked); sequence-parallel pins keep it split there too
  if (r.dp >= 0) {
    for (auto& [v, spec] : st.pins) {
      if (!spec.dims.empty() && spec.dims[0].axis < 0) spec = spec.with_dim(0, r.dp);
    }
  }
  for (ValueId v : train.inputs()) {
    const Value& val = train.value(v);
    if (val.shape.empty()) continue;
    seeds[v] = ShardingSpec::replicated(val.shape.size()).with_dim(0, r.dp);
  }
  std::map<size_t, ShardingSpec> outs;
  const auto& o = train.outputs();
  for (size_t k = 0; k < o.size(); ++k) {
    outs[k] = ShardingSpec::replicated(train.value(o[k]).shape.size());
    if (k >= 1 && k - 1 < params.size()) {
      auto it = st.specs.find(params[k - 1]);
      if (it != st.specs.end()) outs[k] = it->second;
    }
  }
  OASES_ASSIGN_OR_RETURN(r.sr, propagate_sharding(train, st.mesh, seeds, outs, st.pins));
  return r;
}

// Part index of every node of the training graph (-1: none).
std::vector<int> assign_parts(const Graph& train, const std::vector<NodeId>& order, const std::map<std::string, int>& index) {
  std::vector<int> part(static_cast<size_t>(train.max_node_id()), -1);
  auto fwd = [](const Node& n) { return n.phase == Node::Phase::kForward || n.phase == Node::Phase::kLoss; };
  for (NodeId id : order) {
    const Node& n = train.node(id);
    std::string p = part_of_scope(n.scope);
    int pi = -1;
    auto it = index.find(p);
    if (it != index.end()) pi = it->second;
    if (pi < 0 && !fwd(n) && n.origin != kNoId && train.alive(n.origin)) pi = part[static_cast<size_t>(n.origin)];
    if (pi < 0) {
      for (ValueId v : n.inputs) {
        if (v == kNoId) continue;
        NodeId pr = train.value(v).producer;
        if (pr != kNoId && (fwd(train.node(pr)) == fwd(n))) pi = std::max(pi, part[static_cast<size_t>(pr)]);
      }
    }
    part[static_cast<size_t>(id)] = pi;
  }
  // what reads only weights and constants (a transposed weight): its first reader's part
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (part[static_cast<size_t>(*it)] >= 0) continue;
    const Node& n = train.node(*it);
    int best = -1;
    for (ValueId o : n.outputs) {
      if (o == kNoId) continue;
      for (const Use& u : train.uses(o)) {
        int q = part[static_cast<size_t>(u.node)];
        if (q >= 0 && (best < 0 || q < best)) best = q;
      }
    }
    part[static_cast<size_t>(*it)] = best;
  }
  return part;
}

Expected<std::vector<PartRecords>> records_under(const Graph& forward, const Graph& train, const std::vector<ValueId>& params,
                                                 const ModelStructure& ms, const std::vector<std::string>& parts,
                                                 const std::map<std::string, int>& index, const Reference& ref) {
  const OpRegistry& reg = OpRegistry::global();
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, train.topo_order());
  std::vector<int> part = assign_parts(train, order, index);
  std::vector<PartRecords> out(parts.size());
  const auto& specs = ref.sr.specs;
  auto spec_of = [&](ValueId v) -> const ShardingSpec& { return specs[static_cast<size_t>(v)]; };
  auto fwd = [](const Node& n) { return n.phase == Node::Phase::kForward || n.phase == Node::Phase::kLoss; };
  // activations: values that depend on a graph input
  std::vector<char> act(train.num_values(), 0);
  for (ValueId v : train.inputs()) act[static_cast<size_t>(v)] = 1;
  for (NodeId id : order) {
    const Node& n = train.node(id);
    bool a = false;
    for (ValueId v : n.inputs) a |= v != kNoId && act[static_cast<size_t>(v)];
    for (ValueId o : n.outputs) {
      if (o != kNoId) act[static_cast<size_t>(o)] = a;
    }
  }
  // A node reads an input in the spec its sharding rule asked for (a conversion to it where the
  // value is made otherwise) and makes an output in the spec the rule gave (a pinned value, the
  // sequence-parallel residual stream, is converted after): its records have the shapes its
  // kernel runs at.
  std::map<std::pair<NodeId, int>, const ShardingSpec*> read_as;
  std::map<ValueId, const ShardingSpec*> made_as;
  for (const Conversion& cv : ref.sr.conversions) {
    if (cv.consumer != kNoId) read_as[{cv.consumer, cv.slot}] = &cv.to;
    if (cv.consumer == kNoId && cv.slot < 0) made_as[cv.value] = &cv.from;
  }
  for (NodeId id : order) {
    const Node& n = train.node(id);
    int p = part[static_cast<size_t>(id)];
    if (p < 0) continue;
    const OpSchema* s = reg.find(n.domain, n.op_type);
    OpCost c = s && s->cost ? s->cost(train, n) : OpCost{};
    if (is_free_op(n, c)) continue;
    NodeRecord r;
    r.op = node_op_name(n);
    r.node = id;
    // products differ by which operand is transposed (the profile key says it)
    if (n.attrs.has("transA") || n.attrs.has("transB") || n.attrs.has("trans_a") || n.attrs.has("trans_b")) {
      r.op += fmt::format("|t{}{}", n.attrs.get_int("transA", n.attrs.get_int("trans_a", 0)),
                          n.attrs.get_int("transB", n.attrs.get_int("trans_b", 0)));
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      if (v == kNoId) continue;
      auto it = read_as.find({id, static_cast<int>(i)});
      r.inputs.push_back(record_of(train, v, it != read_as.end() ? *it->second : spec_of(v), ref.dp, ref.tp));
    }
    for (ValueId v : n.outputs) {
      if (v == kNoId) continue;
      auto it = made_as.find(v);
      const ShardingSpec& made = it != made_as.end() ? *it->second : spec_of(v);
      r.outputs.push_back(record_of(train, v, made, ref.dp, ref.tp));
      if (made.is_partial(ref.tp)) r.uses_tp = true;
      if (made.is_partial(ref.dp)) r.batch = true;
    }
    bool batch_in = false, batch_out = false;
    for (const auto* side : {&r.inputs, &r.outputs}) {
      for (const TensorRecord& t : *side) {
        (side == &r.inputs ? batch_in : batch_out) |= has_mark(t, 'b');
        r.batch |= has_mark(t, 'b');
        r.uses_tp |= has_mark(t, 't');
      }
    }
    r.flops = c.flops;
    r.bytes = c.bytes;
    r.phase = fwd(n) ? NodeRecord::Phase::kForward : NodeRecord::Phase::kBackward;
    r.weight_grad = !fwd(n) && batch_in && !batch_out;
    out[static_cast<size_t>(p)].nodes.push_back(std::move(r));
  }
  // collectives: the conversions, as the partitioner makes them (one per value and target spec,
  // whatever the number of readers: a sequence-parallel gather feeds the products and, backward,
  // the weight gradient)
  std::set<std::pair<ValueId, size_t>> converted;
  for (const Conversion& cv : ref.sr.conversions) {
    if (!converted.insert({cv.value, cv.to.hash()}).second) continue;
    NodeId at = cv.consumer != kNoId ? cv.consumer : train.value(cv.value).producer;
    int p = at != kNoId ? part[static_cast<size_t>(at)] : -1;
    if (p < 0) continue;
    NodeRecord::Phase ph = (at != kNoId && fwd(train.node(at))) ? NodeRecord::Phase::kForward : NodeRecord::Phase::kBackward;
    if (cv.consumer == kNoId && cv.slot >= 0) ph = NodeRecord::Phase::kBackward;  // gradients leaving as outputs
    ShardingSpec cur = cv.from;
    for (int a : {ref.dp, ref.tp}) {
      if (a < 0 || !cur.is_partial(a) || cv.to.is_partial(a)) continue;
      int e = cv.to.dim_of_axis(a);
      CommRecord cr;
      cr.over_dp = a == ref.dp;
      cr.phase = ph;
      cr.kind = (e >= 0 && cur.dims[static_cast<size_t>(e)].axis < 0) ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
      cr.tensor = record_of(train, cv.value, cur.without_partial(), ref.dp, ref.tp);
      cr.batch = has_mark(cr.tensor, 'b');
      out[static_cast<size_t>(p)].comms.push_back(cr);
      cur = cur.with_partial(a, false);
      if (cr.kind == CollectiveKind::kReduceScatter) cur = cur.with_dim(static_cast<size_t>(e), a);
    }
    for (int a : {ref.dp, ref.tp}) {
      if (a < 0) continue;
      int d = cur.dim_of_axis(a), e = cv.to.dim_of_axis(a);
      if (d < 0 || e == d) continue;
      CommRecord cr;
      cr.over_dp = a == ref.dp;
      cr.phase = ph;
      cr.kind = e >= 0 ? CollectiveKind::kAllToAll : CollectiveKind::kAllGather;
      cr.tensor = record_of(train, cv.value, cur.with_dim(static_cast<size_t>(d), -1), ref.dp, ref.tp);
      cr.batch = has_mark(cr.tensor, 'b');
      out[static_cast<size_t>(p)].comms.push_back(cr);
      cur = cur.with_dim(static_cast<size_t>(d), -1);
    }
  }
  // the vocabulary-parallel loss reduces its row statistics over tp: max, sum, target (forward),
  // max and sum again (backward)
  for (NodeId id : order) {
    const Node& n = train.node(id);
    int p = part[static_cast<size_t>(id)];
    if (p < 0) continue;
    bool loss = op_has_trait(n, kTraitLoss);
    bool grad = n.domain == kOasesDomain && (n.op_type == "SoftmaxCrossEntropyGrad" || n.op_type == "NLLLossGrad");
    if (!loss && !grad) continue;
    ValueId scores = n.inputs[loss ? 0 : 1], labels = n.inputs[loss ? 1 : 2];
    if (spec_of(scores).dims.size() < 2 || spec_of(scores).dims[1].axis != ref.tp || ref.tp < 0) continue;
    bool nll = n.op_type == "NegativeLogLikelihoodLoss" || n.op_type == "NLLLossGrad";
    int count = loss ? (nll ? 1 : 3) : (nll ? 0 : 2);
    for (int i = 0; i < count; ++i) {
      CommRecord cr;
      cr.phase = loss ? NodeRecord::Phase::kForward : NodeRecord::Phase::kBackward;
      cr.tensor = record_of(train, labels, spec_of(labels), ref.dp, ref.tp);
      cr.tensor.dtype = train.value(scores).dtype;
      cr.batch = has_mark(cr.tensor, 'b');
      out[static_cast<size_t>(p)].comms.push_back(cr);
    }
  }
  // weights, saved activations, entries
  for (ValueId w : params) {
    int p = -1;
    for (const Use& u : train.uses(w)) {
      int q = part[static_cast<size_t>(u.node)];
      if (q >= 0 && fwd(train.node(u.node)) && (p < 0 || q < p)) p = q;
    }
    if (p < 0) continue;
    double n = static_cast<double>(train.value(w).numel());
    out[static_cast<size_t>(p)].param_elements += n;
    if (!spec_of(w).is_replicated()) out[static_cast<size_t>(p)].split_param_elements += n;
  }
  // The layouts the backward reads a forward value in, once each: a value the forward converted for
  // its readers (under sequence parallelism the gathered sequence a product reads) is kept
  // converted. Empty when the backward does not read it.
  auto backward_reads = [&](ValueId o) {
    std::vector<const ShardingSpec*> kept_as;
    for (const Use& u : train.uses(o)) {
      if (fwd(train.node(u.node))) continue;
      auto it = read_as.find({u.node, u.slot});
      const ShardingSpec* as = it != read_as.end() ? it->second : &spec_of(o);
      if (std::none_of(kept_as.begin(), kept_as.end(), [&](const ShardingSpec* k) { return *k == *as; })) kept_as.push_back(as);
    }
    return kept_as;
  };
  // a value split over the batch (dp) under the reference split
  auto batch_split = [&](ValueId v) {
    if (v == kNoId || ref.dp < 0) return false;
    const ShardingSpec& sp = spec_of(v);
    return std::any_of(sp.dims.begin(), sp.dims.end(), [&](const DimSpec& d) { return d.axis == ref.dp; });
  };
  std::set<ValueId> norm_inputs;  // kept by the comm-optimised recomputation
  for (NodeId id : order) {
    const Node& n = train.node(id);
    int p = part[static_cast<size_t>(id)];
    if (p < 0 || !fwd(n)) continue;
    for (ValueId o : n.outputs) {
      if (o == kNoId || !act[static_cast<size_t>(o)]) continue;
      for (const ShardingSpec* as : backward_reads(o)) out[static_cast<size_t>(p)].saved.push_back(record_of(train, o, *as, ref.dp, ref.tp));
    }
    if (op_has_trait(n, kTraitNorm) && act[static_cast<size_t>(n.inputs[0])]) {
      out[static_cast<size_t>(p)].kept_comm_opt.push_back(record_of(train, n.inputs[0], spec_of(n.inputs[0]), ref.dp, ref.tp));
      norm_inputs.insert(n.inputs[0]);
    }
  }
  // Each value's storage: a view (an op whose output aliases an input: a reshaped gradient, a
  // product's operand) holds its source's, followed to the value that owns it
  std::vector<ValueId> storage(train.num_values());
  for (ValueId v = 0; v < static_cast<ValueId>(storage.size()); ++v) storage[static_cast<size_t>(v)] = v;
  for (NodeId id : order) {
    const Node& n = train.node(id);
    const OpSchema* ms = reg.find(n.domain, n.op_type);
    if (!ms || ms->view_of_input < 0 || !n.has_input(ms->view_of_input) || n.outputs.empty() || n.outputs[0] == kNoId) continue;
    storage[static_cast<size_t>(n.outputs[0])] = storage[static_cast<size_t>(n.inputs[static_cast<size_t>(ms->view_of_input)])];
  }
  // The backward's working set per part: a sweep over the training graph's order, the bytes under
  // the reference split of (a) the part's saved activations from the start of its backward to
  // their last reader and (b) every batch gradient from its maker to its last reader; each part
  // keeps the records alive at its busiest backward node.
  {
    std::vector<int> at(static_cast<size_t>(train.max_node_id()), -1);
    for (size_t i = 0; i < order.size(); ++i) at[static_cast<size_t>(order[i])] = static_cast<int>(i);
    std::vector<int> last(train.num_values(), -1);
    for (NodeId id : order) {
      for (ValueId v : train.node(id).inputs) {
        if (v != kNoId) last[static_cast<size_t>(v)] = std::max(last[static_cast<size_t>(v)], at[static_cast<size_t>(id)]);
      }
    }
    // a view counted once, as its storage, alive until the last reader of either (the programs'
    // memory plan shares it; counting both put a block's MLP backward a whole gradient high)
    for (ValueId v = 0; v < static_cast<ValueId>(storage.size()); ++v) {
      const ValueId src = storage[static_cast<size_t>(v)];
      if (src != v) last[static_cast<size_t>(src)] = std::max(last[static_cast<size_t>(src)], last[static_cast<size_t>(v)]);
    }
    // bytes under no split (what the sweep compares); records made only for the values kept
    auto whole_bytes = [&](ValueId v) { return static_cast<double>(train.value(v).nbytes()); };
    struct Live {
      ValueId v;
      const ShardingSpec* as;
      int from, to;
      int part;  // >= 0: a saved activation of this part (alive from its backward's start)
    };
    std::vector<Live> lives;
    for (NodeId id : order) {
      const Node& n = train.node(id);
      const int p = part[static_cast<size_t>(id)];
      for (ValueId o : n.outputs) {
        if (o == kNoId || storage[static_cast<size_t>(o)] != o || last[static_cast<size_t>(o)] < 0 || !act[static_cast<size_t>(o)]) continue;
        if (!fwd(n)) {
          if (batch_split(o)) lives.push_back(Live{o, &spec_of(o), at[static_cast<size_t>(id)], last[static_cast<size_t>(o)], -1});
          continue;
        }
        if (p < 0) continue;
        for (const ShardingSpec* as : backward_reads(o)) lives.push_back(Live{o, as, 0, last[static_cast<size_t>(o)], p});
      }
    }
    // bytes alive at each position: gradients (one sweep), each part's saved activations from its
    // backward's start until their last reader
    const size_t N = order.size();
    std::vector<double> grad_delta(N + 1, 0);
    std::vector<std::vector<std::pair<int, double>>> saved_ends(parts.size());
    std::vector<double> saved_total(parts.size(), 0);
    for (const Live& l : lives) {
      const double b = whole_bytes(l.v);
      if (l.part < 0) {
        grad_delta[static_cast<size_t>(l.from)] += b;
        grad_delta[static_cast<size_t>(l.to) + 1] -= b;
      } else {
        saved_total[static_cast<size_t>(l.part)] += b;
        saved_ends[static_cast<size_t>(l.part)].push_back({l.to, b});
      }
    }
    for (auto& e : saved_ends) std::sort(e.begin(), e.end());
    std::vector<size_t> next_end(parts.size(), 0);
    std::vector<double> gone(parts.size(), 0);
    std::vector<double> best_all(parts.size(), -1);
    std::vector<int> at_all(parts.size(), -1);
    double grads = 0;
    for (size_t i = 0; i < N; ++i) {
      grads += grad_delta[i];
      const NodeId id = order[i];
      const int p = part[static_cast<size_t>(id)];
      if (p < 0 || fwd(train.node(id))) continue;
      const size_t q = static_cast<size_t>(p);
      auto& ends = saved_ends[q];
      for (; next_end[q] < ends.size() && ends[next_end[q]].first < static_cast<int>(i); ++next_end[q]) gone[q] += ends[next_end[q]].second;
      const double all = grads + saved_total[q] - gone[q];
      if (all > best_all[q]) best_all[q] = all, at_all[q] = static_cast<int>(i);
    }
    for (size_t q = 0; q < parts.size(); ++q) {
      const int j = at_all[q];
      if (j < 0) continue;
      for (const Live& l : lives) {
        if (l.to < j) continue;
        if (l.part < 0 && l.from <= j) out[q].peak_grads.push_back(record_of(train, l.v, *l.as, ref.dp, ref.tp));
        if (l.part == static_cast<int>(q)) out[q].peak_saved.push_back(record_of(train, l.v, *l.as, ref.dp, ref.tp));
      }
    }
  }
  // the weight-gradient nodes' batch inputs, once a value
  {
    std::set<ValueId> seen;
    for (NodeId id : order) {
      const Node& n = train.node(id);
      const int p = part[static_cast<size_t>(id)];
      if (p < 0 || fwd(n)) continue;
      bool batch_out = false, batch_in = false;
      for (ValueId o : n.outputs) batch_out |= batch_split(o);
      for (ValueId v : n.inputs) batch_in |= batch_split(v);
      if (batch_out || !batch_in) continue;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (!batch_split(n.inputs[k])) continue;
        // a view (a product's operand reshaped) holds its source's storage: the source, once
        const ValueId v = storage[static_cast<size_t>(n.inputs[k])];
        const bool viewed = v != n.inputs[k];
        if (!batch_split(v) || !seen.insert(v).second) continue;
        auto it = viewed ? read_as.end() : read_as.find({id, static_cast<int>(k)});
        TensorRecord r = record_of(train, v, it != read_as.end() ? *it->second : spec_of(v), ref.dp, ref.tp);
        const NodeId maker = train.value(v).producer;
        const bool grad = maker != kNoId && !fwd(train.node(maker));
        (grad ? out[static_cast<size_t>(p)].weight_grad_inputs : out[static_cast<size_t>(p)].weight_act_inputs).push_back(std::move(r));
      }
    }
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& pn = parts[i];
    if (pn.rfind("layer.", 0) == 0 && pn.size() > 4 && pn.compare(pn.size() - 4, 4, ".mlp") == 0 &&
        parts[i - 1] == pn.substr(0, pn.size() - 4) + ".attn")
      out[i].block_saved_before = out[i - 1].saved;
  }
  if (!out.empty()) out.back().backward_first = parts.back() == "head";
  // A reduced value whose forward readers are Adds (a bias, then the residual) ending in a kept norm
  // input needs no keeping of its own: the recomputation restarts from that sum (the program keeps
  // it alone).
  std::function<bool(ValueId, int)> covered = [&](ValueId v, int depth) {
    if (norm_inputs.count(v)) return true;
    if (depth == 0) return false;
    bool any = false;
    for (const Use& u : train.uses(v)) {
      const Node& r = train.node(u.node);
      if (!fwd(r)) continue;
      if (r.op_type != "Add" || !covered(r.outputs[0], depth - 1)) return false;
      any = true;
    }
    return any;
  };
  std::set<std::pair<ValueId, std::string>> kept_converted;
  for (const Conversion& cv : ref.sr.conversions) {
    NodeId at = cv.consumer != kNoId ? cv.consumer : train.value(cv.value).producer;
    if (at == kNoId || !fwd(train.node(at)) || !act[static_cast<size_t>(cv.value)] || covered(cv.value, 3)) continue;
    int p = part[static_cast<size_t>(at)];
    // what a forward collective made: a reduction's result, and (sequence parallelism) a gather's
    // whole sequence that the next product reads back in its backward
    auto sharded_on_tp = [&](const ShardingSpec& sp) {
      return std::any_of(sp.dims.begin(), sp.dims.end(), [&](const DimSpec& d) { return d.axis == ref.tp; });
    };
    const bool gathered = ref.tp >= 0 && sharded_on_tp(cv.from) && !sharded_on_tp(cv.to) && !cv.to.any_partial();
    // once a value, however many readers took it converted (LLaMA's q, k and v read one gather)
    if (p >= 0 && (cv.from.is_partial(ref.tp) || gathered) && kept_converted.insert({cv.value, cv.to.to_string()}).second)
      out[static_cast<size_t>(p)].kept_comm_opt.push_back(record_of(train, cv.value, cv.to, ref.dp, ref.tp));
  }
  // the value entering each part
  for (size_t i = 0; i < parts.size(); ++i) {
    ValueId e = kNoId;
    const std::string& pn = parts[i];
    if (pn == "embedding") {
      for (const EmbeddingInfo& em : ms.embeddings) {
        if (em.role == "token") e = forward.node(em.gather).outputs[0];
      }
    } else if (pn == "head") {
      e = !ms.final_norms.empty() ? forward.node(ms.final_norms[0].node).inputs[0] : forward.node(ms.head.matmul).inputs[0];
    } else {
      size_t d1 = pn.find('.', 6);
      int b = std::atoi(pn.substr(6, d1 - 6).c_str());
      std::string sub = pn.substr(d1 + 1);
      for (const BlockInfo& bi : ms.blocks) {
        if (bi.index != b) continue;
        for (const NormInfo& nrm : bi.norms) {
          if (nrm.feeds == sub) e = forward.node(nrm.node).inputs[0];
        }
        if (e == kNoId) {
          const LinearInfo& l = sub == "attn" ? bi.attn.qkv.at(0) : bi.mlp.up.at(0);
          e = forward.node(l.matmul).inputs[0];
        }
      }
    }
    if (e != kNoId && static_cast<size_t>(e) < train.num_values()) out[i].entry = record_of(train, e, spec_of(e), ref.dp, ref.tp);
  }
  for (PartRecords& pr : out) {
    std::string sig;
    for (const NodeRecord& r : pr.nodes) {
      sig += r.op + (r.phase == NodeRecord::Phase::kForward ? "f" : "b");
      for (const TensorRecord& t : r.inputs) sig += record_text(t);
      sig += ">";
      for (const TensorRecord& t : r.outputs) sig += record_text(t);
      sig += ";";
    }
    for (const CommRecord& c : pr.comms)
      sig += fmt::format("{}{}{}{};", collective_name(c.kind), c.over_dp, static_cast<int>(c.phase), record_text(c.tensor));
    sig += fmt::format("p{}/{};e{}", pr.param_elements, pr.split_param_elements, record_text(pr.entry));
    for (const TensorRecord& t : pr.saved) sig += record_text(t);
    for (const TensorRecord& t : pr.kept_comm_opt) sig += record_text(t);
    for (const auto* list : {&pr.peak_saved, &pr.peak_grads, &pr.block_saved_before, &pr.weight_grad_inputs, &pr.weight_act_inputs}) {
      sig += "|";
      for (const TensorRecord& t : *list) sig += record_text(t);
    }
    sig += pr.backward_first ? "|first" : "";
    pr.signature = fmt::format("{:016x}", std::hash<std::string>{}(sig));
  }
  return out;
}

}  // namespace

ModelAnalyzer::ModelAnalyzer(const Graph& forward, const Graph& train, const std::vector<ValueId>& params)
    : forward_(forward), train_(train), params_(params) {}

Expected<ModelAnalysis> ModelAnalyzer::analyze(int64_t ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!model_read_) {
    ms_ = find_transformer_structure(forward_);
    parts_ = model_parts(ms_);
    if (parts_.empty()) return Status::error("no transformer parts recognised: nothing for the planner to split");
    for (ValueId v : train_.inputs()) {
      const Value& val = train_.value(v);
      if (is_integer(val.dtype) && val.shape.size() == 2 && batch_ == 0) {
        batch_ = val.shape[0];
        seq_ = val.shape[1];
      }
    }
    // why parts may not take different layouts, whatever the ranks ("" when they may)
    if (parts_.front() != "embedding" || parts_.back() != "head") {
      mixed_why_ = "no recognised token embedding and LM head";
    } else if (Status st = hybrid_inputs_supported(forward_); !st.is_ok()) {
      mixed_why_ = st.message();
    } else {
      for (const BlockInfo& b : ms_.blocks) {
        for (const char* sub : {"attn", "mlp"}) {
          bool has = std::string(sub) == "attn" ? b.has_attn : b.has_mlp;
          bool norm = false;
          for (const NormInfo& nrm : b.norms) norm |= nrm.feeds == sub;
          if (has && !norm) mixed_why_ = fmt::format("block {} has no norm before its {}", b.index, sub);
        }
      }
    }
    model_read_ = true;
  }
  ModelAnalysis a;
  a.parts = parts_;
  for (size_t i = 0; i < a.parts.size(); ++i) a.part_index[a.parts[i]] = static_cast<int>(i);
  a.hidden = ms_.hidden;
  a.vocab = ms_.vocab;
  a.tied_head = ms_.tied_head;
  if (ms_.tied_head && ms_.has_head) a.tied_table_elements = static_cast<double>(forward_.value(ms_.head.weight).numel());
  a.batch = batch_;
  a.seq = seq_;
  for (int64_t t = 1; t <= ranks; ++t) {
    if (ranks % t != 0) continue;
    if (t == 1) {
      a.tp_candidates.push_back(1);
      continue;
    }
    auto known = divides_.find(t);
    if (known == divides_.end()) {
      StrategyOptions so;
      so.tp = t;
      so.dp = 1;
      known = divides_.emplace(t, megatron_strategy(forward_, so).is_ok()).first;
    }
    if (known->second) a.tp_candidates.push_back(t);
  }
  bool pow2 = (ranks & (ranks - 1)) == 0;
  if (!pow2 || ranks > 128) {
    a.mixed_ok = false;
    a.mixed_why = pow2 ? "more than 128 ranks" : fmt::format("{} ranks is not a power of two", ranks);
  } else if (!mixed_why_.empty()) {
    a.mixed_ok = false;
    a.mixed_why = mixed_why_;
  }
  int64_t ref = 1;
  for (int64_t t : a.tp_candidates) {
    if (t > 1) {
      ref = t;
      break;
    }
  }
  a.reference_tp = ref > 1 ? ref : 0;
  auto rec = records_.find(ref);
  if (rec == records_.end()) {
    Records r;
    OASES_ASSIGN_OR_RETURN(Reference plain, reference_split(forward_, train_, params_, ref, false));
    OASES_ASSIGN_OR_RETURN(r.plain, records_under(forward_, train_, params_, ms_, a.parts, a.part_index, plain));
    if (ref > 1) {
      auto sp = reference_split(forward_, train_, params_, ref, true);
      if (sp) {
        auto recs = records_under(forward_, train_, params_, ms_, a.parts, a.part_index, *sp);
        if (recs) r.seqpar = std::move(*recs);
      }
    }
    rec = records_.emplace(ref, std::move(r)).first;
  }
  a.plain = rec->second.plain;
  a.seqpar = rec->second.seqpar;
  return a;
}

Expected<ModelAnalysis> analyze_model(const Graph& forward, const Graph& train, const std::vector<ValueId>& params, int64_t ranks) {
  return ModelAnalyzer(forward, train, params).analyze(ranks);
}

}  // namespace oases
