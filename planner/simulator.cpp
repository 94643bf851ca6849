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

namespace {

// What a collective node moves and among whom; false for nodes that move nothing.
struct CollectiveShape {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double bytes = 0;  // of the collective priced (a ring shift: the all-gather it is one step of)
  std::vector<int64_t> members;
  double steps = 1;  // a ring shift is one of the members - 1 steps of that collective
};

bool collective_shape(const Graph& g, const Node& n, const Mesh& mesh, int64_t rank, CollectiveShape* out) {
  if (n.op_type == "ParallelIdentity") return false;
  CollectiveShape c;
  if (n.op_type == "AllReduce") {
    for (ValueId v : n.inputs) c.bytes += static_cast<double>(g.value(v).nbytes());
  } else if (n.op_type == "AllGather") {
    c.kind = CollectiveKind::kAllGather;
    c.bytes = static_cast<double>(g.value(n.outputs[0]).nbytes());
  } else if (n.op_type == "ReduceScatter") {
    c.kind = CollectiveKind::kReduceScatter;
    c.bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else if (n.op_type == "FlatReduceScatter") {  // the distributed optimizer's gradient pieces
    c.kind = CollectiveKind::kReduceScatter;
    for (ValueId v : n.inputs) c.bytes += static_cast<double>(g.value(v).nbytes());
  } else if (n.op_type == "AllToAll") {
    c.kind = CollectiveKind::kAllToAll;
    c.bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else if (n.op_type == "Broadcast") {
    c.kind = CollectiveKind::kBroadcast;
    c.bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else if (n.op_type == "RingShift") {
    // one step of a ring: what one of the p - 1 steps of a ring all-gather of p such parts moves
    c.kind = CollectiveKind::kAllGather;
    c.bytes = static_cast<double>(g.value(n.inputs[0]).nbytes());
  } else {
    return false;
  }
  int axis = static_cast<int>(n.attrs.get_int("mesh_axis", 0));
  if (axis < 0 || axis >= mesh.num_axes()) return false;
  c.members = mesh.group(rank, axis);
  if (c.members.size() <= 1) return false;
  if (n.op_type == "RingShift") {
    c.steps = static_cast<double>(c.members.size() - 1);
    c.bytes *= static_cast<double>(c.members.size());
  }
  *out = std::move(c);
  return true;
}

// Whether the simulator shares the cores among the ranks' threads, communication threads
// included: a cluster whose ranks share cores and a profile that says what a collective's work is.
bool shares_cores(const SimOptions& o) {
  return o.cluster->cores_per_node > 0 && o.local_floor != nullptr;
}

}  // namespace

double collective_node_seconds(const Graph& g, const Node& n, const Mesh& mesh, const SimOptions& o) {
  CollectiveShape c;
  if (!collective_shape(g, n, mesh, o.rank, &c)) return 0;
  double s = o.cluster->collective_seconds(c.kind, c.bytes, c.members);
  if (o.local_floor) {
    double floor = profiled_collective_seconds(*o.local_floor, c.kind, c.bytes, static_cast<int64_t>(c.members.size()), "shared-memory");
    s = std::max(s, floor);
  }
  return s / c.steps;
}

namespace {

// What one replay learns for the next (the spans move with what it learnt, so a few rounds):
// per started collective, the share of its time the compute thread computed (what the profile's
// beside-computation term scales) and the same over its work phase (processor sharing); and the
// intervals in which the communication thread worked (the compute thread shares the cores then).
struct Overlaps {
  std::map<NodeId, double> beside, beside_work;
  std::vector<std::pair<double, double>> comm_work;  // sorted, disjoint (one communication thread)
};

// One replay of the program with what the previous one learnt (`in`); `out` receives this one's.
Expected<SimResult> replay(const Graph& g, const std::vector<ScheduledOp>& order, const Mesh& mesh, const SimOptions& o, const Overlaps& in,
                           Overlaps* out, bool trace) {
  SimResult r;
  double now = 0;                                         // compute thread
  double comm_free = 0;                                   // communication thread
  std::map<NodeId, std::pair<double, double>> comm_span;  // collective -> (start, end)
  std::map<NodeId, std::pair<double, double>> work_span;  // collective -> its work phase
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
  // Processor sharing of the cores the ranks of this host share (all running this program in
  // step): the op-time model's times already hold the slowdown of every rank's compute threads
  // at once (ClusterSpec::compute_slowdown); while the communication threads work too (a
  // collective's copying and reducing), each rank has one thread more on the cores (the share of
  // a core it takes there: the profile's comm_thread_share, fitted to the profiled runs).
  const bool ps = shares_cores(o);
  const ClusterSpec& cl = *o.cluster;
  const double ranks_on = static_cast<double>(cl.ranks_on_cores()), threads = static_cast<double>(std::max(1, cl.threads_per_rank));
  const double slow_compute = cl.compute_slowdown();
  const double slow_both = cl.sharing_slowdown(ranks_on * (threads + o.ops->comm_thread_share()));
  const double slow_comm_alone = cl.sharing_slowdown(ranks_on);
  const double stretch = ps ? slow_both / slow_compute : 1.0;  // on the compute thread's times while the communication threads work
  // end of `d` seconds of the compute thread's time (as the op-time model gives it) begun at `t`
  auto advance = [&](double t, double d) {
    if (stretch <= 1.0 || d <= 0 || in.comm_work.empty()) return t + d;
    auto it = std::upper_bound(in.comm_work.begin(), in.comm_work.end(), t,
                               [](double x, const std::pair<double, double>& iv) { return x < iv.second; });
    double left = d;
    for (;;) {
      if (it == in.comm_work.end()) return t + left;
      if (t < it->first) {  // before the next work phase: full rate
        if (left <= it->first - t) return t + left;
        left -= it->first - t;
        t = it->first;
      }
      double room = (it->second - t) / stretch;  // inside it: the stretched rate
      if (left <= room) return t + left * stretch;
      left -= room;
      t = it->second;
      ++it;
    }
  };
  auto computed = [&](double start, double end) {
    if (end > start) busy.emplace_back(start, end);
  };
  // a collective's time on the communication thread and its work phase, beside computation for
  // `share` of the latter
  auto collective_time = [&](const Node& n, double share, double* work_wall) {
    *work_wall = 0;
    if (!ps) return collective_node_seconds(g, n, mesh, o);
    CollectiveShape c;
    if (!collective_shape(g, n, mesh, o.rank, &c)) return 0.0;
    double link = cl.collective_seconds(c.kind, c.bytes, c.members) / c.steps;
    double work = collective_cpu_seconds(*o.local_floor, c.kind, c.bytes, static_cast<int64_t>(c.members.size())) / c.steps;
    *work_wall = work * (share * slow_both + (1.0 - share) * slow_comm_alone);
    return std::max(link, *work_wall);
  };
  r.instr_end_s.reserve(order.size());
  r.instr_wait_s.reserve(order.size());
  double forward_compute = 0;  // the forward's compute (what the distributed optimizer's gathers hide behind)
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0) r.instr_end_s.push_back(now);
    r.instr_wait_s.push_back(0);
    const ScheduledOp& op = order[i];
    const Node& n = g.node(op.node);
    bool coll = is_collective(n);
    if (op.kind != ScheduledOp::Kind::kCommStart && instr_s > 0) {  // the executor's dispatch
      double end = advance(now, instr_s);
      computed(now, end);
      r.overhead_s += end - now;
      now = end;
    }
    if (op.kind == ScheduledOp::Kind::kCompute && !coll) {
      double end = advance(now, o.ops->node_seconds(g, n));
      event(n, "compute", 0, now, end - now);
      computed(now, end);
      r.compute_s += end - now;
      if (n.phase == Node::Phase::kForward) forward_compute += end - now;
      now = end;
      continue;
    }
    if (op.kind == ScheduledOp::Kind::kCompute) {  // a collective run in line
      double work_wall = 0;
      double d = collective_time(n, 0.0, &work_wall);
      if (d > 0) d += sync_s;
      event(n, "comm", 0, now, d);
      now += d;
      r.instr_wait_s.back() = std::max(0.0, d - work_wall);
      r.comm_s += d;
      r.exposed_s += d;
      if (d > 0) ++r.collectives;
      auto& pl = r.per_layer[layer_of(n)];
      pl.first += d;
      pl.second += d;
      continue;
    }
    if (op.kind == ScheduledOp::Kind::kCommStart) {
      auto share_of = [&](const std::map<NodeId, double>& m) {
        auto b = m.find(op.node);
        return b != m.end() ? b->second : 0.0;
      };
      double work_wall = 0;
      double d = collective_time(n, share_of(in.beside_work), &work_wall);
      if (d > 0) d += sync_s + share_of(in.beside) * beside_s;
      double start = std::max(now, comm_free);
      comm_free = start + d;
      comm_span[op.node] = {start, comm_free};
      if (work_wall > 0) work_span[op.node] = {start, start + work_wall};
      event(n, "comm", 1, start, d);
      // handing it over costs the compute thread (the communication thread wakes on its core)
      double end = advance(now, start_s);
      event(n, "start", 0, now, end - now);
      computed(now, end);
      r.overhead_s += end - now;
      now = end;
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
    r.instr_wait_s.back() = wait;
    r.exposed_s += wait;
    r.per_layer[layer_of(n)].second += wait;
  }
  if (!order.empty()) r.instr_end_s.push_back(now);
  if (out) {
    *out = Overlaps{};
    auto share = [&](const std::pair<double, double>& span) {
      double len = span.second - span.first;
      return len > 0 ? std::min(1.0, covered_time(busy, span.first, span.second) / len) : 0.0;
    };
    for (const auto& [id, span] : comm_span) {
      if (span.second > span.first) out->beside[id] = share(span);
    }
    for (const auto& [id, span] : work_span) {
      out->beside_work[id] = share(span);
      out->comm_work.push_back(span);
    }
    std::sort(out->comm_work.begin(), out->comm_work.end());
  }
  now = std::max(now, comm_free);
  r.optimizer_s = o.ops->optimizer_seconds(o.param_bytes);
  // the distributed optimizer: the pieces of every gradient reduce-scattered in pieces are
  // all-gathered back as weights (executor/zero.h) beside the next step's first instructions, one
  // bucket ahead of the one read (Executor::defer_constant_writes): the first bucket waited for,
  // the rest hidden behind the forward's compute as far as it goes
  double gathers = 0, largest = 0;
  for (const ScheduledOp& op : order) {
    const Node& n = g.node(op.node);
    if (op.kind == ScheduledOp::Kind::kCommWait || n.domain != kOasesDomain || n.op_type != "FlatReduceScatter") continue;
    CollectiveShape c;
    if (!collective_shape(g, n, mesh, o.rank, &c)) continue;
    const double s = o.cluster->collective_seconds(CollectiveKind::kAllGather, c.bytes, c.members);
    gathers += s;
    largest = std::max(largest, s);
  }
  if (gathers > 0) {
    const double exposed = std::min(gathers, std::max(largest, gathers - forward_compute));
    r.comm_s += gathers;
    r.exposed_s += exposed;
    r.optimizer_s += exposed;
  }
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
  if (o.ops->comm_beside_compute_seconds() <= 0 && !shares_cores(o)) return replay(g, order, mesh, o, {}, nullptr, o.trace);
  // A collective beside computation takes longer than one the compute thread waits for, and
  // computation beside a collective's work is slower (both share the cores): replay once to learn
  // which collectives overlap computation, then with what that costs (a few rounds: it moves the
  // spans).
  Overlaps seen, next;
  for (int round = 0; round < 3; ++round) {
    OASES_RETURN_IF_ERROR(replay(g, order, mesh, o, seen, &next, false).status());
    seen = std::move(next);
  }
  return replay(g, order, mesh, o, seen, nullptr, o.trace);
}

}  // namespace oases
