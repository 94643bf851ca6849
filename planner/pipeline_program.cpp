#include "planner/pipeline_program.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "graph/autodiff.h"
#include "graph/blocks.h"
#include "graph/op_registry.h"
#include "graph/tiles.h"

namespace oases {

namespace {

bool forward_side(const Node& n) {
  return n.phase == Node::Phase::kForward || n.phase == Node::Phase::kLoss;
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

int count_blocks(const Graph& g) {
  int b = -1;
  for (NodeId id : g.nodes()) b = std::max(b, block_of_scope(g.node(id).scope));
  return b + 1;
}

Expected<StageAssignment> assign_stages(const Graph& g, const std::vector<ValueId>& params, const std::vector<StageCut>& cuts, int S) {
  StageAssignment a;
  a.blocks = count_blocks(g);
  if (static_cast<int>(cuts.size()) != S) return error("{} stage ranges for {} stages", cuts.size(), S);
  std::vector<int> stage_of_block(static_cast<size_t>(a.blocks), -1);
  for (int s = 0; s < S; ++s) {
    for (int b = cuts[static_cast<size_t>(s)].first; b <= cuts[static_cast<size_t>(s)].last; ++b) {
      if (b < 0 || b >= a.blocks) return error("stage {} names block {}; the model has {} blocks", s, b, a.blocks);
      stage_of_block[static_cast<size_t>(b)] = s;
    }
  }
  for (int b = 0; b < a.blocks; ++b) {
    if (stage_of_block[static_cast<size_t>(b)] < 0) return error("block {} is in no stage", b);
  }
  OASES_ASSIGN_OR_RETURN(std::vector<NodeId> topo, g.topo_order());
  const size_t N = static_cast<size_t>(g.max_node_id());
  std::vector<int> stage(N, -1);
  std::vector<char> copied(N, 0);
  // forward nodes outside the blocks that read only inputs, constants and other such nodes: copied
  for (NodeId id : topo) {
    const Node& n = g.node(id);
    // (collectives too, e.g. the data-parallel ShardSlice of the targets: each copy runs in its stage's groups)
    if (n.phase != Node::Phase::kForward || block_of_scope(n.scope) >= 0) continue;
    bool only_inputs = true;
    for (ValueId v : n.inputs) {
      NodeId p = v == kNoId ? kNoId : g.producer(v);
      if (p != kNoId && !copied[static_cast<size_t>(p)]) only_inputs = false;
    }
    copied[static_cast<size_t>(id)] = only_inputs;
  }
  // the other forward nodes: their block's stage; the loss the last; else after their producers
  for (NodeId id : topo) {
    const Node& n = g.node(id);
    if (!forward_side(n) || copied[static_cast<size_t>(id)]) continue;
    int s = 0;
    int b = block_of_scope(n.scope);
    if (n.phase == Node::Phase::kLoss) {
      s = S - 1;
    } else if (b >= 0) {
      s = stage_of_block[static_cast<size_t>(b)];
    } else {
      for (ValueId v : n.inputs) {
        NodeId p = v == kNoId ? kNoId : g.producer(v);
        if (p != kNoId && !copied[static_cast<size_t>(p)]) s = std::max(s, stage[static_cast<size_t>(p)]);
      }
    }
    stage[static_cast<size_t>(id)] = s;
  }
  // copied nodes: the stages of their forward readers; their backward goes to the first of them
  std::vector<std::set<int>> sets(N);
  auto reader_stages = [&](NodeId id, bool backward_too) {
    std::set<int>& out = sets[static_cast<size_t>(id)];
    for (ValueId o : g.node(id).outputs) {
      if (o == kNoId) continue;
      for (const Use& u : g.uses(o)) {
        const Node& c = g.node(u.node);
        if (!backward_too && !forward_side(c)) continue;
        if (copied[static_cast<size_t>(u.node)]) {
          out.insert(sets[static_cast<size_t>(u.node)].begin(), sets[static_cast<size_t>(u.node)].end());
        } else {
          out.insert(stage[static_cast<size_t>(u.node)]);
        }
      }
    }
  };
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    if (copied[static_cast<size_t>(*it)]) reader_stages(*it, false);
  }
  auto first_of = [&](NodeId p) {
    const std::set<int>& s = sets[static_cast<size_t>(p)];
    return s.empty() ? 0 : *s.begin();
  };
  // backward and recompute nodes: with their origin; without one, the first stage among the
  // producers that are not copies (else among the copies)
  for (NodeId id : topo) {
    const Node& n = g.node(id);
    if (forward_side(n)) continue;
    int s = -1;
    // autodiff's sums of a value's gradient contributions (graph/autodiff.cpp names them
    // ".../grad/accumulate") go where the contributions are, so a value read in the next stage
    // sends back one summed gradient, not one per reader
    bool fan_in_sum = n.op_type == "Add" && n.name.find("/grad/accumulate") != std::string::npos;
    if (n.origin != kNoId && g.alive(n.origin) && !fan_in_sum) {
      s = copied[static_cast<size_t>(n.origin)] ? first_of(n.origin) : stage[static_cast<size_t>(n.origin)];
    }
    if (s < 0) {
      int from_copies = -1;
      for (ValueId v : n.inputs) {
        NodeId p = v == kNoId ? kNoId : g.producer(v);
        if (p == kNoId) continue;
        if (copied[static_cast<size_t>(p)]) {
          int c = first_of(p);
          from_copies = from_copies < 0 ? c : std::min(from_copies, c);
        } else if (stage[static_cast<size_t>(p)] >= 0) {
          s = s < 0 ? stage[static_cast<size_t>(p)] : std::min(s, stage[static_cast<size_t>(p)]);
        }
      }
      if (s < 0) s = std::max(0, from_copies);
    }
    stage[static_cast<size_t>(id)] = s;
  }
  // copies also go where backward nodes read them
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    if (copied[static_cast<size_t>(*it)]) reader_stages(*it, true);
  }
  a.stages.assign(N, {});
  for (NodeId id : topo) {
    auto& out = a.stages[static_cast<size_t>(id)];
    if (copied[static_cast<size_t>(id)]) {
      out.assign(sets[static_cast<size_t>(id)].begin(), sets[static_cast<size_t>(id)].end());
      if (out.empty()) out.push_back(0);
    } else {
      out.push_back(stage[static_cast<size_t>(id)]);
    }
  }
  for (ValueId p : params) {
    std::set<int> holders;
    for (const Use& u : g.uses(p)) {
      for (int s : a.stages[static_cast<size_t>(u.node)]) holders.insert(s);
    }
    a.param_holders.emplace_back(holders.begin(), holders.end());
  }
  return a;
}

Expected<int> mark_stage_crossings(Graph& g, const std::vector<ValueId>& params, const std::vector<StageCut>& cuts) {
  OASES_ASSIGN_OR_RETURN(StageAssignment sa, assign_stages(g, params, cuts, static_cast<int>(cuts.size())));
  std::map<ValueId, ValueId> marked;
  for (NodeId id : g.nodes()) {
    const std::vector<int> readers = sa.stages[static_cast<size_t>(id)];
    const std::vector<ValueId> ins = g.node(id).inputs;
    for (size_t slot = 0; slot < ins.size(); ++slot) {
      ValueId v = ins[slot];
      NodeId p = v == kNoId ? kNoId : g.producer(v);
      if (p == kNoId || static_cast<size_t>(p) >= sa.stages.size()) continue;
      const std::vector<int>& makers = sa.stages[static_cast<size_t>(p)];
      if (makers.size() != 1 || std::all_of(readers.begin(), readers.end(), [&](int r) { return r == makers[0]; })) continue;
      auto it = marked.find(v);
      if (it == marked.end()) {
        const Value val = g.value(v);
        const Node pn = g.node(p);
        ValueId w = g.add_value(g.unique_name(val.name + "/whole"), val.dtype, val.shape, true);
        NodeId m = g.add_node("Whole", {v}, {w}, {}, g.unique_name(val.name + "/whole"), kOasesDomain);
        Node& mn = g.node(m);
        mn.scope = pn.scope;
        mn.phase = pn.phase;
        mn.chunk = pn.chunk;
        // the partitioner anchors the conversions of the marker's output (for its readers) at the
        // marker: they inherit the origin those of the value itself would have had
        mn.origin = pn.origin;
        it = marked.emplace(v, w).first;
      }
      g.set_input(id, static_cast<int>(slot), it->second);
    }
  }
  return static_cast<int>(marked.size());
}

namespace {

// One value crossing from one stage to another.
struct Crossing {
  ValueId value = kNoId;  // in this rank's graph
  int64_t ident = 0;      // the same on every stage: the value's id, or (outputs) the values' count + its output slot
  int from = 0, to = 0;
  bool forward = true;
  int micro = 0;
  double issue = 0;  // in the unit-time pipeline
  bool once = false;  // of no micro-batch, backward: sent once a step when its stage's steps end
  // The global order. Ties: a once-a-step gradient from a later stage first, so a sum that reads
  // one sent back (a tied table: the head's share to the first stage, the total back) never comes
  // before it (the stages' steps may end together, as zb-h1's do).
  auto key() const { return std::make_tuple(issue, once ? -from : from, !forward, micro, ident, to); }
};

// One stage's partition as the other side of a transfer sees it.
struct StageSide {
  const Graph* graph = nullptr;
  const std::vector<ShardingSpec>* specs = nullptr;  // null: one rank, every value whole
  const Mesh* mesh = nullptr;
};

StageSide side_of(const GlobalProgram& gp) {
  if (gp.partitioned) return {&gp.partitioned->local, &gp.partitioned->specs, &gp.partitioned->mesh};
  return {&gp.train.graph, nullptr, &gp.mesh()};
}

// The global shape of a local tile laid out by `spec` on `mesh` (even splits).
Shape global_shape_of(const Shape& local, const ShardingSpec& spec, const Mesh& mesh) {
  Shape s = local;
  for (size_t d = 0; d < spec.dims.size() && d < s.size(); ++d) {
    if (spec.dims[d].axis >= 0) s[d] *= mesh.axis_size(spec.dims[d].axis);
  }
  return s;
}

// This rank's transfers, as the order phase needs them.
struct StageTransfers {
  std::vector<NodeId> channel_ops;       // in the global order
  std::map<NodeId, double> recv_issue;   // a receive: when its value is sent, in the unit-time pipeline
  std::map<NodeId, ValueId> send_input;  // a send: the value it sends
};

// The pipeline in unit times as one stage sees it: when each of its steps ends.
struct StageClock {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int me = 0, S = 1, M = 1, K = 1;  // this stage, the stages, micro-batches and chunks of one
  int V = 1;                        // virtual stages: model stage c on stage c mod S
  std::map<std::tuple<int, int, int>, double> step_end;  // (model stage, PipeStep::kind, micro-batch) -> end
  int group(int model_stage) const { return model_stage % S; }
};

// The order phase: the intra-stage schedule's order cut into the stage's pipeline steps, the
// transfers started in the global order (see the top of pipeline_program.h).
// `chunk_of`: per node, which of the stage's model stages it works for (its virtual stage, 0 … V − 1).
Expected<std::vector<ScheduledOp>> order_stage(const Graph& g, const ScheduleOptions& so, const StageTransfers& xfer, const StageClock& clock,
                                               const std::vector<ValueId>& params, const std::vector<int>& chunk_of, StageProgramInfo* info) {
  const std::vector<NodeId>& channel_ops = xfer.channel_ops;
  const std::map<NodeId, double>& recv_issue = xfer.recv_issue;
  const std::map<NodeId, ValueId>& send_input = xfer.send_input;
  const int me = clock.me, M = clock.M;
  auto micro_of = [&](const Node& n) { return n.chunk < 0 ? -1 : n.chunk / clock.K; };
  OASES_ASSIGN_OR_RETURN(std::vector<ScheduledOp> base, schedule_program(g, so));
  std::set<NodeId> channel_set(channel_ops.begin(), channel_ops.end());
  std::vector<NodeId> seq;
  for (const ScheduledOp& op : base) {
    if (op.kind != ScheduledOp::Kind::kCommWait && !channel_set.count(op.node)) seq.push_back(op.node);
  }
  CommIssuer issuer(g);  // the starts and waits, as in one mesh's schedules
  std::vector<char> emitted(static_cast<size_t>(g.max_node_id()), 0);
  std::vector<char> ready(g.num_values(), 0);
  for (ValueId v = 0; v < static_cast<ValueId>(g.num_values()); ++v) ready[static_cast<size_t>(v)] = g.producer(v) == kNoId;
  // A send's buffer is released at its wait: each send is awaited at the start of the second step
  // after the one that started it, so its transfer has the whole next step's compute to hide
  // behind and a stage keeps at most two steps' sends (every wait follows its start, and every
  // rank starts its transfers in the global order, so a wait never blocks a transfer it needs).
  int current_step = -1;
  std::vector<std::pair<int, NodeId>> sends_started;
  auto wait_sends_before = [&](int step) {
    for (const auto& [at, id] : sends_started) {
      if (at <= step - 2) issuer.wait(id);
    }
  };
  auto emit = [&](NodeId id) {
    issuer.issue(id);
    emitted[static_cast<size_t>(id)] = 1;
    for (ValueId o : g.node(id).outputs) {
      if (o != kNoId) ready[static_cast<size_t>(o)] = 1;
    }
    if (send_input.count(id)) sends_started.push_back({current_step, id});
  };
  size_t next_channel = 0;
  auto pump_channel = [&]() {
    while (next_channel < channel_ops.size()) {
      NodeId c = channel_ops[next_channel];
      auto s = send_input.find(c);
      if (s != send_input.end() && !ready[static_cast<size_t>(s->second)]) return;
      emit(c);
      ++next_channel;
    }
  };
  double now = -0.5;  // end of the last step run, in the unit-time pipeline
  auto inputs_ready = [&](NodeId id, bool in_time) {
    for (ValueId v : g.node(id).inputs) {
      if (v == kNoId) continue;
      if (!ready[static_cast<size_t>(v)]) return false;
      NodeId p = g.producer(v);
      if (in_time && p != kNoId) {
        auto r = recv_issue.find(p);
        if (r != recv_issue.end() && r->second > now) return false;
      }
    }
    return true;
  };
  // Nodes that read only inputs and constants (the loss's token count, masks, slices of the
  // targets) run as soon as they can, whatever micro-batch they name: a backward may need them
  // (the mean's divisor counts every micro-batch's tokens) before their micro-batch's forward.
  // Every other node runs in the first step at or after its own in which all its inputs exist
  // (a sum over the micro-batches' losses waits for the last of them).
  const size_t NN = static_cast<size_t>(g.max_node_id());
  std::vector<char> input_only(NN, 0);
  std::set<ValueId> param_set(params.begin(), params.end());
  for (NodeId id : seq) {
    const Node& n = g.node(id);
    if (!forward_side(n)) continue;
    bool only = true;
    for (ValueId v : n.inputs) {
      if (v == kNoId) continue;
      NodeId p = g.producer(v);
      // a trainable parameter is no input: what reads one is the model's own computation
      if (p == kNoId ? param_set.count(v) > 0 : !input_only[static_cast<size_t>(p)]) only = false;
    }
    input_only[static_cast<size_t>(id)] = only;
  }
  std::vector<PipeStep> steps = stage_steps(clock.schedule, me, clock.S, M, clock.V);
  std::map<std::tuple<int, int, int>, int> step_index;  // (PipeStep::kind, micro-batch, chunk) -> step
  for (size_t i = 0; i < steps.size(); ++i) step_index[{steps[i].kind(), steps[i].micro, steps[i].chunk}] = static_cast<int>(i);
  // A schedule that splits the backward (zb-h1): a backward node runs in its micro-batch's B when a
  // gradient that micro-batch sends to the stage before needs it (the input gradient's chain),
  // else in its W (weight gradients, and what only they read). A stage that sends no gradient
  // (the first) has only W work.
  std::vector<char> input_grad(NN, 0);
  if (splits_backward(clock.schedule)) {
    std::vector<ValueId> stack;
    for (const auto& [op, v] : send_input) {
      // a backward transfer of one micro-batch's value (not a sum sent once a step)
      NodeId made = g.producer(v);
      if (!forward_side(g.node(op)) && made != kNoId && micro_of(g.node(made)) >= 0) stack.push_back(v);
    }
    while (!stack.empty()) {
      ValueId v = stack.back();
      stack.pop_back();
      NodeId p = g.producer(v);
      if (p == kNoId || channel_set.count(p) || forward_side(g.node(p)) || input_grad[static_cast<size_t>(p)]) continue;
      input_grad[static_cast<size_t>(p)] = 1;
      for (ValueId in : g.node(p).inputs) {
        if (in != kNoId) stack.push_back(in);
      }
    }
    // A recomputed forward value only a W reads (SwiGLU's product for the down projection's
    // weight gradient) is recomputed in the B that reads its inputs: W then holds that one value,
    // not the inputs it is made from (gate and up, twice the bytes) until the bubble.
    std::vector<char> read_in_b(g.num_values(), 0);
    for (NodeId id : seq) {
      if (!input_grad[static_cast<size_t>(id)]) continue;
      for (ValueId in : g.node(id).inputs) {
        if (in != kNoId) read_in_b[static_cast<size_t>(in)] = 1;
      }
    }
    for (NodeId id : seq) {
      const Node& n = g.node(id);
      if (n.phase != Node::Phase::kRecompute || input_grad[static_cast<size_t>(id)]) continue;
      bool b_inputs = false;
      for (ValueId in : n.inputs) b_inputs = b_inputs || (in != kNoId && read_in_b[static_cast<size_t>(in)]);
      if (b_inputs) input_grad[static_cast<size_t>(id)] = 1;
    }
  }
  std::vector<int> target(NN, -1);  // the step a node runs in; -1: none (as soon as it can)
  std::vector<char> tagged(NN, 0);  // runs in a step (else: as soon as its inputs are there)
  std::vector<NodeId> untagged;
  for (NodeId id : seq) {
    const Node& n = g.node(id);
    int t = -1;
    for (ValueId v : n.inputs) {
      NodeId p = v == kNoId ? kNoId : g.producer(v);
      if (p != kNoId && !channel_set.count(p)) t = std::max(t, target[static_cast<size_t>(p)]);
    }
    int m = input_only[static_cast<size_t>(id)] ? -1 : micro_of(n);
    if (m >= 0) {
      int kind = forward_side(n) ? 0 : splits_backward(clock.schedule) && !input_grad[static_cast<size_t>(id)] ? 2 : 1;
      if (kind == 2 && info) info->weight_nodes.insert(n.name);
      const int v = static_cast<size_t>(id) < chunk_of.size() ? chunk_of[static_cast<size_t>(id)] : 0;
      auto it = step_index.find({kind, m, v});
      if (it == step_index.end()) return error("stage {}: {} works on micro-batch {} of {} (virtual stage {})", me, n.describe(), m, M, v);
      t = std::max(t, it->second);
      tagged[static_cast<size_t>(id)] = 1;
    } else {
      untagged.push_back(id);
    }
    target[static_cast<size_t>(id)] = t;
  }
  auto emit_ready_untagged = [&](bool in_time) {
    for (bool changed = true; changed;) {
      changed = false;
      for (NodeId id : untagged) {
        if (emitted[static_cast<size_t>(id)] || !inputs_ready(id, in_time)) continue;
        emit(id);
        pump_channel();
        changed = true;
      }
    }
  };
  // an untagged node a step needs now: with its untagged inputs first
  std::function<Status(NodeId)> emit_with_inputs = [&](NodeId id) -> Status {
    for (ValueId v : g.node(id).inputs) {
      if (v == kNoId || ready[static_cast<size_t>(v)]) continue;
      NodeId p = g.producer(v);
      if (p == kNoId || channel_set.count(p) || tagged[static_cast<size_t>(p)] || emitted[static_cast<size_t>(p)])
        return error("stage {}: {} needs '{}' before the pipeline order makes it", me, g.node(id).describe(), g.value(v).name);
      OASES_RETURN_IF_ERROR(emit_with_inputs(p));
    }
    emit(id);
    pump_channel();
    return Status::ok();
  };
  // A sum over the micro-batches (a weight's gradient: autodiff's Add of the sum so far and this
  // micro-batch's contribution) runs as soon as its contribution is made, inside the step: added
  // after the step, a micro-batch's weight gradients of every block of the stage were alive
  // together beside the sums. The same sums in the same order, only sooner.
  std::vector<std::vector<NodeId>> untagged_sums(g.num_values());
  for (NodeId id : untagged) {
    const Node& n = g.node(id);
    if (n.op_type != "Add" || forward_side(n)) continue;
    for (ValueId v : n.inputs) {
      if (v != kNoId) untagged_sums[static_cast<size_t>(v)].push_back(id);
    }
  }
  std::function<void(NodeId)> emit_sums_after = [&](NodeId made) {
    for (ValueId o : g.node(made).outputs) {
      if (o == kNoId) continue;
      for (NodeId sum : untagged_sums[static_cast<size_t>(o)]) {
        if (emitted[static_cast<size_t>(sum)] || !inputs_ready(sum, true)) continue;
        emit(sum);
        pump_channel();
        emit_sums_after(sum);
      }
    }
  };
  pump_channel();
  emit_ready_untagged(true);
  for (size_t i = 0; i < steps.size(); ++i) {
    const PipeStep& st = steps[i];
    current_step = static_cast<int>(i);
    wait_sends_before(current_step);
    for (NodeId id : seq) {
      if (emitted[static_cast<size_t>(id)] || !tagged[static_cast<size_t>(id)] || target[static_cast<size_t>(id)] != static_cast<int>(i)) continue;
      OASES_RETURN_IF_ERROR(emit_with_inputs(id));
      emit_sums_after(id);
    }
    now = clock.step_end.at({me + st.chunk * clock.S, st.kind(), st.micro});
    emit_ready_untagged(true);
  }
  emit_ready_untagged(false);
  for (NodeId id : seq) {
    if (!emitted[static_cast<size_t>(id)]) OASES_RETURN_IF_ERROR(emit_with_inputs(id));
  }
  pump_channel();
  if (next_channel < channel_ops.size())
    return error("stage {}: transfer {} cannot start in the global order", me, g.node(channel_ops[next_channel]).describe());
  issuer.finish();
  if (info) {
    info->steps = steps;
    info->peak_in_flight = peak_in_flight(steps);
  }
  return issuer.take();
}

// One rank's stage program, built in named phases (build() runs them in order):
//   check      the plan, its machine and the stage programs agree; this rank's stage;
//   cut        this rank's partition of its stage's program, recomputation applied, and every
//              node's stages (assign_stages);
//   clock      the pipeline in unit times: when each stage's steps end (the transfers' order);
//   crossings  the values this rank sends to or receives from another stage, in the global order;
//   transfers  the stage's graph: the other stages' nodes out, each crossing an oases.Reshard
//              between the two stage meshes with its transfer plan for the machine;
//   outputs    the stage's loss (last stage), parameters and gradients;
//   order      order_stage, then fusion and the memory plan (lay_out_program).
class StageBuilder {
 public:
  StageBuilder(const std::vector<const GlobalProgram*>& globals, const Plan& plan, const ReshardCluster& machine, int64_t world_rank,
               const RankProgramOptions& opts, StageProgramInfo* info)
      : globals_(globals), plan_(plan), machine_(machine), world_rank_(world_rank), opts_(opts), info_(info) {}

  Expected<RankProgram> build() {
    OASES_RETURN_IF_ERROR(check());
    OASES_RETURN_IF_ERROR(cut());
    OASES_RETURN_IF_ERROR(clock());
    OASES_ASSIGN_OR_RETURN(std::vector<Crossing> crossings, find_crossings());
    OASES_RETURN_IF_ERROR(place_transfers(crossings));
    stage_outputs();
    OASES_ASSIGN_OR_RETURN(rp_.order, order_stage(g_, so_, xfer_, clock_, params_, chunk_of_, info_));
    rp_.saved_bytes = saved_activation_bytes(g_, rp_.order);
    rp_.saved_count = saved_activation_count(g_, rp_.order);
    // the sends' outputs are empty and read by nobody: kept, so no pass drops the sends
    std::set<ValueId> keep = opts_.keep;
    for (const auto& [n, v] : xfer_.send_input) keep.insert(g_.node(n).outputs[0]);
    OASES_ASSIGN_OR_RETURN(rp_.program, lay_out_program(g_, rp_.order, keep, fusion_for(opts_.fuse, opts_.device)));
    rp_.program.reshards = std::move(reshards_);
    rp_.train.graph = std::move(g_);
    return std::move(rp_);
  }

 private:
  Status check() {
    clock_.S = static_cast<int>(plan_.num_stages());
    clock_.M = static_cast<int>(plan_.micro_batches > 0 ? plan_.micro_batches : clock_.S);
    clock_.K = static_cast<int>(plan_.mesh().chunk_count());
    clock_.V = static_cast<int>(std::max<int64_t>(plan_.virtual_stages, 1));
    if (clock_.S < 1 || globals_.size() != static_cast<size_t>(clock_.S))
      return error("a pipeline of {} stages, {} micro-batches, {} stage programs", clock_.S, clock_.M, globals_.size());
    OASES_ASSIGN_OR_RETURN(cuts_, stage_cuts_of(plan_));
    OASES_ASSIGN_OR_RETURN(clock_.schedule, parse_pipeline(plan_.pipeline));
    OASES_RETURN_IF_ERROR(check_virtual_stages(clock_.schedule, clock_.S, clock_.M, clock_.V, static_cast<int>(cuts_.size())));
    for (int s = 0; s < clock_.S; ++s) {
      if (plan_.stage_ranks(s) < 1) return error("stage {} has {} ranks", s, plan_.stage_ranks(s));
      if (globals_[static_cast<size_t>(s)]->world != plan_.stage_ranks(s))
        return error("stage {}'s program was partitioned over {} ranks, the stage has {}", s, globals_[static_cast<size_t>(s)]->world,
                     plan_.stage_ranks(s));
    }
    if (machine_.world() != plan_.world())
      return error("the transfers are planned for a machine of {} ranks, the pipeline has {}", machine_.world(), plan_.world());
    if (world_rank_ < 0 || world_rank_ >= plan_.world()) return error("world rank {} of a {}-rank pipeline", world_rank_, plan_.world());
    clock_.me = plan_.stage_of_rank(world_rank_);
    global_ = globals_[static_cast<size_t>(clock_.me)];
    // the model's own values: ids below this are the same in every stage's partition
    base_values_ = global_->train.graph.num_values();
    for (const GlobalProgram* other : globals_) {
      if (other->train.graph.num_values() != base_values_ || other->train.graph.outputs().size() != global_->train.graph.outputs().size())
        return error("the stages' programs are of different training graphs ({} and {} values): every stage needs the same model, micro-batches, chunks and dtype",
                     base_values_, other->train.graph.num_values());
    }
    return Status::ok();
  }

  Status cut() {
    const int64_t local = world_rank_ - plan_.first_rank(clock_.me);
    rp_.rank = local;
    rp_.mesh = global_->mesh();
    if (global_->partitioned) {
      g_ = opts_.slice_constants ? local_graph_for_rank(*global_->partitioned, local) : global_->partitioned->local;
      rp_.collectives = global_->partitioned->collectives;
    } else {
      g_ = global_->train.graph;
    }
    params_ = global_->train.params;
    if (g_.outputs().size() != params_.size() + 1)
      return error("the training graph has {} outputs for {} parameters", g_.outputs().size(), params_.size());
    loss_ = g_.outputs()[0];
    grads_.assign(g_.outputs().begin() + 1, g_.outputs().end());
    // recomputation on the whole graph (its copies carry their origin, so they follow it)
    const MeshPlan& mp = global_->plan.mesh();
    OASES_ASSIGN_OR_RETURN(so_, schedule_by_name(mp.schedule.empty() ? "plain" : mp.schedule));
    so_.checkpoint = mp.recompute_mode();
    rp_.schedule = so_;
    OASES_ASSIGN_OR_RETURN(rp_.recompute, apply_recompute(g_, so_.checkpoint));
    OASES_ASSIGN_OR_RETURN(sa_, assign_stages(g_, params_, cuts_, C()));
    // each node this stage holds: the first of its model stages here
    chunk_of_.assign(static_cast<size_t>(g_.max_node_id()), 0);
    for (NodeId id : g_.nodes()) {
      for (int c : sa_.stages[static_cast<size_t>(id)]) {
        if (clock_.group(c) == clock_.me) {
          chunk_of_[static_cast<size_t>(id)] = c / clock_.S;
          break;
        }
      }
    }
    return Status::ok();
  }

  Status clock() {
    const auto C = static_cast<size_t>(this->C());
    PipelineTimes unit{std::vector<double>(C, 1.0), std::vector<double>(C, 2.0), std::vector<double>(C - 1, 0.0), false, {}};
    OASES_ASSIGN_OR_RETURN(PipelineSim sim, simulate_pipeline(clock_.schedule, clock_.M, unit, clock_.V));
    stage_end_.assign(static_cast<size_t>(clock_.S), 0);
    for (const PipelineEvent& e : sim.events) {
      if (e.transfer) continue;
      clock_.step_end[{e.stage, e.forward ? 0 : e.weight ? 2 : 1, e.micro}] = e.end_s;
      double& end = stage_end_[static_cast<size_t>(clock_.group(e.stage))];
      end = std::max(end, e.end_s);
    }
    return Status::ok();
  }

  int C() const { return clock_.S * clock_.V; }  // model stages
  bool in_stage(NodeId id, int s) const { return contains(sa_.stages[static_cast<size_t>(id)], s); }
  // in one of this stage's model stages
  bool held(NodeId id) const {
    const auto& st = sa_.stages[static_cast<size_t>(id)];
    return std::any_of(st.begin(), st.end(), [&](int c) { return clock_.group(c) == clock_.me; });
  }
  int home(NodeId id) const { return sa_.stages[static_cast<size_t>(id)].front(); }
  int micro_of(const Node& n) const { return n.chunk < 0 ? -1 : n.chunk / clock_.K; }

  // `v`, read on stage `to`, made on another: a crossing when this rank is on either side
  Status add_crossing(ValueId v, int to, const std::map<ValueId, size_t>& out_slot, std::map<std::pair<ValueId, int>, Crossing>* found) const {
    NodeId p = g_.producer(v);
    if (p == kNoId) return Status::ok();
    if (sa_.stages[static_cast<size_t>(p)].size() != 1)
      return error("{} is copied into several stages, yet stage {} lacks it", g_.node(p).describe(), to);
    int from = home(p);
    // model stages on one stage share its program: the value is there already
    if (clock_.group(from) == clock_.group(to)) return Status::ok();
    if (clock_.group(from) != clock_.me && clock_.group(to) != clock_.me) return Status::ok();
    Crossing t;
    t.value = v;
    auto slot = out_slot.find(v);
    t.ident = slot != out_slot.end() ? static_cast<int64_t>(base_values_ + slot->second) : static_cast<int64_t>(v);
    t.from = from;
    t.to = to;
    const Node& pn = g_.node(p);
    t.forward = forward_side(pn);
    t.micro = micro_of(pn);
    if (t.micro < 0) {
      t.micro = t.forward ? -1 : clock_.M;
      t.once = !t.forward;
      t.issue = t.forward ? -1.0 : stage_end_[static_cast<size_t>(clock_.group(from))];
    } else {
      auto it = clock_.step_end.find({from, t.forward ? 0 : 1, t.micro});
      if (it == clock_.step_end.end()) return error("{} works on micro-batch {}, which stage {} never runs", pn.describe(), t.micro, from);
      t.issue = it->second;
    }
    // one transfer per receiving stage: to the first of its model stages that reads the value
    auto [it, fresh] = found->emplace(std::make_pair(v, clock_.group(to)), t);
    if (!fresh && to < it->second.to) it->second = t;
    return Status::ok();
  }

  Expected<std::vector<Crossing>> find_crossings() const {
    std::map<std::pair<ValueId, int>, Crossing> found;
    std::map<ValueId, size_t> out_slot;  // the loss and the gradients: known by their slot on every stage
    for (size_t k = 0; k < g_.outputs().size(); ++k) out_slot.emplace(g_.outputs()[k], k);
    for (NodeId id : g_.nodes()) {
      for (int t : sa_.stages[static_cast<size_t>(id)]) {
        for (ValueId v : g_.node(id).inputs) {
          if (v == kNoId) continue;
          NodeId p = g_.producer(v);
          if (p != kNoId && !in_stage(p, t)) OASES_RETURN_IF_ERROR(add_crossing(v, t, out_slot, &found));
        }
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      NodeId p = g_.producer(grads_[i]);
      for (int t : sa_.param_holders[i]) {
        if (p != kNoId && !in_stage(p, t)) OASES_RETURN_IF_ERROR(add_crossing(grads_[i], t, out_slot, &found));
      }
    }
    if (g_.producer(loss_) != kNoId && !in_stage(g_.producer(loss_), C() - 1))
      OASES_RETURN_IF_ERROR(add_crossing(loss_, C() - 1, out_slot, &found));
    std::vector<Crossing> out;
    for (const auto& [k, t] : found) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const Crossing& a, const Crossing& b) { return a.key() < b.key(); });
    return out;
  }

  // a crossing value's global shape and layout on stage `s`'s mesh, from that stage's partition
  struct Laid {
    Shape shape;
    PlacedLayout side;
  };
  Expected<Laid> laid_out_on(int model_stage, const Crossing& t) const {
    const int s = clock_.group(model_stage);
    const GlobalProgram& gp = *globals_[static_cast<size_t>(s)];
    const StageSide side = side_of(gp);
    const std::string& name = g_.value(t.value).name;
    ValueId v = t.value;
    if (&gp != global_) {
      if (t.ident >= static_cast<int64_t>(base_values_)) {
        size_t k = static_cast<size_t>(t.ident - static_cast<int64_t>(base_values_));
        if (k >= side.graph->outputs().size()) return error("'{}' crosses as output {}, which stage {} lacks", name, k, s);
        v = side.graph->outputs()[k];
      } else if (static_cast<size_t>(v) >= base_values_) {
        return error("'{}' crosses from stage {} to {} as a value the partition made; stages of different layouts exchange only the model's own values",
                     name, t.from, t.to);
      }
    }
    if (static_cast<size_t>(v) >= side.graph->num_values()) return error("'{}' crossing to stage {} is not in stage {}'s program", name, t.to, s);
    const Value& val = side.graph->value(v);
    ShardingSpec spec = ShardingSpec::replicated(val.shape.size());
    if (side.specs) {
      if (static_cast<size_t>(v) >= side.specs->size()) return error("'{}' crosses from stage {} to {} but has no layout", name, t.from, t.to);
      spec = (*side.specs)[static_cast<size_t>(v)];
    }
    if (spec.any_partial())
      return error("'{}' crosses from stage {} to {} as a partial sum on stage {}'s mesh; cut the stages where values are whole", name, t.from,
                   t.to, s);
    Shape shape = side.specs ? global_shape_of(val.shape, spec, *side.mesh) : val.shape;
    std::vector<int64_t> ranks;
    for (int64_t i = 0; i < plan_.stage_ranks(s); ++i) ranks.push_back(plan_.first_rank(s) + i);
    return Laid{std::move(shape), PlacedLayout{PlacedMesh{*side.mesh, std::move(ranks)}, std::move(spec)}};
  }

  Status place_transfers(const std::vector<Crossing>& crossings) {
    for (NodeId id : g_.nodes()) {
      if (!held(id)) g_.remove_node(id);
    }
    // each distinct transfer planned once, for the plan's machine
    ReshardPlanner planner(machine_, ReshardOptions{});
    if (info_) {
      info_->transfers.clear();
      info_->transfer_nodes.clear();
    }
    for (const Crossing& t : crossings) {
      const Value& val = g_.value(t.value);
      OASES_ASSIGN_OR_RETURN(Laid src, laid_out_on(t.from, t));
      OASES_ASSIGN_OR_RETURN(Laid dst, laid_out_on(t.to, t));
      if (src.shape != dst.shape)
        return error("'{}' is {} on stage {} and {} on stage {}", val.name, shape_str(src.shape), t.from, shape_str(dst.shape), t.to);
      ReshardProblem problem{src.shape, static_cast<int64_t>(dtype_size(val.dtype)), src.side, dst.side};
      AttrMap a = reshard_attrs(problem, world_rank_, val.dtype, 1);
      const int gf = clock_.group(t.from), gt = clock_.group(t.to);
      if (info_)
        info_->transfers.push_back(fmt::format("{}>{} {}{} #{} {} {} -> {}{}", gf, gt, t.forward ? "F" : "B", t.micro, t.ident,
                                               shape_str(src.shape), a.get_string("src_layout", ""), a.get_string("dst_layout", ""),
                                               clock_.V > 1 ? fmt::format(" (model stages {}>{})", t.from, t.to) : ""));
      std::string name = g_.unique_name(fmt::format("pipe/{}/{}to{}", val.name, t.from, t.to));
      NodeId n = kNoId;
      if (gt == clock_.me) {
        n = g_.add_node("Reshard", {}, {t.value}, a, name, kOasesDomain);
        xfer_.recv_issue[n] = t.issue;
      } else {
        n = g_.add_node_new_outputs("Reshard", {t.value}, 1, a, name, kOasesDomain);
        xfer_.send_input[n] = t.value;
      }
      Node& nn = g_.node(n);
      nn.phase = t.forward ? Node::Phase::kForward : Node::Phase::kBackward;
      nn.chunk = -1;
      if (Status st = infer_node(g_, n); !st) return st.with_context(fmt::format("stage {} of world rank {}", clock_.me, world_rank_));
      auto planned = planner.plan(problem, 1);
      if (!planned) return planned.status().with_context(fmt::format("'{}' from stage {} to {}", val.name, t.from, t.to));
      reshards_[g_.node(n).name] = *planned;
      if (info_) info_->transfer_nodes.push_back(g_.node(n).name);
      xfer_.channel_ops.push_back(n);
      if (info_) ++(gt == clock_.me ? info_->receives : info_->sends);
    }
    for (ValueId v : std::vector<ValueId>(g_.inputs())) {
      if (g_.uses(v).empty()) g_.remove_input(v);
    }
    return Status::ok();
  }

  void stage_outputs() {
    TrainingGraph& tg = rp_.train;
    std::vector<ValueId> outs;
    if (clock_.me == clock_.S - 1) {
      outs.push_back(loss_);
      tg.loss = loss_;
    }
    if (info_) {
      info_->stage = clock_.me;
      info_->param_index.clear();
      info_->counts_in_norm.clear();
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& holders = sa_.param_holders[i];
      if (std::none_of(holders.begin(), holders.end(), [&](int c) { return clock_.group(c) == clock_.me; })) {
        if (g_.value(params_[i]).is_initializer) g_.remove_initializer(params_[i]);
        continue;
      }
      // updated in place: every rank owns its copy (ranks as threads share the template's tensors)
      if (!global_->partitioned) g_.value(params_[i]).constant = g_.value(params_[i]).constant.clone();
      tg.params.push_back(params_[i]);
      tg.grads.push_back(grads_[i]);
      outs.push_back(grads_[i]);
      rp_.param_bytes += static_cast<double>(g_.value(params_[i]).nbytes());
      rp_.updated_bytes += updated_bytes_of(g_, params_[i], grads_[i], global_->param_specs.at(i), global_->mesh(), plan_.zero > 0);
      if (info_) {
        info_->param_index.push_back(i);
        info_->counts_in_norm.push_back(clock_.group(holders.front()) == clock_.me);
      }
    }
    g_.set_outputs(outs);
    tg.targets = global_->train.targets;
    tg.appended_loss = global_->train.appended_loss;
    tg.vocab = global_->train.vocab;
    tg.frozen = global_->train.frozen;
  }

  const std::vector<const GlobalProgram*>& globals_;
  const Plan& plan_;
  const ReshardCluster& machine_;
  const int64_t world_rank_;
  const RankProgramOptions& opts_;
  StageProgramInfo* info_;
  std::vector<StageCut> cuts_;
  const GlobalProgram* global_ = nullptr;
  size_t base_values_ = 0;
  RankProgram rp_;
  Graph g_;
  std::vector<ValueId> params_, grads_;
  ValueId loss_ = kNoId;
  ScheduleOptions so_;
  StageAssignment sa_;
  StageClock clock_;  // the stage, the pipeline's counts and schedule (check), its steps' ends (clock)
  std::vector<double> stage_end_;
  StageTransfers xfer_;
  ReshardPlans reshards_;
  std::vector<int> chunk_of_;  // per node: its virtual stage on this stage (cut)
};

}  // namespace

Expected<std::vector<StageCut>> stage_cuts_of(const Plan& plan) {
  const int64_t S = plan.num_stages();
  for (int64_t k = 0; k < S; ++k) {
    if (plan.stages[static_cast<size_t>(k)].blocks.empty()) return error("stage {} of {} has no block range", k, S);
  }
  // the last model stage's range ends the model
  const std::vector<std::string> ranges = split_cuts(plan.cuts());
  int first = 0, last = -1;
  if (ranges.empty() || std::sscanf(ranges.back().c_str(), "%d-%d", &first, &last) != 2 || last < 0)
    return error("stage {}'s blocks '{}' are not FIRST-LAST", S - 1, plan.stages.back().blocks);
  return cut_stages(last + 1, static_cast<int>(plan.model_stages()), plan.cuts());
}

Status check_stage_transfers(const std::vector<int>& stage_of, const std::vector<std::vector<std::string>>& transfers) {
  auto between = [&](size_t r, int a, int b) {
    std::vector<std::string> out;
    std::string ab = fmt::format("{}>{} ", a, b), ba = fmt::format("{}>{} ", b, a);
    for (const std::string& t : transfers[r]) {
      if (t.rfind(ab, 0) == 0 || t.rfind(ba, 0) == 0) out.push_back(t);
    }
    return out;
  };
  // the first rank of each stage speaks for it; every other rank is compared with it and with the other stages' first
  std::map<int, size_t> first;
  for (size_t r = 0; r < stage_of.size() && r < transfers.size(); ++r) first.emplace(stage_of[r], r);
  for (size_t r = 0; r < stage_of.size() && r < transfers.size(); ++r) {
    for (const auto& [t, f] : first) {
      const int a = stage_of[r];
      if (f == r) continue;
      std::vector<std::string> mine = between(r, a, t), theirs = between(f, a, t);
      if (mine == theirs) continue;
      size_t i = 0;
      while (i < mine.size() && i < theirs.size() && mine[i] == theirs[i]) ++i;
      return error("world ranks {} (stage {}) and {} (stage {}) disagree on their transfers between stages {} and {}: transfer {} is '{}' on one, '{}' on the other",
                   r, a, f, t, std::min(a, t), std::max(a, t), i + 1, i < mine.size() ? mine[i] : "(none)",
                   i < theirs.size() ? theirs[i] : "(none)");
    }
  }
  return Status::ok();
}

Expected<RankProgram> build_stage_program(const GlobalProgram& global, const Plan& plan, const ReshardCluster& machine, int64_t world_rank,
                                          const RankProgramOptions& opts, StageProgramInfo* info) {
  std::vector<const GlobalProgram*> all(static_cast<size_t>(plan.num_stages()), &global);
  return build_stage_program(all, plan, machine, world_rank, opts, info);
}

Expected<RankProgram> build_stage_program(const StageGlobals& sg, int64_t world_rank, const RankProgramOptions& opts, StageProgramInfo* info) {
  return build_stage_program(sg.programs(), sg.plan, sg.machine, world_rank, opts, info);
}

Expected<RankProgram> build_stage_program(const std::vector<const GlobalProgram*>& stage_globals, const Plan& plan,
                                          const ReshardCluster& machine, int64_t world_rank, const RankProgramOptions& opts,
                                          StageProgramInfo* info) {
  StageBuilder b(stage_globals, plan, machine, world_rank, opts, info);
  return b.build();
}

Expected<StageGlobals> build_plan_programs(Graph forward, const TrainingSpec& spec, const Plan& plan, int64_t world,
                                           const GlobalProgramOptions& opts) {
  if (plan.num_stages() > 1) return build_stage_globals(std::move(forward), spec, plan, opts);
  StageGlobals sg;
  OASES_ASSIGN_OR_RETURN(sg.first, build_global_program(std::move(forward), spec, plan, world, opts));
  sg.plan = plan;
  sg.machine = reshard_cluster(world, {}, {}, {});
  return sg;
}

Expected<RankProgram> build_rank_program(const StageGlobals& sg, int64_t world_rank, const RankProgramOptions& opts, StageProgramInfo* info) {
  if (sg.plan.num_stages() <= 1) return build_rank_program(sg.first, world_rank, opts);
  if (!info) return Status::error("a pipeline rank's program needs its stage record");
  return build_stage_program(sg, world_rank, opts, info);
}

std::vector<const GlobalProgram*> StageGlobals::programs() const {
  std::vector<const GlobalProgram*> out;
  for (int64_t k = 0; k < plan.num_stages(); ++k) out.push_back(&program(static_cast<int>(k)));
  return out;
}

Expected<StageGlobals> build_stage_globals(Graph forward, const TrainingSpec& spec, const Plan& plan, const GlobalProgramOptions& opts) {
  const int64_t S = plan.num_stages();
  const MeshPlan& m0 = plan.mesh();
  const int64_t M = plan.micro_batches > 0 ? plan.micro_batches : S;
  if (S < 2) return error("a pipeline of {} stages", S);
  // the stages' block ranges first: the programs mark the values that cross them
  int blocks = count_blocks(forward);
  if (blocks == 0) return error("{}: no transformer blocks found; pipeline stages are cut at block boundaries", opts.model_path);
  const int64_t C = plan.model_stages();  // with virtual stages, S x V block ranges
  if (plan.virtual_stages > 1) {
    OASES_ASSIGN_OR_RETURN(PipelineSchedule sched, parse_pipeline(plan.pipeline));
    OASES_RETURN_IF_ERROR(check_virtual_stages(sched, static_cast<int>(S), static_cast<int>(M), static_cast<int>(plan.virtual_stages), blocks)
                              .with_context(opts.model_path));
  }
  OASES_ASSIGN_OR_RETURN(std::vector<StageCut> cuts, cut_stages(blocks, static_cast<int>(C), plan.cuts()));
  GlobalProgramOptions go = opts;
  go.pipeline = true;
  go.stage_cuts = cuts;
  const int64_t chunks = m0.chunk_count();  // of one micro-batch, every stage's
  Plan p0 = plan;
  p0.stages = {m0};
  p0.mesh().blocks.clear();
  p0.mesh().chunks = chunks * M;
  StageGlobals sg;
  std::optional<Graph> copy;
  if (std::any_of(plan.stages.begin(), plan.stages.end(), [&](const MeshPlan& m) { return !same_stage_layout(m, m0); })) copy = forward;
  OASES_ASSIGN_OR_RETURN(sg.first, build_global_program(std::move(forward), spec, p0, plan.stage_ranks(0), go));
  // one program per distinct stage layout; the first stage's is sg.first (null here)
  std::vector<std::pair<MeshPlan, std::shared_ptr<const GlobalProgram>>> built{{m0, nullptr}};
  for (int64_t k = 0; k < S; ++k) {
    const MeshPlan& m = plan.stages[static_cast<size_t>(k)];
    auto same = std::find_if(built.begin(), built.end(), [&](const auto& b) { return same_stage_layout(b.first, m); });
    if (same != built.end()) {
      sg.own.push_back(same->second);
      continue;
    }
    Plan ps = p0;
    ps.mesh() = m;
    ps.mesh().blocks.clear();
    ps.mesh().chunks = chunks * M;
    ps.parameters.clear();  // a plan's parameter specs are for the first stage's mesh
    GlobalProgramOptions gs = go;
    gs.plan_path.clear();
    auto gk = build_global_program(*copy, spec, ps, plan.stage_ranks(k), gs);
    if (!gk) return gk.status().with_context(fmt::format("stage {} (tp {} x dp {})", k, m.tp, m.dp));
    sg.own.push_back(std::make_shared<const GlobalProgram>(std::move(*gk)));
    built.emplace_back(m, sg.own.back());
  }
  if (std::all_of(sg.own.begin(), sg.own.end(), [](const auto& p) { return p == nullptr; })) sg.own.clear();
  sg.plan = plan;
  sg.plan.micro_batches = M;
  const std::vector<std::string> ranges = split_cuts(stages_string(cuts));
  for (int64_t k = 0; k < S; ++k) {
    MeshPlan& m = sg.plan.stages[static_cast<size_t>(k)];
    m.ranks = plan.stage_ranks(k);
    m.blocks = stage_blocks(ranges, S, k);
  }
  OASES_RETURN_IF_ERROR(parse_pipeline(sg.plan.pipeline).status());
  sg.machine = reshard_cluster(sg.plan.world(), {}, {}, {});
  return sg;
}

}  // namespace oases
