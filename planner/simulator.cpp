#include "planner/simulator.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "graph/blocks.h"

#include "graph/op_registry.h"

namespace oases {

namespace {

int layer_of(const Node& n) {
  return block_of_scope(n.scope);
}

}  // namespace

double covered_time(const std::vector<std::pair<double, double>>& busy, double a, double b) {
  auto it =
      std::lower_bound(busy.begin(), busy.end(), std::make_pair(a, 0.0), [](const auto& x, const auto& y) { return x.second < y.first; });
  double on = 0;
  for (; it != busy.end() && it->first < b; ++it) on += std::max(0.0, std::min(it->second, b) - std::max(it->first, a));
  return on;
}

double collective_node_seconds(const Graph& g, const Node& n, const Mesh& mesh, const SimOptions& o) {
  if (n.op_type == "ParallelIdentity") return 0;
  CollectiveKind k = CollectiveKind::kAllReduce;
  double bytes = 0;
  if (n.op_type == "AllReduce") {
    for (ValueId v : n.inputs) bytes += static_cast<double>(g.value(v).nbytes());
  } else if (n.op_type == "AllGather") {
    k = CollectiveKind::kAllGather;
    bytes = static_cast<double>(g.value(n.outputs[0]).nbytes());
  } else if (n.op_type == "ReduceScatter") {
    k = CollectiveKind::kReduceScatter;
    bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else if (n.op_type == "AllToAll") {
    k = CollectiveKind::kAllToAll;
    bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else if (n.op_type == "Broadcast") {
    k = CollectiveKind::kBroadcast;
    bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else if (n.op_type == "RingShift") {
    // one step of a ring: what one of the p - 1 steps of a ring all-gather of p such parts moves
    k = CollectiveKind::kAllGather;
    bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else {
    return 0;
  }
  int axis = static_cast<int>(n.attrs.get_int("mesh_axis", 0));
  if (axis < 0 || axis >= mesh.num_axes()) return 0;
  std::vector<int64_t> members = mesh.group(o.rank, axis);
  if (members.size() <= 1) return 0;
  double steps = 1;
  if (n.op_type == "RingShift") {
    steps = static_cast<double>(members.size() - 1);
    bytes *= static_cast<double>(members.size());
  }
  double s = o.cluster->collective_seconds(k, bytes, members);
  if (o.local_floor) {
    double floor = profiled_collective_seconds(*o.local_floor, k, bytes, static_cast<int64_t>(members.size()), "shared-memory");
    s = std::max(s, floor);
  }
  return s / steps;
}

namespace {

// One replay of the program. `busy_in`: per started collective, the share of its time the compute
// thread was busy in the previous replay (what the interference term scales); `busy_out` receives
// this replay's shares.
Expected<SimResult> replay(const Graph& g, const std::vector<ScheduledOp>& order, const Mesh& mesh, const SimOptions& o,
                           const std::map<NodeId, double>& busy_in, std::map<NodeId, double>* busy_out, bool trace) {
  SimResult r;
  double now = 0;                                         // compute thread
  double comm_free = 0;                                   // communication thread
  std::map<NodeId, std::pair<double, double>> comm_span;  // collective -> (start, end)
  std::vector<std::pair<double, double>> busy;            // compute intervals of the compute thread, in time order
  auto event = [&](const Node& n, const char* cat, int tid, double start, double dur) {
    if (!trace || dur <= 0) return;
    std::string name = std::string(cat) == "start" ? "start " + n.op_type : n.op_type;
    if (n.chunk >= 0) name += fmt::format(" (chunk {})", n.chunk);
    r.trace.push_back({{"name", std::string(cat) == "wait" ? "wait " + name : name},
                       {"cat", std::string(cat) == "wait" || std::string(cat) == "start" ? "comm" : cat},
                       {"ph", "X"},
                       {"ts", start * 1e6},
                       {"dur", std::max(dur * 1e6, 0.01)},
                       {"pid", 0},
                       {"tid", tid},
                       {"args", {{"node", n.name}, {"scope", n.scope}, {"chunk", n.chunk}, {"predicted", true}}}});
  };
  const double instr_s = o.ops->instr_seconds(), start_s = o.ops->comm_start_seconds();
  const double sync_s = o.ops->comm_sync_seconds(), beside_s = o.ops->comm_beside_compute_seconds();
  auto computed = [&](double start, double dur) {
    if (dur > 0) busy.emplace_back(start, start + dur);
  };
  for (const ScheduledOp& op : order) {
    const Node& n = g.node(op.node);
    bool coll = is_collective(n);
    if (op.kind != ScheduledOp::Kind::kCommStart && instr_s > 0) {  // the executor's dispatch
      computed(now, instr_s);
      now += instr_s;
      r.overhead_s += instr_s;
    }
    if (op.kind == ScheduledOp::Kind::kCompute && !coll) {
      double d = o.ops->node_seconds(g, n);
      event(n, "compute", 0, now, d);
      computed(now, d);
      now += d;
      r.compute_s += d;
      continue;
    }
    if (op.kind == ScheduledOp::Kind::kCompute) {  // a collective run in line
      double d = collective_node_seconds(g, n, mesh, o);
      if (d > 0) d += sync_s;
      event(n, "comm", 0, now, d);
      now += d;
      r.comm_s += d;
      r.exposed_s += d;
      if (d > 0) ++r.collectives;
      auto& pl = r.per_layer[layer_of(n)];
      pl.first += d;
      pl.second += d;
      continue;
    }
    if (op.kind == ScheduledOp::Kind::kCommStart) {
      double d = collective_node_seconds(g, n, mesh, o);
      if (d > 0) {
        auto b = busy_in.find(op.node);
        d += sync_s + (b != busy_in.end() ? b->second * beside_s : 0.0);
      }
      double start = std::max(now, comm_free);
      comm_free = start + d;
      comm_span[op.node] = {start, comm_free};
      event(n, "comm", 1, start, d);
      // handing it over costs the compute thread (the communication thread wakes on its core)
      event(n, "start", 0, now, start_s);
      computed(now, start_s);
      now += start_s;
      r.overhead_s += start_s;
      r.comm_s += d;
      if (d > 0) ++r.collectives;
      r.per_layer[layer_of(n)].first += d;
      continue;
    }
    // wait
    auto it = comm_span.find(op.node);
    if (it == comm_span.end()) return error("simulation: {} awaited before it started", n.describe());
    double wait = std::max(0.0, it->second.second - now);
    event(n, "wait", 0, now, wait);
    now += wait;
    r.exposed_s += wait;
    r.per_layer[layer_of(n)].second += wait;
  }
  if (busy_out) {
    busy_out->clear();
    for (const auto& [id, span] : comm_span) {
      double len = span.second - span.first;
      if (len <= 0) continue;
      (*busy_out)[id] = std::min(1.0, covered_time(busy, span.first, span.second) / len);
    }
  }
  now = std::max(now, comm_free);
  r.optimizer_s = o.ops->optimizer_seconds(o.param_bytes);
  r.step_s = now + r.optimizer_s;
  r.exposed_s = std::min(r.exposed_s, r.comm_s);
  return r;
}

}  // namespace

Expected<SimResult> simulate_rank(const Graph& g, const std::vector<ScheduledOp>& order_in, const Mesh& mesh, const SimOptions& o) {
  if (!o.cluster || !o.ops) return Status::error("simulate_rank needs a cluster and an op-time model");
  std::vector<ScheduledOp> order = order_in;
  if (order.empty()) {  // topological order, collectives in line
    OASES_ASSIGN_OR_RETURN(std::vector<NodeId> topo, g.topo_order());
    for (NodeId id : topo) order.push_back(ScheduledOp{ScheduledOp::Kind::kCompute, id});
  }
  if (o.ops->comm_beside_compute_seconds() <= 0) return replay(g, order, mesh, o, {}, nullptr, o.trace);
  // A collective beside computation takes longer than one the compute thread waits for: replay
  // once to learn which collectives overlap computation, then with their extra time (a few
  // rounds: the extra time moves the spans).
  std::map<NodeId, double> busy, next;
  for (int round = 0; round < 3; ++round) {
    OASES_RETURN_IF_ERROR(replay(g, order, mesh, o, busy, &next, false).status());
    busy.swap(next);
  }
  return replay(g, order, mesh, o, busy, nullptr, o.trace);
}

}  // namespace oases
