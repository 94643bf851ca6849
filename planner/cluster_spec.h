// Machines the planner predicts for: a device table (peak FLOP/s per dtype, memory bandwidth and
// capacity of the GPUs we plan for, and of a CPU) and cluster files (how many nodes of how many
// devices, and the links between them: NVLink islands, the PCIe fabric inside a node, the network
// between nodes), with the alpha-beta time of ring collectives over any group of ranks.
//
// Cluster file (JSON, all fields required unless marked optional):
//   {"format": "oases-cluster", "version": 1, "name": "...",
//    "device": "RTX3090" | {device object, same fields as the table},
//    "nodes": 8, "gpus_per_node": 4,
//    "links": {"intra_node": {"kind": "pcie", "bandwidth_gbps": 6.2, "latency_us": 10},
//              "inter_node": {"kind": "infiniband", "bandwidth_gbps": 12.5, "latency_us": 5},
//              "nvlink": {"bandwidth_gbps": 56.25, "latency_us": 2, "island": 2}},    // optional
//    "sources": "where the figures come from",                                       // optional
//    "cores_per_node": 64, "threads_per_rank": 16}   // optional: CPU ranks sharing a node's cores
// Bandwidths are GB/s (10^9 bytes/s) per direction, as a ring moves them; latencies microseconds.
// Without "cores_per_node" every rank has a device of its own (GPUs); with it, the ranks of a
// node share its cores (processor sharing, ClusterSpec::sharing_slowdown).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "graph/status.h"

namespace oases {

struct DeviceSpec {
  std::string name;
  double fp32_tflops = 0;          // dense peak, FP32 (CUDA cores, or all cores' FMA for a CPU)
  double tf32_tflops = 0;          // tensor cores, TF32 (0: none)
  double fp16_tflops = 0;          // tensor cores, FP16/BF16 with FP32 accumulation (0: none)
  double memory_gbps = 0;          // memory bandwidth, GB/s
  double memory_gib = 0;           // memory per device
  double matmul_efficiency = 0.8;  // share of peak large matrix products reach
  double memory_efficiency = 0.8;  // share of bandwidth streaming kernels reach
  double launch_us = 5;            // fixed cost per kernel
  std::string source;              // where the figures come from
};

// H100-SXM, A100-SXM-80GB, RTX3090, CPU (a generic server core count; measure yours with
// oases-profile). Names match case-insensitively; nullptr when unknown.
const DeviceSpec* find_device(const std::string& name);
const std::vector<DeviceSpec>& device_table();
nlohmann::json device_to_json(const DeviceSpec& d);
Expected<DeviceSpec> device_from_json(const nlohmann::json& j, const std::string& where);

struct LinkSpec {
  std::string kind;  // "nvlink", "pcie", "infiniband", "ethernet", "emulated", "shared-memory"
  double bandwidth_gbps = 0;
  double latency_us = 0;
};

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };
const char* collective_name(CollectiveKind k);

struct ClusterSpec {
  std::string name;
  DeviceSpec device;
  int64_t nodes = 1, gpus_per_node = 1;
  LinkSpec intra, inter;
  bool has_nvlink = false;
  LinkSpec nvlink;
  int64_t nvlink_island = 1;  // devices joined by NVLink (consecutive ranks)
  std::string sources;
  // CPU ranks sharing cores (processor sharing): a node's `cores_per_node` cores run the threads
  // of `ranks_sharing_cores` ranks (0: the node's gpus_per_node; the machine at hand with emulated
  // hosts puts every rank on its cores), `threads_per_rank` kernel threads each. The cores the
  // ranks get, so fractional where other work takes a share (the machine at hand: what
  // oases-profile measured). 0: every rank has a device of its own (GPUs), nothing is shared.
  double cores_per_node = 0;
  int64_t ranks_sharing_cores = 0;
  int threads_per_rank = 1;

  int64_t ranks() const { return nodes * gpus_per_node; }
  int64_t ranks_on_cores() const { return ranks_sharing_cores > 0 ? ranks_sharing_cores : gpus_per_node; }
  // How much slower than alone a thread runs while `busy_threads` threads want the node's cores:
  // the cores are shared evenly among them (processor sharing), max(1, busy / cores); 1 without
  // shared cores.
  double sharing_slowdown(double busy_threads) const;
  // The compute thread's slowdown while every rank on the cores computes (all ranks run the same
  // program in step, which is what the simulator assumes): sharing_slowdown(ranks x threads).
  double compute_slowdown() const { return sharing_slowdown(static_cast<double>(ranks_on_cores() * threads_per_rank)); }
  // The link a ring over `members` (world ranks) is bound by, with the NIC shared by the rings of
  // the same group size that leave one node at once.
  LinkSpec ring_link(const std::vector<int64_t>& members) const;
  // Seconds of a ring collective over `members`; `bytes` is the whole tensor (all-reduce: its
  // size; all-gather: the gathered result; reduce-scatter: the input).
  double collective_seconds(CollectiveKind k, double bytes, const std::vector<int64_t>& members) const;
  nlohmann::json to_json() const;
};

// Parses and checks a cluster file; errors name the file and the field (missing, wrong type,
// impossible: non-positive bandwidth or counts, negative latency, an NVLink island that does not
// divide a node).
Expected<ClusterSpec> load_cluster_file(const std::string& path);
Expected<ClusterSpec> cluster_from_json(const nlohmann::json& j, const std::string& where);

// The machine at hand: `ranks` ranks as threads or processes of this host over shared memory
// (bandwidth and latency as measured, or these defaults), optionally behind an emulated link.
ClusterSpec local_cluster(int64_t ranks, const DeviceSpec& cpu, const LinkSpec& shared_memory, const LinkSpec* emulated, double cores,
                          int threads_per_rank);

}  // namespace oases
