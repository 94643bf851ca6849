// The simulator: one rank's program (the partitioned, recomputed and scheduled training graph
// oases-train would run for a plan) replayed as the executor runs it, with every compute node
// timed by the op-time model and every collective by the cluster's ring model:
//   the compute thread runs its instructions in order; a collective's start hands it to the
//   communication thread, which runs collectives one at a time in the order they were started; a
//   wait blocks the compute thread until that collective is done; collectives without a schedule
//   run in line (also a collective given as a compute step). Each instruction costs the compute
//   thread the executor's dispatch time and each start the hand-off to the communication thread,
//   as the profile measured them (OpTimeModel::instr_seconds, comm_start_seconds); each collective
//   takes, beyond what the link makes it take, the profile's comm_sync (and, in profiles that have
//   one, comm_beside_compute scaled by the share of its time the compute thread computes). After
//   the program the optimizer updates the rank's parameters.
// Ranks sharing cores (a cluster with cores_per_node, and a profile saying what a collective's
// work is): processor sharing. The cores are shared evenly by the threads that want them; the
// op-time model's times already hold every rank's compute threads at once
// (ClusterSpec::compute_slowdown); a collective's work (the profile's shared-memory time for it)
// runs on the communication thread at its share of the cores, with the ranks' compute threads
// when they compute beside it and without when they wait; and computation beside that work slows
// down by the threads it adds. The spans depend on what overlaps what, so the program is replayed
// a few times, each with what the previous replay saw.
// All ranks run the same template on the same shapes, and the groups of one mesh axis are alike,
// so one rank's timeline stands for every rank's (the trace names it rank 0), and the ranks sharing
// a host's cores run in step.
// On the machine at hand a collective takes what the emulated link would, but no less than the
// profile measured for the local communicator (the emulation only ever delays).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/graph.h"
#include "graph/program_order.h"
#include "graph/sharding.h"
#include "planner/cluster_spec.h"
#include "planner/profile.h"

namespace oases {

struct SimOptions {
  const ClusterSpec* cluster = nullptr;
  const OpTimeModel* ops = nullptr;
  const Profile* local_floor = nullptr;  // profile whose shared-memory collectives bound times from below
  int64_t rank = 0;
  bool trace = false;
  double param_bytes = 0;  // this rank's parameters (the optimizer step)
};

struct SimResult {
  double step_s = 0, compute_s = 0, comm_s = 0, exposed_s = 0, optimizer_s = 0;
  double overhead_s = 0;  // the executor's dispatch and collective hand-offs on the compute thread
  double hidden_s() const { return comm_s - exposed_s; }
  int collectives = 0;
  std::map<int, std::pair<double, double>> per_layer;  // layer (-1 other) -> (comm, exposed)
  nlohmann::json trace = nlohmann::json::array();      // Chrome trace events ("X", pid 0)
  std::vector<double> instr_end_s;  // the compute thread's time at the end of each instruction of the order
  // of each instruction's time, what the compute thread spent blocked on the link (a wait, a
  // collective run in line less its work on the cores): time more cores would not shorten
  std::vector<double> instr_wait_s;
};

// `order` empty: topological order with collectives in line (oases-train without --schedule).
Expected<SimResult> simulate_rank(const Graph& local, const std::vector<ScheduledOp>& order, const Mesh& mesh, const SimOptions& o);

// How long the intervals `busy` (sorted, disjoint) cover of [a, b].
double covered_time(const std::vector<std::pair<double, double>>& busy, double a, double b);

// Duration of one collective node of a partitioned graph.
double collective_node_seconds(const Graph& g, const Node& n, const Mesh& mesh, const SimOptions& o);

}  // namespace oases
