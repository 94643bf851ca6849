// oases-reshard's measurement: every rank of a run moves an arange tensor through each plan,
// timed (median of the runs after one warm-up) and checked bit for bit at the destination.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "executor/launcher.h"
#include "executor/reshard_runner.h"

namespace oases {

struct ReshardRow {
  ReshardStrategy strategy;
  double predicted_s = 0, lower_bound_s = 0, measured_s = 0;
  int transfers = 0;
  bool exact = true;
};

struct ReshardBenchOptions {
  int64_t world = 1;
  int repeat = 3;
  double comm_timeout = kDefaultCommTimeoutS;
  ReshardCluster cluster;
  bool emulate = false;       // --emulate-link: the transfers hold the hosts' cards
  bool cards_folder = false;  // world rank 0 makes the cards' folder (an emulated link that is enabled)
};

// What the thread ranks of one process share; world rank 0 fills the rows.
struct ReshardBenchResult {
  std::mutex mu;
  std::string cards_dir;
  std::vector<ReshardRow> rows;  // one per plan, with its prediction before the run
  bool all_exact = true;
};

// Called by every rank of the run alike (its collectives pair up across them).
Status bench_reshard_rank(RankRuntime& rt, const ReshardProblem& p, const std::vector<ReshardPlan>& plans, const ReshardBenchOptions& o,
                          ReshardBenchResult* out);

}  // namespace oases
