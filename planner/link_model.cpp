#include "planner/link_model.h"

#include <sstream>

#include <fmt/format.h>

namespace oases {

double LinkModel::all_reduce_s(double bytes, int p) const {
  if (p <= 1) return 0;
  return 2.0 * (p - 1) / p * bytes / (bandwidth_gbps * 1e9) + 2.0 * (p - 1) * latency_us * 1e-6;
}

double LinkModel::gather_like_s(double bytes, int p) const {
  if (p <= 1) return 0;
  return static_cast<double>(p - 1) / p * bytes / (bandwidth_gbps * 1e9) + (p - 1) * latency_us * 1e-6;
}

double LinkModel::broadcast_s(double bytes, int p) const {
  if (p <= 1) return 0;
  return bytes / (bandwidth_gbps * 1e9) + (p - 1) * latency_us * 1e-6;
}

double LinkModel::shift_s(double bytes) const {
  return bytes / (bandwidth_gbps * 1e9) + latency_us * 1e-6;
}

Expected<LinkModel> parse_link_model(const std::string& text) {
  LinkModel m;
  std::stringstream ss(text);
  std::string item;
  bool have_bw = false;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) return error("--emulate-link '{}': '{}' is not key=value (bw=GBPS,latency=US)", text, item);
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    double x;
    try {
      size_t used = 0;
      x = std::stod(v, &used);
      if (used != v.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return error("--emulate-link '{}': '{}' is not a number", text, v);
    }
    // Bounds keep an emulated collective from sleeping for hours (or forever: latency=1e12).
    if (k == "bw") {
      if (!(x >= kMinBandwidthGbps && x <= kMaxBandwidthGbps)) {
        return error("--emulate-link '{}': the bandwidth must be a number from {} to {} GB/s", text, kMinBandwidthGbps, kMaxBandwidthGbps);
      }
      m.bandwidth_gbps = x;
      have_bw = true;
    } else if (k == "latency") {
      if (!(x >= 0 && x <= kMaxLatencyUs)) {
        return error("--emulate-link '{}': the latency must be a number from 0 to {} us (10 s)", text, kMaxLatencyUs);
      }
      m.latency_us = x;
    } else {
      return error("--emulate-link '{}': unknown key '{}' (bw, latency)", text, k);
    }
  }
  if (!have_bw) return error("--emulate-link '{}' needs bw=GBPS", text);
  return m;
}

}  // namespace oases
