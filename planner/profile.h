// Profiles: what oases-profile measured on a machine, and the op-time model the cost model and the
// simulator read (profile lookups at the exact shapes, interpolation, or a roofline from a device).
//
// Profile file (JSON; times in microseconds, sizes in bytes, rates in GB/s and TFLOP/s):
//   {"format": "oases-profile", "version": 1, "backend": "cpu",
//    "units": {"time": "us", "size": "bytes", "bandwidth": "GB/s", "compute": "TFLOP/s"},
//    "machine": {"host": ..., "cpu": ..., "cores": 2, "cores_available": 1.97, "ranks": 4, "threads_per_rank": 1, ...},
//    "device": {a device-table entry measured here: matrix-product and streaming rates},
//    "ops": [{"op": "MatMul", "key": "MatMul f32[64x128] f32[128x256] -> f32[64x256]",
//             "flops": ..., "bytes": ..., "us": 12.5, "samples": 5}],
//    "collectives": [{"kind": "all_reduce", "group": 2, "bytes": 65536, "us": 40.1,
//                     "link": "shared-memory" | "emulated bw=1,latency=50"}],
//    "optimizer": {"kind": "adamw", "us_per_mib": ...},
//    "op_clock": "thread_cpu" | "wall",   (what the op samples and the executor's times are; absent: wall)
//    "executor": {"instr_us": ..., "comm_start_us": ...,
//                 "comm_sync_us": ..., "comm_beside_compute_us": ...},   (rank 0's compute thread, with --model)
//    "model": {"path": ..., "batch": 8, "seq": 64, "ranks": 4, "degrees": [1, 2, 4], "chunks": [1, 2]}}
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/cluster_spec.h"

namespace oases {

struct OpSample {
  std::string op;   // "MatMul", "oases.AttentionGrad", ...
  std::string key;  // op and input/output shapes: an exact match for a node
  double flops = 0, bytes = 0;
  double us = 0;
  int samples = 1;
};

struct CollectiveSample {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int64_t group = 2;
  double bytes = 0;
  double us = 0;
  std::string link;  // "shared-memory" or "emulated ..."
};

struct Profile {
  std::string backend = "cpu";
  nlohmann::json machine = nlohmann::json::object();
  DeviceSpec device;  // measured rates (roofline for ops the samples do not cover)
  bool has_device = false;
  std::vector<OpSample> ops;
  std::vector<CollectiveSample> collectives;
  double optimizer_us_per_mib = 0;  // AdamW update per MiB of parameters
  // The executor's own time on the compute thread, measured in the model's runs: between two
  // instructions (dispatch), and what starting a collective costs beyond that (waking the
  // communication thread, which takes a core from the compute threads while it runs).
  double instr_us = 0;
  double comm_start_us = 0;
  // What the op samples, instr_us and comm_start_us are: "thread_cpu", the CPU time the compute
  // thread was given (its work, however many ranks shared the cores: the simulator shares them,
  // ClusterSpec::sharing_slowdown), or "wall", wall time under the sharing the profile ran with
  // (`ranks` x `threads_per_rank` threads on the machine's cores; profiles written before the
  // field, and runs with more than one kernel thread per rank, whose helpers the caller's clock
  // does not see).
  std::string op_clock = "thread_cpu";
  // What a collective takes on the communication thread beyond the link's time, fitted to the
  // profiled runs as comm_sync_us + comm_beside_compute_us x (share of its time the compute
  // thread computes), beyond what the link and the sharing of the cores account for: peers reach
  // it late (ranks time-sliced on shared cores drift apart between two collectives), and a
  // communication thread that wakes beside computation waits for a core. The simulator adds it.
  double comm_sync_us = 0;
  double comm_beside_compute_us = 0;
  // The share of the cores the ranks turn into work, fitted to the profiled runs (0.5..1; 1: all
  // of core_capacity). Ranks time-sliced on shared cores and synchronised every few milliseconds
  // leave cores idle that processor sharing counts as busy: the one that reaches a collective last
  // computes alone, its communication thread and its compute thread hand over through wake-ups.
  // Step times on the validation model fit this (one factor on the cores, every schedule within
  // ~2% at tp 2) where a term per collective did not (plain at 1 and 2 chunks took the same time
  // with twice the collectives). this_machine() scales the cores by it.
  double core_efficiency = 1.0;
  // The share of a core a rank's communication thread takes from the compute threads while it
  // copies and reduces beside computation (0..1; 1: a whole thread's worth, processor sharing's
  // assumption), fitted to the profiled runs together with core_efficiency (the pair with the
  // least squared relative error; 1 where the runs cannot tell). The simulator stretches
  // computation beside a collective's work by sharing_slowdown(ranks x (threads + this)) /
  // compute_slowdown.
  double comm_thread_share = 1.0;
  int64_t ranks = 1;  // ranks that shared the cores while ops were timed
  int threads_per_rank = 1;
  nlohmann::json model;  // what --model profiled, if anything

  // Cores of the machine profiled (machine.cores; 0 when not recorded).
  int cores() const;
  // The cores its ranks got: machine.cores_available (measured while profiling: less than the
  // cores where other work took a share), else the cores; 0 when neither was recorded.
  double core_capacity() const;
  // What the profile's compute-thread times must be divided by to give work: 1 for thread-CPU
  // samples, else the sharing the profile ran under, max(1, ranks x threads / cores).
  double work_divisor() const;

  nlohmann::json to_json() const;
};

Expected<Profile> load_profile(const std::string& path);
Expected<Profile> profile_from_json(const nlohmann::json& j, const std::string& where);

// "MatMul f32[64x128] f32[128x256] -> f32[64x256]": the op with its inputs' and outputs' dtypes and
// shapes (the key of a profiled node).
std::string op_key(const std::string& op, const std::vector<std::pair<DType, Shape>>& inputs,
                   const std::vector<std::pair<DType, Shape>>& outputs);
std::string node_op_name(const Node& n);  // "MatMul", "oases.Attention"
std::string node_key(const Graph& g, const Node& n);

// FLOPs and bytes of a node: its op's cost rule (the executor's fused ops have theirs in
// graph/ops/fused.cpp); nothing for an op the registry does not know.
OpCost node_cost(const Graph& g, const Node& n);

// Ops that move no data and compute nothing (views, shape bookkeeping): never timed.
bool is_free_op(const Node& n, const OpCost& c);

// Time of one op execution: the profile's sample at the exact key; else interpolated over the
// profile's samples of the same op by work (FLOPs for products and attention, bytes otherwise); else
// a roofline on the device (the profile's measured one, or the cluster's). `sharing` is the
// slowdown of ranks sharing cores while they all compute (ClusterSpec::compute_slowdown): the
// profile's samples are its work (Profile::work_divisor) times that, as are rooflines and the
// optimizer (all ranks update at once).
class OpTimeModel {
 public:
  OpTimeModel() = default;
  OpTimeModel(const Profile* profile, const DeviceSpec& device, double sharing = 1.0);
  double seconds(const std::string& op, const std::string& key, double flops, double bytes) const;
  double node_seconds(const Graph& g, const Node& n) const;
  // Which op types the profile has samples of.
  bool covers(const std::string& op) const { return by_op_.count(op) > 0; }
  bool has_profile() const { return profile_ != nullptr; }
  double optimizer_seconds(double param_bytes) const;
  // Roofline times for a bf16/fp16 run: products at the tensor cores' half-precision peak and
  // half the bytes through memory (profiles are measured as they are). Memory and communication
  // sizes stay fp32's in the cost model, which is conservative for them.
  void set_half_precision(bool on) { half_ = on; }
  bool half_precision() const { return half_; }
  double sharing() const { return sharing_; }
  // The executor's overheads on the compute thread (profile's "executor"; 0 without a profile).
  double instr_seconds() const;
  double comm_start_seconds() const;
  double comm_sync_seconds() const;
  double comm_beside_compute_seconds() const;
  double comm_thread_share() const;  // Profile::comm_thread_share (1 without a profile)
  // Keeps every (op, key) seconds() is asked for from now on, copies included (tests: what the
  // cost model prices is what planner/coverage.h lists). Safe from the pipeline search's threads.
  void log_lookups();
  std::set<std::pair<std::string, std::string>> lookups() const;

 private:
  struct LookupLog {
    std::mutex mu;
    std::set<std::pair<std::string, std::string>> keys;
  };
  std::shared_ptr<LookupLog> log_;
  const Profile* profile_ = nullptr;
  DeviceSpec device_;
  double sharing_ = 1.0;
  double measured_ = 1.0;  // on the profile's times: sharing over the profile's work divisor
  bool half_ = false;
  std::map<std::string, double> exact_;                                  // key -> us
  std::map<std::string, std::vector<std::pair<double, double>>> by_op_;  // op -> (work, us) sorted
  double roofline(const std::string& op, double flops, double bytes) const;
};

// Ops whose time follows their FLOPs (the rest follow the bytes they move): the compute-bound
// trait of the op named "Op" or "domain.Op".
bool is_compute_bound_op(const std::string& op);

// Collective time from the profile's samples (interpolated over bytes for the group size and link,
// nearest group size otherwise); -1 when it has none for that kind and link.
double profiled_collective_seconds(const Profile& p, CollectiveKind k, double bytes, int64_t group, const std::string& link);

// The machine at hand as a cluster: `ranks` ranks of this host sharing its cores (the profile's
// machine.cores, else this machine's), `threads_per_rank` kernel threads each, the local
// communicator's link as the profile measured it (else a default), optionally behind an
// emulated link.
ClusterSpec this_machine(int64_t ranks, const Profile* profile, const std::string& emulate_link, int threads_per_rank);

// An op-time model for a cluster: the profile's samples (as work, Profile::work_divisor) or the
// device's roofline, times the compute slowdown of the cluster's ranks sharing cores
// (ClusterSpec::compute_slowdown; 1 for GPUs).
OpTimeModel op_time_model(const ClusterSpec& cluster, const Profile* profile);

// The work of a collective on the communication thread when the ranks share cores: the profile's
// shared-memory time for it (copying and reducing through memory, measured with `group` threads
// on the profiled machine's cores) divided by the sharing it was measured under; 0 without one.
double collective_cpu_seconds(const Profile& p, CollectiveKind k, double bytes, int64_t group);

}  // namespace oases
