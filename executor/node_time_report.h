// Time per op type and the slowest nodes over a number of runs of one executor (oases-run and
// oases-train --profile). Node timing must be on (Executor::set_node_timing) for the runs added.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "executor/training.h"

namespace oases {

class NodeTimeReport {
 public:
  // Adds the per-node times of the executor's last run; `run_ms`: the run's (or step's) wall time,
  // 0 when only node times are to be shown.
  void add(const Executor& ex, double run_ms = 0, const StepStats* device_step = nullptr);
  // Prints the averages per run ("run" or "step"); with run times, the rest of the run (optimizer,
  // communication waits outside nodes) gets its own row.
  void print(const Executor& ex, const std::string& unit, size_t slowest = 15) const;
  int runs() const { return runs_; }

 private:
  std::map<std::string, std::pair<double, int>> by_op_;  // op type -> (ms, nodes)
  std::vector<double> by_node_;                          // instruction -> ms
  double run_ms_ = 0;
  int runs_ = 0;
  // device steps: the programs' and the update's device time (events), summed
  double device_run_ms_ = 0, device_update_ms_ = 0;
  int device_runs_ = 0;
};

}  // namespace oases
