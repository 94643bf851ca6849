// Measuring the machine at hand for the planner's cost model (planner/profile.h), what
// oases-profile runs: the device's matrix-product and streaming rates, collective times on the
// local communicator (optionally behind an emulated link), the optimizer's update rate, every op of
// a model's training program as the ranks run it (threads sharing the cores, as oases-train
// --local-ranks does), and the executor's own costs fitted through the simulator.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/communicator.h"
#include "executor/executor.h"
#include "graph/graph.h"
#include "planner/analysis.h"
#include "planner/device.h"
#include "planner/link_model.h"
#include "planner/profile.h"

namespace oases {

// Host, CPU, cores, memory, compiler and date of this machine, for the profile's "machine".
nlohmann::json machine_description(int64_t ranks, int threads);
// Matrix-product rate (one rank's threads) and streaming bandwidth of this machine.
DeviceSpec measure_device(int threads, double mem_gib, int64_t ranks);
// Collective times on the local communicator (threads), optionally behind an emulated link.
std::vector<CollectiveSample> measure_collectives(int64_t group, const std::vector<int64_t>& sizes, const LinkModel* link, int reps,
                                                  double comm_timeout = kDefaultCommTimeoutS);
// AdamW's update time per MiB of parameters.
double measure_optimizer(int threads);

// Times every compute node of rank 0's program for a uniform tp x dp split, K chunks, on
// `ranks` local ranks (plain schedule; the ops are those of every schedule).
// Besides the kernels, the executor's own costs on the compute thread, from rank 0's timeline
// (tracing on): the gap between consecutive instructions with no collective started between them
// (dispatch, binding), and what starting a collective costs the compute thread beyond that (the
// hand-off wakes the communication thread, which takes a core from the compute threads while it
// runs: with ranks as threads sharing the cores this is milliseconds, not microseconds).
struct ExecutorOverheads {
  double instr_gap_us = 0;
  int64_t instr_gaps = 0;
  double start_gap_us = 0;
  int64_t starts = 0;
  // Ranks sharing the cores: the wall time of rank 0's runs against what its own kernels, gaps
  // and the link's collectives add up to. Timing one rank's kernels misses the time its peers'
  // kernels take the cores from it (it shows as waits at the next collective).
  double wall_us = 0, accounted_us = 0;
};

// One profiled program of rank 0 as the simulator replays it, with what its runs measured: the
// core share and the collectives' synchronisation cost are then fitted so that the simulator
// reproduces these runs (calibrate_executor).
struct CalibrationRun {
  Graph graph;
  std::vector<ScheduledOp> order;
  Mesh mesh;
  int64_t ranks = 1;
  int reps = 0;
  double wall_us = 0;  // mean execute() time
  struct Collective {
    double us = 0;      // on the communication thread, summed over the repetitions
    double beside = 0;  // share of that time the compute thread computed, summed
    int n = 0;
  };
  std::map<NodeId, Collective> collectives;
};

// Times every compute node of rank 0's program (planner/rank_program.h) for a uniform tp x dp
// split with `chunks` chunks under `schedule` on `ranks` thread ranks: op samples into `acc`, the
// executor's costs into `overheads`, and (when `calib` is given) the runs the calibration fits.
Status measure_model_ops(const Graph& forward, const std::string& model_path, const ModelAnalysis& a, int64_t ranks, int64_t tp,
                         int64_t chunks, int threads, int reps, const LinkModel& link, std::map<std::string, OpSample>* acc,
                         ExecutorOverheads* overheads, std::vector<CalibrationRun>* calib, const std::string& schedule = "plain",
                         double comm_timeout = kDefaultCommTimeoutS);

// Fits the profile's executor terms (collective synchronisation, core share) so that the simulator
// reproduces `runs`; `emulate` is the link they ran behind ("" for none).
Status calibrate_executor(const std::vector<CalibrationRun>& runs, const std::string& emulate, int threads, Profile* p);

}  // namespace oases
