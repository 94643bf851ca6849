#include "executor/node_time_report.h"

#include <algorithm>
#include <cstdio>

namespace oases {

void NodeTimeReport::add(const Executor& ex, double run_ms, const StepStats* device_step) {
  if (device_step) {
    device_run_ms_ += device_step->run_ms;
    device_update_ms_ += device_step->update_ms;
    ++device_runs_;
  }
  const Program& p = ex.program();
  const std::vector<double>& ms = ex.node_ms();
  by_node_.resize(p.instrs.size());
  for (size_t i = 0; i < p.instrs.size() && i < ms.size(); ++i) {
    const Node& n = p.graph.node(p.instrs[i].node);
    auto& e = by_op_[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type];
    e.first += ms[i];
    if (runs_ == 0) e.second++;
    by_node_[i] += ms[i];
  }
  run_ms_ += run_ms;
  runs_++;
}

void NodeTimeReport::print(const Executor& ex, const std::string& unit, size_t slowest) const {
  if (runs_ == 0) return;
  const double nr = static_cast<double>(runs_);
  std::vector<std::pair<double, std::string>> rows;
  double nodes_ms = 0;
  for (const auto& [op, e] : by_op_) {
    rows.push_back({e.first / nr, op});
    nodes_ms += e.first / nr;
  }
  double total = nodes_ms;
  const std::string rest = "(the rest of the " + unit + ")";
  if (run_ms_ > 0) {
    total = run_ms_ / nr;
    rows.push_back({total - nodes_ms, rest});
  }
  std::sort(rows.rbegin(), rows.rend());
  std::printf("profile (ms per %s, by op type, over %d %ss):\n", unit.c_str(), runs_, unit.c_str());
  for (const auto& [t, op] : rows) {
    auto it = by_op_.find(op);
    std::printf("  %-36s %4d nodes %9.2f ms %5.1f%%\n", op.c_str(), it == by_op_.end() ? 0 : it->second.second, t,
                total > 0 ? 100.0 * t / total : 0.0);
  }
  std::vector<std::pair<double, size_t>> nodes;
  for (size_t i = 0; i < by_node_.size(); ++i) nodes.push_back({by_node_[i] / nr, i});
  std::sort(nodes.rbegin(), nodes.rend());
  const Program& p = ex.program();
  std::printf("slowest nodes (ms per %s):\n", unit.c_str());
  for (size_t j = 0; j < std::min(slowest, nodes.size()); ++j) {
    const Node& n = p.graph.node(p.instrs[nodes[j].second].node);
    std::printf("  %9.2f ms  %s -> %s\n", nodes[j].first, n.describe().c_str(),
                n.outputs.empty() || n.outputs[0] == kNoId ? "" : describe_value(p.graph, n.outputs[0]).c_str());
  }
  if (device_runs_ > 0 && run_ms_ > 0) {
    // where a device step's wall time goes: the programs on the device (their instructions' time,
    // and the gaps in which the device waited for the host to launch more), the update, the host
    const double dn = static_cast<double>(device_runs_);
    double programs = device_run_ms_ / dn, update = device_update_ms_ / dn, wall = run_ms_ / nr;
    // the instructions' times are the last micro-batch's (the events are reused per micro-batch)
    std::printf(
        "device step: %.2f ms wall = programs %.2f ms (instructions %.2f ms of the last micro-batch) + update %.2f ms + host %.2f ms "
        "(%.1f%% of the step outside the device's work)\n",
        wall, programs, nodes_ms, update, wall - programs - update, wall > 0 ? 100.0 * (wall - programs - update) / wall : 0.0);
  }
  std::printf("activation arena %.1f MiB (%.1f MiB without reuse)\n", static_cast<double>(p.memory.arena_bytes) / (1 << 20),
              static_cast<double>(p.memory.total_bytes) / (1 << 20));
}

}  // namespace oases
