#include "planner/schedule.h"

#include <algorithm>
#include <climits>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "graph/op_registry.h"

namespace oases {

Expected<ScheduleOptions> schedule_by_name(const std::string& name) {
  ScheduleOptions o;
  o.name = name;
  if (name == "plain") return o;
  if (name == "default_checkpoint") {
    o.checkpoint = CheckpointMode::kBlock;
  } else if (name == "optim_comm_checkpoint") {
    o.checkpoint = CheckpointMode::kCommOptimized;
  } else if (name == "overlap_checkpoint") {
    o.checkpoint = CheckpointMode::kBlock;
    o.interleave = true;
  } else if (name == "oases") {
    o.checkpoint = CheckpointMode::kCommOptimized;
    o.interleave = true;
  } else {
    return error("unknown schedule '{}' (plain, default_checkpoint, optim_comm_checkpoint, overlap_checkpoint, oases)", name);
  }
  return o;
}

namespace {

// After the last block (final norm, LM head, loss): a stage no block reaches.
constexpr int kTailStage = 1 << 20;
// Interleaved schedules number backward steps from here down (past every forward and loss stage).
constexpr int kBackwardSteps = 4 * kTailStage;

int scope_stage(const std::string& scope) {
  if (scope == "head" || scope == "final_norm" || scope == "loss") return kTailStage;
  if (scope.rfind("layer.", 0) != 0) return -1;
  size_t dot = scope.find('.', 6);
  int layer = std::atoi(scope.substr(6, dot == std::string::npos ? std::string::npos : dot - 6).c_str());
  std::string part = dot == std::string::npos ? "" : scope.substr(dot + 1);
  if (part.rfind("attn", 0) == 0) return 2 * layer;  // attn, attn.norm1
  if (part.rfind("mlp", 0) == 0) return 2 * layer + 1;
  return -1;  // others follow the data flow
}

bool forward_phase(const Node& n) {
  return n.phase == Node::Phase::kForward;
}
bool backward_phase(const Node& n) {
  return n.phase == Node::Phase::kBackward || n.phase == Node::Phase::kRecompute;
}

}  // namespace

std::vector<int> forward_stages(const Graph& g, bool collective_step) {
  std::vector<int> st(static_cast<size_t>(g.max_node_id()), -1);
  auto order = g.topo_order();
  if (!order) return st;
  for (NodeId id : *order) {
    const Node& n = g.node(id);
    if (!forward_phase(n) && n.phase != Node::Phase::kLoss) continue;
    int s = scope_stage(n.scope);
    for (ValueId v : n.inputs) {
      if (v == kNoId) continue;
      NodeId p = g.value(v).producer;
      if (p == kNoId) continue;
      const Node& pn = g.node(p);
      if (!forward_phase(pn) && pn.phase != Node::Phase::kLoss) continue;
      s = std::max(s, st[static_cast<size_t>(p)] + (collective_step && is_collective(pn) ? 1 : 0));
    }
    // a collective matmul's step s runs with the transfer s ring shifts in (planner/collective_matmul.h)
    if (collective_step) s += static_cast<int>(n.attrs.get_int("ring_step", 0));
    st[static_cast<size_t>(id)] = s;
  }
  return st;
}

namespace {

// Nodes whose value depends on a graph input (activations), as opposed to weights and constants.
std::vector<char> depends_on_inputs(const Graph& g, const std::vector<NodeId>& order) {
  std::vector<char> dep(static_cast<size_t>(g.max_node_id()), 0);
  for (NodeId id : order) {
    const Node& n = g.node(id);
    bool d = false;
    for (ValueId v : n.inputs) {
      if (v == kNoId) continue;
      const Value& val = g.value(v);
      if (val.is_input) d = true;
      if (val.producer != kNoId && dep[static_cast<size_t>(val.producer)]) d = true;
    }
    dep[static_cast<size_t>(id)] = d;
  }
  return dep;
}

int layer_of_stage(int s) {
  return s < 0 || s >= kTailStage ? -1 : s / 2;
}

}  // namespace

Expected<RecomputeReport> apply_recompute(Graph& g, CheckpointMode mode) {
  RecomputeReport rep;
  if (mode == CheckpointMode::kNone) return rep;
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topo_order());
  std::vector<int> stage = forward_stages(g, false);
  std::vector<char> act = depends_on_inputs(g, order);
  // A forward node is inside block L when it computes activations in layer L.
  auto block_of = [&](NodeId p) -> int {
    if (p == kNoId) return -1;
    const Node& n = g.node(p);
    if (!forward_phase(n) || !act[static_cast<size_t>(p)]) return -1;
    return layer_of_stage(stage[static_cast<size_t>(p)]);
  };
  // values the mode keeps: (kCommOptimized) outputs of forward collectives, the inputs of norms,
  // and, where a sub-layer has no collective (one rank), its last matrix product's output
  std::set<ValueId> kept;
  if (mode == CheckpointMode::kCommOptimized) {
    std::map<int, NodeId> last_product;  // stage -> last MatMul/Gemm of the sub-layer
    std::set<int> stage_has_collective;
    for (NodeId id : order) {
      const Node& n = g.node(id);
      if (!forward_phase(n) || !act[static_cast<size_t>(id)]) continue;
      int s = stage[static_cast<size_t>(id)];
      if (is_collective(n)) {
        stage_has_collective.insert(s);
        for (ValueId o : n.outputs) {
          if (o != kNoId) kept.insert(o);
        }
      }
      if (op_has_trait(n, kTraitNorm)) {
        kept.insert(n.inputs[0]);
      }
      if (op_has_trait(n, kTraitLinear) && scope_stage(n.scope) >= 0) {
        last_product[s * 1000 + std::max(0, n.chunk)] = id;  // per stage and chunk
      }
    }
    for (const auto& [key, id] : last_product) {
      if (!stage_has_collective.count(key / 1000)) kept.insert(g.node(id).outputs[0]);
    }
  }
  std::map<NodeId, NodeId> clone_of;  // original forward node -> its recompute copy
  // Recursively clones the producer of v (if it is block-internal and not kept) and returns the
  // value backward should read instead of v.
  std::function<ValueId(ValueId, int)> recompute = [&](ValueId v, int block) -> ValueId {
    NodeId p = g.value(v).producer;
    if (p == kNoId || block_of(p) != block || kept.count(v)) return v;
    auto it = clone_of.find(p);
    if (it == clone_of.end()) {
      Node orig = g.node(p);
      std::vector<ValueId> ins;
      for (ValueId u : orig.inputs) ins.push_back(u == kNoId ? kNoId : recompute(u, block));
      std::vector<ValueId> outs;
      for (ValueId o : orig.outputs) {
        if (o == kNoId) {
          outs.push_back(kNoId);
          continue;
        }
        const Value& ov = g.value(o);
        outs.push_back(g.add_value(g.unique_name(ov.name + "/recompute"), ov.dtype, ov.shape, true));
      }
      AttrMap attrs = orig.attrs;
      if (orig.op_type == "Dropout" && !attrs.has("key_node")) attrs.set_string("key_node", orig.name);
      NodeId c = g.add_node(orig.op_type, ins, outs, attrs, g.unique_name(orig.name + "/recompute"), orig.domain);
      Node& cn = g.node(c);
      cn.phase = Node::Phase::kRecompute;
      cn.origin = p;
      cn.scope = orig.scope;
      cn.chunk = orig.chunk;
      cn.opset = orig.opset;
      ++rep.nodes;
      if (is_collective(cn)) ++rep.collectives;
      it = clone_of.emplace(p, c).first;
    }
    const Node& orig = g.node(p);
    const Node& cl = g.node(it->second);
    for (size_t k = 0; k < orig.outputs.size(); ++k) {
      if (orig.outputs[k] == v) return cl.outputs[k];
    }
    return v;
  };
  // A backward node recomputes the values of its own block; what it reads from another block (the
  // block's input, which is the previous block's output) is that block's saved checkpoint.
  auto reader_block = [&](const Node& n) -> int {
    if (n.origin == kNoId || !g.alive(n.origin)) return -2;
    const Node& o = g.node(n.origin);
    if (!forward_phase(o)) return -2;
    return layer_of_stage(stage[static_cast<size_t>(n.origin)]);
  };
  for (NodeId id : order) {
    const Node n = g.node(id);
    if (n.phase != Node::Phase::kBackward) continue;
    int rb = reader_block(n);
    for (size_t s = 0; s < n.inputs.size(); ++s) {
      ValueId v = n.inputs[s];
      if (v == kNoId) continue;
      int b = block_of(g.value(v).producer);
      if (b < 0 || b != rb) continue;
      ValueId r = recompute(v, b);
      if (r != v) g.set_input(id, static_cast<int>(s), r);
    }
  }
  return rep;
}

Expected<std::vector<ScheduledOp>> schedule_program(const Graph& g, const ScheduleOptions& opt) {
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> topo, g.topo_order());
  std::vector<int> fst = forward_stages(g);
  std::vector<int> pos(static_cast<size_t>(g.max_node_id()), 0);
  for (size_t i = 0; i < topo.size(); ++i) pos[static_cast<size_t>(topo[i])] = static_cast<int>(i);
  // backward stages: the origin's forward stage, lowered by one after each backward collective
  std::vector<int> bst(static_cast<size_t>(g.max_node_id()), INT_MAX);
  for (NodeId id : topo) {
    const Node& n = g.node(id);
    if (!backward_phase(n)) continue;
    int s = n.origin != kNoId && g.alive(n.origin) ? fst[static_cast<size_t>(n.origin)] : INT_MAX;
    if (n.phase == Node::Phase::kBackward) {
      int after = INT_MAX;  // the step after its backward inputs'
      bool sums_chunks = false;
      for (ValueId v : n.inputs) {
        if (v == kNoId) continue;
        NodeId p = g.value(v).producer;
        if (p == kNoId || !backward_phase(g.node(p)) || g.node(p).phase == Node::Phase::kRecompute) continue;
        after = std::min(after, bst[static_cast<size_t>(p)] - (is_collective(g.node(p)) ? 1 : 0));
        sums_chunks = sums_chunks || (n.chunk < 0 && g.node(p).chunk >= 0);
      }
      // A sum over the chunks runs in the step of its last chunk's term, not at its origin's: the
      // origin is a weight's transpose (weight-only, no collective before it), which keeps its
      // block's first forward stage, so under tp the sums of a block's weight gradients fell behind
      // the next blocks' steps and every chunk's weight gradients were held till then (llama_4l
      // overlap_checkpoint K 8 tp 2 sp: program 15.5 -> 14.2 MiB; bench/plan/memory_table.py).
      s = sums_chunks ? after : std::min(s, after);
      if (s != INT_MAX) s -= static_cast<int>(n.attrs.get_int("ring_step", 0));
    }
    bst[static_cast<size_t>(id)] = s == INT_MAX ? INT_MAX - 1 : s;
  }
  // recompute nodes run just before the first backward node that needs them, in sub-steps split by
  // the collectives they repeat (so one chunk's repeated collective overlaps another's recompute)
  std::vector<int> sub(static_cast<size_t>(g.max_node_id()), 100);
  for (NodeId id : topo) {
    const Node& n = g.node(id);
    if (n.phase != Node::Phase::kRecompute) continue;
    int sb = 0;
    for (ValueId v : n.inputs) {
      if (v == kNoId) continue;
      NodeId p = g.value(v).producer;
      if (p != kNoId && g.node(p).phase == Node::Phase::kRecompute)
        sb = std::max(sb, sub[static_cast<size_t>(p)] + (is_collective(g.node(p)) ? 1 : 0));
    }
    sub[static_cast<size_t>(id)] = std::max(sb, static_cast<int>(n.attrs.get_int("ring_step", 0)));
  }
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    const Node& n = g.node(*it);
    if (n.phase != Node::Phase::kRecompute) continue;
    int s = INT_MIN;
    for (ValueId o : n.outputs) {
      if (o == kNoId) continue;
      for (const Use& u : g.uses(o)) s = std::max(s, bst[static_cast<size_t>(u.node)]);
    }
    bst[static_cast<size_t>(*it)] = s == INT_MIN ? bst[static_cast<size_t>(*it)] : s;
  }
  // Interleaved: a recompute node runs in the first backward step after the last one that starts a
  // collective before its readers' step, not in its readers' step, when the steps between start
  // none: the final norm's gradient (a step of its own, behind the head's backward all-reduce)
  // would otherwise run first, wait for that all-reduce with nothing to compute, and only then
  // recompute the last block; now that recomputation hides the head's all-reduce. Between blocks
  // the readers' step already follows the collective's and nothing moves. Only steps that need no
  // recomputation themselves are passed, and only up to a collective's step, so no block's
  // recomputation moves ahead of another block's backward (which would keep both blocks'
  // recomputed activations at once: parts without collectives, one rank).
  if (opt.interleave) {
    struct Step {
      bool starts = false;     // starts a collective
      bool recomputed = false;  // reads a recomputed value
    };
    std::map<int, Step> steps;  // by backward step (bst)
    for (NodeId id : topo) {
      const Node& n = g.node(id);
      if (n.phase != Node::Phase::kBackward) continue;
      Step& st = steps[bst[static_cast<size_t>(id)]];
      // (a stage's transfers do not count: a last stage with virtual stages received the gradient
      // of its first range at the top of the step, and the last block's recomputation moved
      // there ran ahead of the loss's backward with nothing to hide, holding its activations
      // across the head's)
      st.starts = st.starts || (is_collective(n) && n.op_type != "Reshard");
      for (ValueId v : n.inputs) {
        NodeId p = v == kNoId ? kNoId : g.value(v).producer;
        st.recomputed = st.recomputed || (p != kNoId && g.node(p).phase == Node::Phase::kRecompute);
      }
    }
    for (NodeId id : topo) {
      const Node& n = g.node(id);
      if (n.phase != Node::Phase::kRecompute) continue;
      int& b = bst[static_cast<size_t>(id)];
      // steps run from the highest bst down: walk up over steps that neither start a collective nor
      // recompute; keep the move only when it ends right after a collective's step
      int to = b;
      auto it = steps.upper_bound(b);
      for (; it != steps.end() && !it->second.starts && !it->second.recomputed; ++it) to = it->first;
      if (it != steps.end() && it->second.starts) b = to;
    }
  }
  // Interleaved, a weight gradient (what a backward node makes for the sums over the chunks: a
  // product of an activation and an output gradient) runs as soon as it is ready, ahead of the
  // step's other ready nodes of its chunk: it frees the activation it reads (often the last
  // reader) and makes only a weight-sized value. By node number alone it fell before or after the
  // rest of its part's backward depending on how the graph was built (a pipeline's last stage held
  // the MLP's product across SwiGLU's backward where its first stage did not). In line the order
  // stays by node number: there it made a chunk's collectives start later (default_checkpoint K 2
  // tp 4: 3.5 -> 0.6 ms of communication hidden).
  std::vector<char> weight_grad(static_cast<size_t>(g.max_node_id()), 0);
  if (opt.interleave) {
    for (NodeId id : topo) {
      const Node& n = g.node(id);
      if (n.phase != Node::Phase::kBackward || is_collective(n) || n.outputs.empty()) continue;
      bool all = true;
      for (ValueId o : n.outputs) {
        if (o == kNoId || g.is_output(o)) continue;
        const auto& uses = g.uses(o);
        // read only by the sums over chunks (not a transfer to another stage, not a collective)
        all = all && n.chunk >= 0 && !uses.empty() && std::all_of(uses.begin(), uses.end(), [&](const Use& u) {
                const Node& r = g.node(u.node);
                return r.chunk < 0 && r.op_type != "Reshard" && !is_collective(r);
              });
      }
      weight_grad[static_cast<size_t>(id)] = all;
    }
    // and what only weight gradients read (the activation's reshaped view a product takes)
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      const Node& n = g.node(*it);
      if (n.phase != Node::Phase::kBackward || is_collective(n) || weight_grad[static_cast<size_t>(*it)]) continue;
      bool only = !n.outputs.empty();
      for (ValueId o : n.outputs) {
        if (o == kNoId || g.is_output(o) || g.uses(o).empty()) {
          only = false;
          break;
        }
        const auto& uses = g.uses(o);
        only = only && std::all_of(uses.begin(), uses.end(), [&](const Use& u) { return weight_grad[static_cast<size_t>(u.node)] != 0; });
      }
      weight_grad[static_cast<size_t>(*it)] = only;
    }
  }
  using Key = std::tuple<int, int, int, int, int, int, int>;  // (class, a, b, c, d, e, topo)
  auto key_of = [&](NodeId id) -> Key {
    const Node& n = g.node(id);
    int chunk = std::max(0, n.chunk);
    int ph = forward_phase(n) ? 0 : (n.phase == Node::Phase::kLoss ? 1 : 2);
    int s = ph == 2 ? -bst[static_cast<size_t>(id)] : fst[static_cast<size_t>(id)];
    int sb = ph == 2 ? sub[static_cast<size_t>(id)] : 0;
    int cls = is_collective(n) ? 0 : 1;  // a ready collective starts at once
    // Interleaved: one chain of steps from the embedding through the head and the loss into the
    // backward pass (forward and loss steps by their forward stage, backward steps after every
    // forward one), each step run for every chunk in turn, so a chunk's collective flies while the
    // other chunks compute the same step also across the forward/loss/backward boundaries (no
    // drain at the head: the loss's all-reduces of one chunk overlap another's, and its backward).
    if (opt.interleave) {
      // (backward nodes whose origin precedes every stage, e.g. the loss gradient's softmax, take
      // the first backward steps, one more after each of their collectives, as before)
      int b = bst[static_cast<size_t>(id)];
      int v = ph != 2 ? s : b > 2 * kTailStage ? 2 * kTailStage + (INT_MAX - 1 - b) : kBackwardSteps - b;
      return Key{cls, v, sb, chunk, ph, weight_grad[static_cast<size_t>(id)] ? 0 : 1, pos[static_cast<size_t>(id)]};
    }
    // In line: forward, then the loss, then the backward; recompute nodes (ready as soon as the
    // forward is done: they read only saved values) wait behind the loss and every ready backward
    // node, so each block's recomputation runs just before its own backward needs it rather than
    // all of them ahead of the loss (which kept every block's recomputed activations at once).
    int order = ph == 1 ? 1 : n.phase == Node::Phase::kRecompute ? 2 : 0;
    return Key{cls, order, ph == 1 ? 0 : chunk, ph, s, sb, pos[static_cast<size_t>(id)]};
  };
  // list scheduling: Kahn's algorithm, smallest key first among ready nodes
  std::vector<int> indeg(static_cast<size_t>(g.max_node_id()), 0);
  for (NodeId id : topo) indeg[static_cast<size_t>(id)] = static_cast<int>(g.predecessors(id).size());
  std::priority_queue<std::pair<Key, NodeId>, std::vector<std::pair<Key, NodeId>>, std::greater<>> ready;
  for (NodeId id : topo) {
    if (indeg[static_cast<size_t>(id)] == 0) ready.push({key_of(id), id});
  }
  std::vector<NodeId> seq;
  while (!ready.empty()) {
    NodeId id = ready.top().second;
    ready.pop();
    seq.push_back(id);
    for (NodeId s : g.successors(id)) {
      if (--indeg[static_cast<size_t>(s)] == 0) ready.push({key_of(s), s});
    }
  }
  if (seq.size() != topo.size()) return Status::error("scheduling: the graph has a cycle");
  CommIssuer issuer(g);
  for (NodeId id : seq) issuer.issue(id);
  issuer.finish();
  return issuer.take();
}

void CommIssuer::wait(NodeId c) {
  if (waited_.insert(c).second) order_.push_back(ScheduledOp{ScheduledOp::Kind::kCommWait, c});
}

void CommIssuer::issue(NodeId id) {
  const Node& n = g_.node(id);
  const bool comm = is_collective(n);
  for (ValueId v : n.inputs) {
    auto it = pending_.find(v);
    if (it == pending_.end()) continue;
    // a collective reading another's output on the same channel: that channel's thread runs them
    // in order, no wait needed; across channels (Reshard on channel 1) the reader waits first
    if (!comm || g_.node(it->second).attrs.get_int("channel", 0) != n.attrs.get_int("channel", 0)) wait(it->second);
  }
  order_.push_back(ScheduledOp{comm ? ScheduledOp::Kind::kCommStart : ScheduledOp::Kind::kCompute, id});
  if (!comm) return;
  started_.push_back(id);
  for (ValueId o : n.outputs) {
    if (o != kNoId) pending_[o] = id;
  }
}

void CommIssuer::finish() {
  for (NodeId c : started_) wait(c);
}

namespace {

template <class F>
void for_each_saved(const Graph& g, const std::vector<ScheduledOp>& order, F&& f) {
  std::vector<int> fst = forward_stages(g, false);
  auto topo = g.topo_order();
  if (!topo) return;
  std::vector<char> act = depends_on_inputs(g, *topo);
  std::set<ValueId> seen;
  for (const ScheduledOp& op : order) {
    const Node& n = g.node(op.node);
    if (!backward_phase(n) || op.kind == ScheduledOp::Kind::kCommWait) continue;
    for (ValueId v : n.inputs) {
      if (v == kNoId || seen.count(v)) continue;
      NodeId p = g.value(v).producer;
      if (p == kNoId || !forward_phase(g.node(p)) || !act[static_cast<size_t>(p)]) continue;
      int s = fst[static_cast<size_t>(p)];
      if (s < 0) continue;
      seen.insert(v);
      int layer = layer_of_stage(s);
      f(layer, g.value(v));
    }
  }
}

}  // namespace

std::map<int, int64_t> saved_activation_bytes(const Graph& g, const std::vector<ScheduledOp>& order) {
  std::map<int, int64_t> out;
  for_each_saved(g, order, [&](int layer, const Value& v) { out[layer] += static_cast<int64_t>(v.nbytes()); });
  return out;
}

std::map<int, int> saved_activation_count(const Graph& g, const std::vector<ScheduledOp>& order) {
  std::map<int, int> out;
  for_each_saved(g, order, [&](int layer, const Value&) { out[layer]++; });
  return out;
}

}  // namespace oases
