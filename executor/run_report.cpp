#include "executor/run_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "executor/executor.h"
#include "graph/atomic_file.h"
#include "graph/blocks.h"
#include "graph/op_registry.h"

namespace oases {

namespace {

int layer_of(const Node& n) {
  return block_of_scope(n.scope);
}

// The report's group of a collective: where in the model it works, and which way.
std::string group_of(const Graph& g, const Node& n) {
  if (n.domain == kOasesDomain && n.op_type == "Reshard") return "transfers between meshes";
  bool fwd = n.phase == Node::Phase::kForward || n.phase == Node::Phase::kLoss;
  // data-parallel gradient all-reduces (bucketed or not) write the graph's gradient outputs
  if (!fwd && (n.op_type == "AllReduce" || n.op_type == "FlatReduceScatter")) {
    for (ValueId o : n.outputs) {
      if (o != kNoId && g.is_output(o)) return "data-parallel gradients";
    }
  }
  const char* way = n.phase == Node::Phase::kRecompute ? "recompute" : fwd ? "forward" : "backward";
  int layer = layer_of(n);
  if (layer >= 0) {
    std::string part = n.scope.find(".mlp") != std::string::npos ? "mlp" : n.scope.find(".attn") != std::string::npos ? "attn" : "block";
    return fmt::format("layer {} {} {}", layer, part, way);
  }
  std::string where = n.scope.empty() ? "other" : n.scope;
  return fmt::format("{} {}", where, way);
}

}  // namespace

void OverlapStats::add(const Graph& g, const std::vector<TraceEvent>& ev, double ms, bool count) {
  if (!count) return;
  ++steps;
  step_ms += ms;
  for (const TraceEvent& e : ev) {
    if (e.node == kNoId || !g.alive(e.node)) continue;
    const Node& n = g.node(e.node);
    if (e.category == "comm") {
      total.comm += e.dur_us;
      per_layer[layer_of(n)].comm += e.dur_us;
      if (e.thread == 0) {  // run in line: all of it exposed
        total.exposed += e.dur_us;
        per_layer[layer_of(n)].exposed += e.dur_us;
      }
    } else if (e.category == "wait") {
      total.exposed += e.dur_us;
      per_layer[layer_of(n)].exposed += e.dur_us;
    }
  }
  // per collective: issued, ran, awaited; the compute thread's busy time in between is its room
  struct Life {
    double issue = -1, start = -1, dur = 0, wait_at = -1, waited = 0;
    bool inline_run = false;
    int thread = 0;
  };
  std::map<NodeId, Life> life;
  std::vector<std::pair<double, double>> busy;  // compute intervals of the compute thread, in order
  struct Run {
    int thread;
    double from, to;
    NodeId node;
  };
  std::vector<Run> runs;  // the collectives' runs on their channel threads
  for (const TraceEvent& e : ev) {
    if (e.node == kNoId || !g.alive(e.node)) continue;
    if (e.category == "compute" && e.thread == 0) busy.push_back({e.start_us, e.start_us + e.dur_us});
    if (e.category == "issue") life[e.node].issue = e.start_us;
    if (e.category == "comm") {
      Life& l = life[e.node];
      l.start = e.start_us;
      l.dur += e.dur_us;
      l.inline_run = e.thread == 0;
      l.thread = e.thread;
      if (e.thread != 0) runs.push_back({e.thread, e.start_us, e.start_us + e.dur_us, e.node});
    }
    if (e.category == "wait") {
      life[e.node].wait_at = e.start_us;
      life[e.node].waited += e.dur_us;
    }
  }
  std::sort(busy.begin(), busy.end());
  std::vector<double> before(busy.size() + 1, 0);  // compute time of the intervals before i
  for (size_t i = 0; i < busy.size(); ++i) before[i + 1] = before[i] + (busy[i].second - busy[i].first);
  auto busy_until = [&](double t) {  // compute time before t
    size_t i = static_cast<size_t>(std::upper_bound(busy.begin(), busy.end(), std::make_pair(t, 1e300)) - busy.begin());
    double b = before[i];
    if (i > 0 && busy[i - 1].second > t) b -= busy[i - 1].second - t;
    return b;
  };
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return std::tie(a.thread, a.from) < std::tie(b.thread, b.from); });
  // compute between a and b while another collective than `id` ran on `thread`: a channel moves one
  // collective at a time, so compute it already hid is no room for the next one queued behind it
  auto taken_by_others = [&](int thread, NodeId id, double a, double b) {
    double t = 0;
    for (const Run& r : runs) {
      if (r.thread != thread || r.node == id || r.to <= a || r.from >= b) continue;
      t += std::max(0.0, busy_until(std::min(b, r.to)) - busy_until(std::max(a, r.from)));
    }
    return t;
  };
  for (const auto& [id, l] : life) {
    if (l.start < 0) continue;
    Group& gr = groups[group_of(g, g.node(id))];
    ++gr.count;
    gr.comm += l.dur;
    // hidden: the compute that ran while it ran; room: the compute between its start and its wait
    double hidden = 0, room = 0;
    if (!l.inline_run) {
      hidden = std::min(l.dur, std::max(0.0, busy_until(l.start + l.dur) - busy_until(l.start)));
      if (l.issue >= 0) {
        double until = l.wait_at >= 0 ? l.wait_at : busy.empty() ? l.issue : busy.back().second;
        double order = std::max(0.0, busy_until(until) - busy_until(l.issue));
        double queued = std::min(order, taken_by_others(l.thread, id, l.issue, until));
        room = order - queued;
        gr.queued += std::max(0.0, std::min(l.dur, order) - std::min(l.dur, room));
      }
    }
    gr.exposed += l.dur - hidden;
    gr.could += std::max(hidden, std::min(l.dur, room));
    if (l.issue >= 0) gr.late += std::max(0.0, l.start - l.issue);
  }
}
void OverlapStats::print(bool overlap_asked, const std::string& schedule) const {
  if (steps == 0) {
    std::fprintf(stderr, "overlap report: no step after the first to measure\n");
    return;
  }
  double n = steps;
  double comm = total.comm / 1000.0 / n, exposed = std::min(comm, total.exposed / 1000.0 / n), hidden = comm - exposed;
  std::fprintf(stderr,
               "overlap report (rank 0, mean of %d steps): step %.1f ms; communication %.1f ms: hidden %.1f ms (%.0f%%), exposed %.1f ms\n",
               steps, step_ms / n, comm, hidden, comm > 0 ? 100.0 * hidden / comm : 0.0, exposed);
  std::fprintf(stderr, "  %s\n", comm_thread_priority().c_str());
  for (const auto& [layer, acc] : per_layer) {
    double c = acc.comm / 1000.0 / n, x = std::min(c, acc.exposed / 1000.0 / n);
    std::fprintf(stderr, "  %-10s comm %8.2f ms  hidden %8.2f ms  exposed %8.2f ms\n",
                 layer < 0 ? "other" : fmt::format("layer {}", layer).c_str(), c, c - x, x);
  }
  // per group: could not (no compute beside it) and did not (compute there, the collective late)
  std::vector<std::pair<std::string, Group>> rows(groups.begin(), groups.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.exposed > b.second.exposed; });
  double could_all = 0, not_could = 0, not_did = 0, comm_all = 0, exposed_all = 0, queued_all = 0;
  for (const auto& [name, gr] : rows) {
    could_all += gr.could;
    queued_all += gr.queued;
    comm_all += gr.comm;
    exposed_all += gr.exposed;
    not_could += gr.comm - gr.could;
    not_did += gr.exposed - (gr.comm - gr.could);
  }
  std::fprintf(stderr,
               "per collective group (ms a step; hidden: compute ran while it ran; could hide: the compute between its issue and its\n"
               "wait while no other collective held its channel, up to its time; exposed = could not hide (no compute beside it in this\n"
               "order, or the channel busy with the collectives ahead) + did not hide (compute there and the channel free, but the\n"
               "collective started late or ran long); late: from its issue to its thread starting it):\n");
  std::fprintf(stderr, "  %-34s %5s %9s %9s %11s %9s %11s %9s %9s\n", "group", "count", "comm", "hidden", "could hide", "exposed", "could not",
               "did not", "late");
  size_t shown = 0;
  for (const auto& [name, gr] : rows) {
    if (++shown > 24) {
      std::fprintf(stderr, "  ... %zu more groups\n", rows.size() - 24);
      break;
    }
    double c = gr.comm / 1000.0 / n, x = gr.exposed / 1000.0 / n, cd = gr.could / 1000.0 / n;
    double cn = c - cd, dn = x - cn;
    std::fprintf(stderr, "  %-34s %5d %9.2f %9.2f %11.2f %9.2f %11.2f %9.2f %9.2f\n", name.c_str(), gr.count / steps, c, c - x, cd, x, cn, dn,
                 gr.late / 1000.0 / n);
  }
  const double hid_all = comm_all - exposed_all;
  std::fprintf(stderr,
               "  all: %.1f ms of collectives; could hide %.1f (%.0f%%), hid %.1f (%.0f%% of what could); exposed: could not %.1f ms, did not "
               "%.1f ms; the channel's queue took %.1f ms of room (compute beside the collective ahead)\n",
               comm_all / 1000.0 / n, could_all / 1000.0 / n, comm_all > 0 ? 100.0 * could_all / comm_all : 0.0, hid_all / 1000.0 / n,
               could_all > 0 ? 100.0 * hid_all / could_all : 0.0, not_could / 1000.0 / n, not_did / 1000.0 / n, queued_all / 1000.0 / n);
  if (comm > 0 && hidden < 0.05 * comm) {
    std::fprintf(stderr, "WARNING: %s\n",
                 overlap_asked ? fmt::format("overlap was asked for (--schedule {}) but almost no communication was hidden ({:.0f}%)",
                                             schedule, 100.0 * hidden / comm)
                                     .c_str()
                               : "no communication was hidden behind computation (use --schedule oases or overlap_checkpoint)");
  }
}

void append_trace(const Graph& g, const std::vector<TraceEvent>& ev, int rank, nlohmann::json* out, int stage) {
  if (out->empty()) {
    std::string pname = stage >= 0 ? fmt::format("rank {} (stage {})", rank, stage) : fmt::format("rank {}", rank);
    out->push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", pname}}}});
    out->push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    out->push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 1}, {"args", {{"name", "communication"}}}});
    out->push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 2}, {"args", {{"name", "transfers between meshes"}}}});
  }
  auto span = [&](const std::string& name, const TraceEvent& e, nlohmann::json args) {
    args["kind"] = e.category;
    out->push_back({{"name", name},
                    {"cat", e.category == "wait" ? "comm" : e.category},
                    {"ph", "X"},
                    {"ts", e.start_us},
                    {"dur", std::max(e.dur_us, 0.01)},
                    {"pid", rank},
                    {"tid", e.thread},
                    {"args", std::move(args)}});
  };
  for (const TraceEvent& e : ev) {
    if (e.category == "issue") continue;
    if (e.node == kNoId) {
      if (!e.label.empty()) span(e.label, e, nlohmann::json::object());  // the trainer's own work (its update)
      continue;
    }
    if (!g.alive(e.node)) continue;
    const Node& n = g.node(e.node);
    std::string name = e.category == "wait" ? "wait " + n.op_type : n.op_type;
    if (n.domain == kOasesDomain && n.op_type == "Reshard" && e.category != "wait") {
      // a cross-mesh transfer: which way, and the other side's first world rank
      bool sends = n.has_input(0);
      std::vector<int64_t> peer = n.attrs.get_ints(sends ? "dst_ranks" : "src_ranks");
      std::string what = n.has_input(0) ? g.value(n.inputs[0]).name : g.value(n.outputs[0]).name;
      name = fmt::format("{} {} {} rank {}", sends ? "send" : "recv", what, sends ? "to" : "from", peer.empty() ? -1 : peer[0]);
    }
    if (n.chunk >= 0) name += fmt::format(" (chunk {})", n.chunk);
    span(name, e, {{"node", n.name}, {"scope", n.scope}, {"chunk", n.chunk}});
  }
}

Status write_trace_file(const std::vector<std::string>& parts, const nlohmann::json& about, const std::string& path, size_t* events) {
  nlohmann::json merged = nlohmann::json::array();
  for (const std::string& part : parts) {
    for (auto& e : nlohmann::json::parse(part)) merged.push_back(std::move(e));
  }
  *events = merged.size();
  nlohmann::json doc{{"traceEvents", merged}, {"displayTimeUnit", "ms"}, {"otherData", about}};
  return write_file_atomically(path, doc.dump() + "\n");
}

}  // namespace oases
