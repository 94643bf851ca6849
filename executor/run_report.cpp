#include "executor/run_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "graph/atomic_file.h"
#include "graph/blocks.h"
#include "graph/op_registry.h"

namespace oases {

namespace {

int layer_of(const Node& n) {
  return block_of_scope(n.scope);
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
  for (const auto& [layer, acc] : per_layer) {
    double c = acc.comm / 1000.0 / n, x = std::min(c, acc.exposed / 1000.0 / n);
    std::fprintf(stderr, "  %-10s comm %8.2f ms  hidden %8.2f ms  exposed %8.2f ms\n",
                 layer < 0 ? "other" : fmt::format("layer {}", layer).c_str(), c, c - x, x);
  }
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
  for (const TraceEvent& e : ev) {
    if (e.node == kNoId || !g.alive(e.node)) continue;
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
    out->push_back({{"name", name},
                    {"cat", e.category == "wait" ? "comm" : e.category},
                    {"ph", "X"},
                    {"ts", e.start_us},
                    {"dur", std::max(e.dur_us, 0.01)},
                    {"pid", rank},
                    {"tid", e.thread},
                    {"args", {{"node", n.name}, {"scope", n.scope}, {"chunk", n.chunk}, {"kind", e.category}}}});
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
