#include "planner/cluster_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace oases {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<DeviceSpec> make_table() {
  std::vector<DeviceSpec> t;
  {
    DeviceSpec d;
    d.name = "H100-SXM";
    d.fp32_tflops = 66.9;
    d.tf32_tflops = 494.7;
    d.fp16_tflops = 989.4;
    d.memory_gbps = 3352;
    d.memory_gib = 80;
    d.matmul_efficiency = 0.7;
    d.memory_efficiency = 0.8;
    d.launch_us = 4;
    d.source = "NVIDIA H100 Tensor Core GPU datasheet (SXM5): dense peaks (the sparse ones are twice these), HBM3 3.35 TB/s";
    t.push_back(d);
  }
  {
    DeviceSpec d;
    d.name = "A100-SXM-80GB";
    d.fp32_tflops = 19.5;
    d.tf32_tflops = 156;
    d.fp16_tflops = 312;
    d.memory_gbps = 2039;
    d.memory_gib = 80;
    d.matmul_efficiency = 0.75;
    d.memory_efficiency = 0.8;
    d.launch_us = 5;
    d.source = "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): dense peaks, HBM2e 2039 GB/s";
    t.push_back(d);
  }
  {
    DeviceSpec d;
    d.name = "RTX3090";
    d.fp32_tflops = 35.58;
    d.tf32_tflops = 35.58;
    d.fp16_tflops = 71;
    d.memory_gbps = 936;
    d.memory_gib = 24;
    // 0.82: the Oases paper's published profile point (hidden 3072, micro-batch 4, tp 4: MLP forward,
    // two products of 77.3 GFLOP each, in 5.3 ms = 29.2 TFLOP/s)
    d.matmul_efficiency = 0.82;
    d.memory_efficiency = 0.8;
    d.launch_us = 5;
    d.source =
        "NVIDIA Ampere GA102 whitepaper (GeForce RTX 3090: 10496 cores at 1.695 GHz, FP16 tensor with FP32 accumulate, "
        "GDDR6X 936 GB/s, 24 GB); matrix-product efficiency from the Oases paper's profile point";
    t.push_back(d);
  }
  {
    DeviceSpec d;
    d.name = "CPU";
    d.fp32_tflops = 1.28;
    d.memory_gbps = 100;
    d.memory_gib = 256;
    d.matmul_efficiency = 0.6;
    d.memory_efficiency = 0.5;
    d.launch_us = 1;
    d.source =
        "a generic 16-core AVX-512 server (16 cores x 2.5 GHz x 32 FP32 FLOP/cycle, 8 DDR4 channels); measure the machine at "
        "hand with oases-profile instead";
    t.push_back(d);
  }
  return t;
}

Expected<double> number(const nlohmann::json& j, const std::string& key, const std::string& where, bool required = true, double def = 0) {
  if (!j.contains(key)) {
    if (required) return error("{}: missing field \"{}\"", where, key);
    return def;
  }
  if (!j[key].is_number()) return error("{}: field \"{}\" must be a number", where, key);
  double v = j[key].get<double>();
  if (!std::isfinite(v)) return error("{}: field \"{}\" is not finite", where, key);
  return v;
}

Expected<LinkSpec> link_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return error("{}: must be an object with bandwidth_gbps and latency_us", where);
  LinkSpec l;
  l.kind = j.value("kind", "");
  OASES_ASSIGN_OR_RETURN(l.bandwidth_gbps, number(j, "bandwidth_gbps", where));
  OASES_ASSIGN_OR_RETURN(l.latency_us, number(j, "latency_us", where));
  if (!(l.bandwidth_gbps > 0)) return error("{}: bandwidth_gbps must be positive, not {}", where, l.bandwidth_gbps);
  if (l.bandwidth_gbps > 1e5) return error("{}: bandwidth_gbps {} GB/s is not a link we know", where, l.bandwidth_gbps);
  if (l.latency_us < 0) return error("{}: latency_us cannot be negative ({})", where, l.latency_us);
  if (l.latency_us > 1e6) return error("{}: latency_us {} is over a second", where, l.latency_us);
  return l;
}

nlohmann::json link_json(const LinkSpec& l) {
  return {{"kind", l.kind}, {"bandwidth_gbps", l.bandwidth_gbps}, {"latency_us", l.latency_us}};
}

}  // namespace

const std::vector<DeviceSpec>& device_table() {
  static const std::vector<DeviceSpec> t = make_table();
  return t;
}

const DeviceSpec* find_device(const std::string& name) {
  std::string want = lower(name);
  for (const DeviceSpec& d : device_table()) {
    if (lower(d.name) == want) return &d;
  }
  // a few spellings people use
  if (want == "h100" || want == "h100-sxm5") return find_device("H100-SXM");
  if (want == "a100" || want == "a100-80gb" || want == "a100-sxm4-80gb") return find_device("A100-SXM-80GB");
  if (want == "rtx-3090" || want == "rtx 3090" || want == "3090") return find_device("RTX3090");
  return nullptr;
}

nlohmann::json device_to_json(const DeviceSpec& d) {
  return {{"name", d.name},
          {"fp32_tflops", d.fp32_tflops},
          {"tf32_tflops", d.tf32_tflops},
          {"fp16_tflops", d.fp16_tflops},
          {"memory_gbps", d.memory_gbps},
          {"memory_gib", d.memory_gib},
          {"matmul_efficiency", d.matmul_efficiency},
          {"memory_efficiency", d.memory_efficiency},
          {"launch_us", d.launch_us},
          {"source", d.source}};
}

Expected<DeviceSpec> device_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) {
    const DeviceSpec* d = find_device(j.get<std::string>());
    if (!d) {
      std::vector<std::string> names;
      for (const DeviceSpec& x : device_table()) names.push_back(x.name);
      return error("{}: unknown device '{}' (the table has {})", where, j.get<std::string>(), fmt::format("{}", fmt::join(names, ", ")));
    }
    return *d;
  }
  if (!j.is_object()) return error("{}: \"device\" must be a name from the device table or an object", where);
  DeviceSpec d;
  d.name = j.value("name", "custom");
  OASES_ASSIGN_OR_RETURN(d.fp32_tflops, number(j, "fp32_tflops", where + " device"));
  OASES_ASSIGN_OR_RETURN(d.memory_gbps, number(j, "memory_gbps", where + " device"));
  OASES_ASSIGN_OR_RETURN(d.memory_gib, number(j, "memory_gib", where + " device"));
  OASES_ASSIGN_OR_RETURN(d.tf32_tflops, number(j, "tf32_tflops", where + " device", false, 0));
  OASES_ASSIGN_OR_RETURN(d.fp16_tflops, number(j, "fp16_tflops", where + " device", false, 0));
  OASES_ASSIGN_OR_RETURN(d.matmul_efficiency, number(j, "matmul_efficiency", where + " device", false, 0.7));
  OASES_ASSIGN_OR_RETURN(d.memory_efficiency, number(j, "memory_efficiency", where + " device", false, 0.8));
  OASES_ASSIGN_OR_RETURN(d.launch_us, number(j, "launch_us", where + " device", false, 5));
  d.source = j.value("source", "");
  if (!(d.fp32_tflops > 0)) return error("{}: device fp32_tflops must be positive, not {}", where, d.fp32_tflops);
  if (!(d.memory_gbps > 0)) return error("{}: device memory_gbps must be positive, not {}", where, d.memory_gbps);
  if (!(d.memory_gib > 0)) return error("{}: device memory_gib must be positive, not {}", where, d.memory_gib);
  if (d.fp32_tflops > 1e5) return error("{}: device fp32_tflops {} is not a device we know", where, d.fp32_tflops);
  for (double e : {d.matmul_efficiency, d.memory_efficiency}) {
    if (!(e > 0 && e <= 1)) return error("{}: device efficiencies are shares of the peak, in (0, 1]; got {}", where, e);
  }
  if (d.launch_us < 0) return error("{}: device launch_us cannot be negative", where);
  return d;
}

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kBroadcast: return "broadcast";
  }
  return "?";
}

LinkSpec ClusterSpec::ring_link(const std::vector<int64_t>& members) const {
  std::set<int64_t> nodes_used, islands;
  for (int64_t r : members) {
    nodes_used.insert(r / gpus_per_node);
    islands.insert(r / std::max<int64_t>(1, nvlink_island));
  }
  if (nodes_used.size() > 1) {
    // every node the ring crosses sends through its NIC; the rings of this group size that leave a
    // node at the same time (one per member it has there... as many as fit) share it
    int64_t per_node = static_cast<int64_t>(members.size()) / static_cast<int64_t>(nodes_used.size());
    int64_t sharing = std::max<int64_t>(1, gpus_per_node / std::max<int64_t>(1, per_node));
    LinkSpec l = inter;
    l.bandwidth_gbps = std::min(inter.bandwidth_gbps / static_cast<double>(sharing), intra.bandwidth_gbps);
    l.latency_us = std::max(inter.latency_us, intra.latency_us);
    return l;
  }
  if (has_nvlink && islands.size() == 1) return nvlink;
  return intra;
}

double ClusterSpec::sharing_slowdown(double busy_threads) const {
  if (cores_per_node <= 0) return 1.0;
  return std::max(1.0, busy_threads / cores_per_node);
}

double ClusterSpec::collective_seconds(CollectiveKind k, double bytes, const std::vector<int64_t>& members) const {
  double p = static_cast<double>(members.size());
  if (p <= 1) return 0;
  LinkSpec l = ring_link(members);
  double bw = l.bandwidth_gbps * 1e9, lat = l.latency_us * 1e-6;
  switch (k) {
    case CollectiveKind::kAllReduce: return 2.0 * (p - 1) / p * bytes / bw + 2.0 * (p - 1) * lat;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll: return (p - 1) / p * bytes / bw + (p - 1) * lat;
    case CollectiveKind::kBroadcast: return bytes / bw + (p - 1) * lat;
  }
  return 0;
}

nlohmann::json ClusterSpec::to_json() const {
  nlohmann::json links{{"intra_node", link_json(intra)}, {"inter_node", link_json(inter)}};
  if (has_nvlink) {
    links["nvlink"] = link_json(nvlink);
    links["nvlink"]["island"] = nvlink_island;
  }
  nlohmann::json j{{"format", "oases-cluster"},      {"version", 1},  {"name", name}, {"device", device_to_json(device)}, {"nodes", nodes},
                   {"gpus_per_node", gpus_per_node}, {"links", links}};
  if (!sources.empty()) j["sources"] = sources;
  if (cores_per_node > 0) {
    j["cores_per_node"] = cores_per_node;
    j["threads_per_rank"] = threads_per_rank;
    if (ranks_sharing_cores > 0) j["ranks_sharing_cores"] = ranks_sharing_cores;
  }
  return j;
}

Expected<ClusterSpec> cluster_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return error("{}: a cluster file is a JSON object", where);
  if (j.value("format", "") != "oases-cluster") return error("{}: missing \"format\": \"oases-cluster\"", where);
  ClusterSpec c;
  c.name = j.value("name", where);
  if (!j.contains("device")) return error("{}: missing field \"device\"", where);
  OASES_ASSIGN_OR_RETURN(c.device, device_from_json(j["device"], where));
  for (const char* k : {"nodes", "gpus_per_node"}) {
    if (!j.contains(k)) return error("{}: missing field \"{}\"", where, k);
    if (!j[k].is_number_integer()) return error("{}: field \"{}\" must be a whole number", where, k);
    int64_t v = j[k].get<int64_t>();
    if (v < 1) return error("{}: field \"{}\" must be at least 1, not {}", where, k, v);
    if (v > 100000) return error("{}: field \"{}\" = {} is beyond any cluster", where, k, v);
  }
  c.nodes = j["nodes"].get<int64_t>();
  c.gpus_per_node = j["gpus_per_node"].get<int64_t>();
  if (!j.contains("links") || !j["links"].is_object()) return error("{}: missing field \"links\"", where);
  const auto& l = j["links"];
  if (!l.contains("intra_node")) return error("{}: missing field \"links.intra_node\"", where);
  OASES_ASSIGN_OR_RETURN(c.intra, link_from_json(l["intra_node"], where + " links.intra_node"));
  if (l.contains("inter_node")) {
    OASES_ASSIGN_OR_RETURN(c.inter, link_from_json(l["inter_node"], where + " links.inter_node"));
  } else if (c.nodes > 1) {
    return error("{}: missing field \"links.inter_node\" ({} nodes)", where, c.nodes);
  } else {
    c.inter = c.intra;
  }
  if (l.contains("nvlink")) {
    OASES_ASSIGN_OR_RETURN(c.nvlink, link_from_json(l["nvlink"], where + " links.nvlink"));
    c.has_nvlink = true;
    c.nvlink_island = l["nvlink"].value("island", c.gpus_per_node);
    if (c.nvlink_island < 2 || c.gpus_per_node % c.nvlink_island != 0) {
      return error("{}: links.nvlink.island {} must be at least 2 and divide the {} GPUs of a node", where, c.nvlink_island,
                   c.gpus_per_node);
    }
  }
  c.sources = j.contains("sources") && j["sources"].is_string() ? j["sources"].get<std::string>() : "";
  if (j.contains("cores_per_node")) {
    OASES_ASSIGN_OR_RETURN(c.cores_per_node, number(j, "cores_per_node", where));
    if (!(c.cores_per_node > 0) || c.cores_per_node > 1e6)
      return error("{}: cores_per_node must be positive, not {}", where, c.cores_per_node);
  }
  for (const char* k : {"threads_per_rank", "ranks_sharing_cores"}) {
    if (!j.contains(k)) continue;
    if (!j[k].is_number_integer()) return error("{}: field \"{}\" must be a whole number", where, k);
    int64_t v = j[k].get<int64_t>();
    if (v < 1 || v > 1000000) return error("{}: field \"{}\" must be at least 1 (and below a million), not {}", where, k, v);
  }
  c.threads_per_rank = static_cast<int>(j.value("threads_per_rank", int64_t{1}));
  c.ranks_sharing_cores = j.value("ranks_sharing_cores", int64_t{0});
  if (c.cores_per_node == 0 && (j.contains("threads_per_rank") || j.contains("ranks_sharing_cores"))) {
    return error("{}: \"threads_per_rank\" and \"ranks_sharing_cores\" describe ranks sharing a node's cores; give \"cores_per_node\" too",
                 where);
  }
  return c;
}

Expected<ClusterSpec> load_cluster_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return error("{}: no such cluster file", path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return error("{}: not valid JSON", path);
  return cluster_from_json(j, path);
}

ClusterSpec local_cluster(int64_t ranks, const DeviceSpec& cpu, const LinkSpec& shared_memory, const LinkSpec* emulated, double cores,
                          int threads_per_rank) {
  ClusterSpec c;
  c.name = emulated
               ? fmt::format("this machine, {} ranks, emulated link {} GB/s {} us", ranks, emulated->bandwidth_gbps, emulated->latency_us)
               : fmt::format("this machine, {} ranks", ranks);
  c.device = cpu;
  c.nodes = 1;
  c.gpus_per_node = ranks;
  c.intra = emulated ? *emulated : shared_memory;
  c.inter = c.intra;
  c.cores_per_node = cores > 0 ? cores : 1.0;
  c.ranks_sharing_cores = ranks;
  c.threads_per_rank = std::max(1, threads_per_rank);
  c.sources = "measured on this machine (oases-profile)";
  return c;
}

}  // namespace oases
