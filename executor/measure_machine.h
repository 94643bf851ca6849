// Measuring the machine at hand for the planner's cost model (planner/profile.h), what
// oases-profile runs: the device's matrix-product and streaming rates, collective times on the
// local communicator (optionally behind an emulated link), the optimizer's update rate, every op of
// a model's training program as the ranks run it (threads sharing the cores, as oases-train
// --local-ranks does), and the executor's own costs fitted through the simulator.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "executor/communicator.h"
#include "executor/executor.h"
#include "graph/graph.h"
#include "planner/analysis.h"
#include "planner/cluster_spec.h"
#include "planner/coverage.h"
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
// The cores this process gets now: `threads` threads that only compute, for `seconds`, their CPU
// time over the wall time. The machine's cores (or the threads, if fewer) when nothing else runs;
// less while other work shares them (whatever the scheduler's notion of fairness).
double measure_available_cores(int threads, double seconds = 0.3);
// AdamW's update time per MiB of parameters.
double measure_optimizer(int threads);

// Times every compute node of rank 0's program for a uniform tp x dp split, K chunks, on
// `ranks` local ranks (plain schedule; the ops are those of every schedule).
// Besides the kernels, the executor's own costs on the compute thread, from rank 0's timeline on
// the profile's clock (profile_op_clock): the gap between consecutive instructions with no
// collective started between them (dispatch, binding), and what starting a collective costs the
// compute thread beyond that (handing it to the communication thread). On the thread's CPU clock
// these are its own work; the time it waits for a core meanwhile is the simulator's to share.
struct ExecutorOverheads {
  double instr_gap_us = 0;
  int64_t instr_gaps = 0;
  double start_gap_us = 0;
  int64_t starts = 0;
};

// One profiled program of rank 0 as the simulator replays it, with the wall time its runs took:
// the collectives' synchronisation terms are fitted so that the simulator reproduces these runs
// (calibrate_executor).
struct CalibrationRun {
  Graph graph;
  std::vector<ScheduledOp> order;
  Mesh mesh;
  int64_t ranks = 1;
  std::string schedule;
  int64_t tp = 1, chunks = 1;
  std::vector<double> runs_us;  // each timed execute()
  double wall_us = 0;           // their median (a step that stalled moves the mean, not the median)
};

// The clock measure_model_ops times the compute thread on (Profile::op_clock): its own CPU clock
// with one kernel thread per rank, the wall clock with more.
std::string profile_op_clock(int threads);

// Times every compute node of rank 0's program (planner/rank_program.h) for a uniform tp x dp
// split with `chunks` chunks under `schedule` on `ranks` thread ranks: op samples into `acc`, the
// executor's costs into `overheads`, and (when `calib` is given) the runs the calibration fits.
Status measure_model_ops(const Graph& forward, const std::string& model_path, const ModelAnalysis& a, int64_t ranks, int64_t tp,
                         int64_t chunks, int threads, int reps, const LinkModel& link, std::map<std::string, OpSample>* acc,
                         ExecutorOverheads* overheads, std::vector<CalibrationRun>* calib, const std::string& schedule = "plain",
                         double comm_timeout = kDefaultCommTimeoutS);

// Times alone, as one-node programs on the CPU kernels (unfused), every op of `priced` (the
// planner's list, planner/coverage.h) that `acc` has no sample of at its key: what the program
// runs did not time, such as the products the CPU fusion merges with their epilogues, the ops of
// layouts, chunk counts and pipeline stages not run, the whole vocabulary ops of the tp
// lowerings. Each is the training graph's node at the sample's local shapes: float inputs random,
// integer inputs zero (valid indices and labels), constants as the graph has them where their
// shape is the local one; where the node's shape inputs (Split sizes, Slice bounds, Expand
// targets) are the global layout's, they are set to give the local outputs. `threads` kernel
// threads; on the thread's CPU clock with one, else on the wall clock times `wall_scale` (the
// sharing the program runs' samples were taken under). Returns how many were timed; an error
// names a node that could not run alone at its shapes.
Expected<int> measure_priced_ops(const Graph& train, const std::vector<PricedSample>& priced, int threads, int reps, double wall_scale,
                                 std::map<std::string, OpSample>* acc);

// Fits the profile's collective terms (comm_sync_us, comm_beside_compute_us) to `runs` through the
// simulator; `emulate` is the link they ran behind ("" for none). With `replayed`, also what the
// simulator then gives each run against what it measured ({replayed, measured} microseconds,
// the optimizer left out): a check of the whole model on the profile's own runs.
Status calibrate_executor(const std::vector<CalibrationRun>& runs, const std::string& emulate, int threads, Profile* p,
                          std::vector<std::pair<double, double>>* replayed = nullptr);

}  // namespace oases
