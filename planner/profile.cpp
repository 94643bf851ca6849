#include "planner/profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/op_registry.h"
#include "planner/link_model.h"

namespace oases {

namespace {

Expected<CollectiveKind> collective_kind(const std::string& s, const std::string& where) {
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                           CollectiveKind::kAllToAll, CollectiveKind::kBroadcast}) {
    if (s == collective_name(k)) return k;
  }
  return error("{}: unknown collective kind '{}'", where, s);
}

// Piecewise-linear interpolation in log-log space over (work, time) points sorted by work; beyond
// the ends the nearest point's rate (time proportional to work).
double interpolate(const std::vector<std::pair<double, double>>& pts, double work) {
  if (pts.empty()) return -1;
  work = std::max(work, 1.0);
  if (work <= pts.front().first) return pts.front().second * work / std::max(pts.front().first, 1.0);
  if (work >= pts.back().first) return pts.back().second * work / std::max(pts.back().first, 1.0);
  auto hi = std::lower_bound(pts.begin(), pts.end(), std::make_pair(work, -1e300));
  auto lo = hi - 1;
  double x0 = std::log(std::max(lo->first, 1.0)), x1 = std::log(std::max(hi->first, 1.0));
  double y0 = std::log(std::max(lo->second, 1e-3)), y1 = std::log(std::max(hi->second, 1e-3));
  double f = x1 > x0 ? (std::log(work) - x0) / (x1 - x0) : 0;
  return std::exp(y0 + f * (y1 - y0));
}

// The cores the profile's ranks got, or this machine's when it did not record them.
double capacity_or_here(const Profile& p) {
  return p.core_capacity() > 0 ? p.core_capacity() : static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

bool is_compute_bound_op(const std::string& op) {
  // "MatMul", "oases.MatMulT", "oases.cpu.FusedMatMul": the domain is what precedes the last dot
  size_t dot = op.rfind('.');
  std::string domain = dot == std::string::npos ? std::string() : op.substr(0, dot);
  return op_has_trait(OpRegistry::global().find(domain, op.substr(dot == std::string::npos ? 0 : dot + 1)), kTraitComputeBound);
}

std::string node_op_name(const Node& n) {
  return is_default_domain(n.domain) ? n.op_type : n.domain + "." + n.op_type;
}

std::string op_key(const std::string& op, const std::vector<std::pair<DType, Shape>>& inputs,
                   const std::vector<std::pair<DType, Shape>>& outputs) {
  auto side = [](const std::vector<std::pair<DType, Shape>>& vs) {
    std::vector<std::string> parts;
    for (const auto& [dt, s] : vs) {
      std::vector<std::string> d;
      for (int64_t x : s) d.push_back(std::to_string(x));
      parts.push_back(fmt::format("{}[{}]", dtype_name(dt), fmt::join(d, "x")));
    }
    return fmt::format("{}", fmt::join(parts, " "));
  };
  return fmt::format("{} {} -> {}", op, side(inputs), side(outputs));
}

std::string node_key(const Graph& g, const Node& n) {
  std::vector<std::pair<DType, Shape>> in, out;
  for (ValueId v : n.inputs) {
    if (v != kNoId) in.push_back({g.value(v).dtype, g.value(v).shape});
  }
  for (ValueId v : n.outputs) {
    if (v != kNoId) out.push_back({g.value(v).dtype, g.value(v).shape});
  }
  std::string k = op_key(node_op_name(n), in, out);
  // products differ by which operand is transposed
  if (n.attrs.has("transA") || n.attrs.has("transB") || n.attrs.has("trans_a") || n.attrs.has("trans_b")) {
    k += fmt::format(" t{}{}", n.attrs.get_int("transA", n.attrs.get_int("trans_a", 0)),
                     n.attrs.get_int("transB", n.attrs.get_int("trans_b", 0)));
  }
  return k;
}

bool is_free_op(const Node& n, const OpCost& c) {
  if (c.flops == 0 && c.bytes == 0) return true;
  const OpSchema* s = OpRegistry::global().find(n.domain, n.op_type);
  return s && s->view_of_input >= 0 && c.flops == 0;
}

nlohmann::json Profile::to_json() const {
  nlohmann::json j{{"format", "oases-profile"},
                   {"version", 1},
                   {"backend", backend},
                   {"units", {{"time", "us"}, {"size", "bytes"}, {"bandwidth", "GB/s"}, {"compute", "TFLOP/s"}}},
                   {"machine", machine},
                   {"ranks", ranks},
                   {"threads_per_rank", threads_per_rank},
                   {"op_clock", op_clock}};
  if (has_device) j["device"] = device_to_json(device);
  nlohmann::json o = nlohmann::json::array();
  for (const OpSample& s : ops)
    o.push_back({{"op", s.op}, {"key", s.key}, {"flops", s.flops}, {"bytes", s.bytes}, {"us", s.us}, {"samples", s.samples}});
  j["ops"] = o;
  nlohmann::json c = nlohmann::json::array();
  for (const CollectiveSample& s : collectives) {
    c.push_back({{"kind", collective_name(s.kind)}, {"group", s.group}, {"bytes", s.bytes}, {"us", s.us}, {"link", s.link}});
  }
  j["collectives"] = c;
  if (optimizer_us_per_mib > 0) j["optimizer"] = {{"kind", "adamw"}, {"us_per_mib", optimizer_us_per_mib}};
  if (instr_us > 0 || comm_start_us > 0 || comm_sync_us > 0 || comm_beside_compute_us > 0 || core_efficiency != 1.0 ||
      comm_thread_share != 1.0) {
    j["executor"] = {{"instr_us", instr_us},
                     {"comm_start_us", comm_start_us},
                     {"comm_sync_us", comm_sync_us},
                     {"comm_beside_compute_us", comm_beside_compute_us},
                     {"core_efficiency", core_efficiency},
                     {"comm_thread_share", comm_thread_share}};
  }
  if (!model.is_null()) j["model"] = model;
  return j;
}

Expected<Profile> profile_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || j.value("format", "") != "oases-profile")
    return error("{}: not an oases-profile file (no \"format\": \"oases-profile\")", where);
  if (j.value("version", 0) != 1) return error("{}: profile version {} (this build reads 1)", where, j.value("version", 0));
  Profile p;
  try {
    p.backend = j.value("backend", "cpu");
    if (j.contains("units")) {
      const auto& u = j["units"];
      if (u.value("time", "us") != "us" || u.value("size", "bytes") != "bytes") return error("{}: units must be us and bytes", where);
    }
    p.machine = j.value("machine", nlohmann::json::object());
    p.ranks = j.value("ranks", int64_t{1});
    p.threads_per_rank = j.value("threads_per_rank", 1);
    if (p.ranks < 1 || p.threads_per_rank < 1) return error("{}: ranks and threads_per_rank must be at least 1", where);
    // profiles from before the field timed everything on the wall clock (and carried a fitted
    // executor.core_share, no longer read: the simulator shares the cores itself)
    p.op_clock = j.value("op_clock", "wall");
    if (p.op_clock != "wall" && p.op_clock != "thread_cpu")
      return error("{}: op_clock must be \"thread_cpu\" or \"wall\", not \"{}\"", where, p.op_clock);
    if (p.machine.contains("cores") && !(p.machine["cores"].is_number_integer() && p.machine["cores"].get<int64_t>() >= 1))
      return error("{}: machine.cores must be a whole number of at least 1", where);
    if (p.machine.contains("cores_available") &&
        !(p.machine["cores_available"].is_number() && p.machine["cores_available"].get<double>() > 0))
      return error("{}: machine.cores_available must be a positive number", where);
    if (j.contains("device")) {
      OASES_ASSIGN_OR_RETURN(p.device, device_from_json(j["device"], where));
      p.has_device = true;
    }
    for (const auto& o : j.value("ops", nlohmann::json::array())) {
      OpSample s;
      s.op = o.at("op").get<std::string>();
      s.key = o.value("key", "");
      s.flops = o.value("flops", 0.0);
      s.bytes = o.value("bytes", 0.0);
      s.us = o.at("us").get<double>();
      s.samples = o.value("samples", 1);
      if (!(s.us >= 0) || !std::isfinite(s.us)) return error("{}: op sample '{}' has time {}", where, s.key, s.us);
      p.ops.push_back(s);
    }
    for (const auto& o : j.value("collectives", nlohmann::json::array())) {
      CollectiveSample s;
      OASES_ASSIGN_OR_RETURN(s.kind, collective_kind(o.at("kind").get<std::string>(), where));
      s.group = o.at("group").get<int64_t>();
      s.bytes = o.at("bytes").get<double>();
      s.us = o.at("us").get<double>();
      s.link = o.value("link", "shared-memory");
      if (s.group < 2 || !(s.bytes >= 0) || !(s.us >= 0))
        return error("{}: bad collective sample (group {}, {} bytes, {} us)", where, s.group, s.bytes, s.us);
      p.collectives.push_back(s);
    }
    if (j.contains("optimizer")) p.optimizer_us_per_mib = j["optimizer"].value("us_per_mib", 0.0);
    if (j.contains("executor")) {
      p.instr_us = j["executor"].value("instr_us", 0.0);
      p.comm_start_us = j["executor"].value("comm_start_us", 0.0);
      p.comm_sync_us = j["executor"].value("comm_sync_us", 0.0);
      p.comm_beside_compute_us = j["executor"].value("comm_beside_compute_us", 0.0);
      p.core_efficiency = j["executor"].value("core_efficiency", 1.0);
      if (!(p.core_efficiency > 0 && p.core_efficiency <= 1)) {
        return error("{}: executor core_efficiency must be in (0, 1], got {}", where, p.core_efficiency);
      }
      p.comm_thread_share = j["executor"].value("comm_thread_share", 1.0);
      if (!(p.comm_thread_share >= 0 && p.comm_thread_share <= 1)) {
        return error("{}: executor comm_thread_share must be in [0, 1], got {}", where, p.comm_thread_share);
      }
      for (double t : {p.comm_sync_us, p.comm_beside_compute_us}) {
        if (!(t >= 0) || !std::isfinite(t))
          return error("{}: executor comm_sync_us and comm_beside_compute_us must be non-negative times", where);
      }
      if (!(p.instr_us >= 0) || !(p.comm_start_us >= 0) || !std::isfinite(p.instr_us) || !std::isfinite(p.comm_start_us)) {
        return error("{}: executor overheads must be finite and not negative", where);
      }
    }
    if (j.contains("model")) p.model = j["model"];
  } catch (const nlohmann::json::exception& e) {
    return error("{}: {}", where, e.what());
  }
  return p;
}

Expected<Profile> load_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return error("{}: no such profile file", path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return error("{}: not valid JSON", path);
  return profile_from_json(j, path);
}

OpTimeModel::OpTimeModel(const Profile* profile, const DeviceSpec& device, double sharing)
    : profile_(profile), device_(device), sharing_(sharing) {
  if (profile_) measured_ = sharing_ / profile_->work_divisor();
  if (!profile_) return;
  std::map<std::string, std::pair<double, int>> acc;
  for (const OpSample& s : profile_->ops) {
    if (!s.key.empty()) {
      auto& a = acc[s.key];
      a.first += s.us;
      a.second += 1;
    }
    double work = is_compute_bound_op(s.op) ? s.flops : s.bytes;
    by_op_[s.op].push_back({std::max(work, 1.0), s.us});
  }
  for (const auto& [k, a] : acc) exact_[k] = a.first / a.second;
  for (auto& [op, pts] : by_op_) std::sort(pts.begin(), pts.end());
}

double OpTimeModel::roofline(const std::string& op, double flops, double bytes) const {
  double tflops = half_ && device_.fp16_tflops > 0 && is_compute_bound_op(op) ? device_.fp16_tflops : device_.fp32_tflops;
  double peak = tflops * 1e12 * (is_compute_bound_op(op) ? device_.matmul_efficiency : 0.5 * device_.matmul_efficiency);
  double bw = device_.memory_gbps * 1e9 * device_.memory_efficiency * (half_ ? 2.0 : 1.0);
  double t = std::max(peak > 0 ? flops / peak : 0.0, bw > 0 ? bytes / bw : 0.0);
  return t + device_.launch_us * 1e-6;
}

void OpTimeModel::log_lookups() {
  log_ = std::make_shared<LookupLog>();
}

std::set<std::pair<std::string, std::string>> OpTimeModel::lookups() const {
  if (!log_) return {};
  std::lock_guard<std::mutex> lock(log_->mu);
  return log_->keys;
}

double OpTimeModel::seconds(const std::string& op, const std::string& key, double flops, double bytes) const {
  if (log_) {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->keys.insert({op, key});
  }
  if (profile_) {
    auto it = exact_.find(key);
    if (it != exact_.end()) return it->second * 1e-6 * measured_;
    auto bo = by_op_.find(op);
    if (bo != by_op_.end()) {
      double us = interpolate(bo->second, is_compute_bound_op(op) ? flops : bytes);
      if (us >= 0) return us * 1e-6 * measured_;
    }
  }
  return roofline(op, flops, bytes) * sharing_;
}

OpCost node_cost(const Graph& g, const Node& n) {
  const OpSchema* s = find_schema(n);
  return s && s->cost ? s->cost(g, n) : OpCost{};
}

double OpTimeModel::node_seconds(const Graph& g, const Node& n) const {
  OpCost c = node_cost(g, n);
  if (is_free_op(n, c)) return 0;
  return seconds(node_op_name(n), node_key(g, n), c.flops, c.bytes);
}

double OpTimeModel::optimizer_seconds(double param_bytes) const {
  // timed alone (one rank's threads), and every rank updates its parameters at once
  if (profile_ && profile_->optimizer_us_per_mib > 0) return profile_->optimizer_us_per_mib * param_bytes / (1 << 20) * 1e-6 * sharing_;
  // AdamW reads the parameter, its gradient and two moments and writes three: 7 passes
  double bw = device_.memory_gbps * 1e9 * device_.memory_efficiency;
  return bw > 0 ? 7.0 * param_bytes / bw * sharing_ : 0;
}

double OpTimeModel::instr_seconds() const {
  return profile_ ? profile_->instr_us * 1e-6 * measured_ : 0;
}

double OpTimeModel::comm_start_seconds() const {
  return profile_ ? profile_->comm_start_us * 1e-6 * measured_ : 0;
}
double OpTimeModel::comm_sync_seconds() const {
  return profile_ ? profile_->comm_sync_us * 1e-6 : 0;
}
double OpTimeModel::comm_beside_compute_seconds() const {
  return profile_ ? profile_->comm_beside_compute_us * 1e-6 : 0;
}
double OpTimeModel::comm_thread_share() const {
  return profile_ ? profile_->comm_thread_share : 1.0;
}

double profiled_collective_seconds(const Profile& p, CollectiveKind k, double bytes, int64_t group, const std::string& link) {
  std::map<int64_t, std::vector<std::pair<double, double>>> by_group;
  for (const CollectiveSample& s : p.collectives) {
    if (s.kind != k || s.link != link) continue;
    by_group[s.group].push_back({std::max(s.bytes, 1.0), s.us});
  }
  if (by_group.empty()) return -1;
  auto it = by_group.find(group);
  if (it == by_group.end()) {
    // nearest group size
    int64_t best = by_group.begin()->first;
    for (const auto& [gs, v] : by_group) {
      if (std::abs(gs - group) < std::abs(best - group)) best = gs;
    }
    it = by_group.find(best);
  }
  auto pts = it->second;
  std::sort(pts.begin(), pts.end());
  // collectives have a latency floor: below the smallest sample, its time
  if (bytes <= pts.front().first) return pts.front().second * 1e-6;
  return interpolate(pts, bytes) * 1e-6;
}

ClusterSpec this_machine(int64_t ranks, const Profile* profile, const std::string& emulate_link, int threads_per_rank) {
  DeviceSpec cpu = profile && profile->has_device ? profile->device : *find_device("CPU");
  LinkSpec shm{"shared-memory", 10, 2};
  if (profile) {
    // alpha-beta of the local communicator from the profile's all-reduces
    double big_b = 0, big_t = 0, small_b = 1e300, small_t = 0;
    int64_t p = 2;
    for (const CollectiveSample& c : profile->collectives) {
      if (c.kind != CollectiveKind::kAllReduce || c.link != "shared-memory") continue;
      if (c.bytes > big_b) {
        big_b = c.bytes;
        big_t = c.us;
        p = c.group;
      }
      if (c.bytes < small_b) {
        small_b = c.bytes;
        small_t = c.us;
      }
    }
    if (big_t > 0) {
      double f = 2.0 * static_cast<double>(p - 1) / static_cast<double>(p);
      shm.bandwidth_gbps = f * big_b / (big_t * 1e-6) / 1e9;
      shm.latency_us = std::max(0.1, small_t / (2.0 * static_cast<double>(p - 1)));
    }
  }
  std::optional<LinkSpec> emu;
  if (!emulate_link.empty()) {
    auto lm = parse_link_model(emulate_link);
    if (lm) emu = LinkSpec{"emulated", lm->bandwidth_gbps, lm->latency_us};
  }
  // the cores the ranks got, times the share of them the profiled runs turned into work
  double cores = profile ? capacity_or_here(*profile) * profile->core_efficiency
                         : static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
  return local_cluster(ranks, cpu, shm, emu ? &*emu : nullptr, cores, threads_per_rank);
}

int Profile::cores() const {
  return machine.contains("cores") && machine["cores"].is_number_integer() ? machine["cores"].get<int>() : 0;
}

double Profile::core_capacity() const {
  if (machine.contains("cores_available") && machine["cores_available"].is_number()) {
    double c = machine["cores_available"].get<double>();
    if (c > 0) return cores() > 0 ? std::min(c, static_cast<double>(cores())) : c;
  }
  return cores();
}

double Profile::work_divisor() const {
  if (op_clock == "thread_cpu") return 1.0;
  return std::max(1.0, static_cast<double>(ranks * threads_per_rank) / capacity_or_here(*this));
}

OpTimeModel op_time_model(const ClusterSpec& cluster, const Profile* profile) {
  return OpTimeModel(profile, profile && profile->has_device ? profile->device : cluster.device, cluster.compute_slowdown());
}

double collective_cpu_seconds(const Profile& p, CollectiveKind k, double bytes, int64_t group) {
  double s = profiled_collective_seconds(p, k, bytes, group, "shared-memory");
  if (s <= 0) return 0;
  // measured with `group` thread ranks, nothing else running, on the profiled machine's cores
  return s / std::max(1.0, static_cast<double>(group) / capacity_or_here(p));
}

}  // namespace oases
