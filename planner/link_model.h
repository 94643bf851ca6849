// A link as the ring collectives see it (oases-train --emulate-link, the simulator's machine at
// hand): the time of each collective over p ranks.
//   all-reduce      2 (p-1)/p · n / bw + 2 (p-1) · latency      (n = bytes of the tensor)
//   all-gather,
//   reduce-scatter,
//   all-to-all        (p-1)/p · n / bw +   (p-1) · latency      (n = bytes of the whole tensor)
//   broadcast                  n / bw +   (p-1) · latency
//   ring shift                 n / bw +           latency      (n = bytes each rank sends)
#pragma once

#include <string>

#include "graph/status.h"

namespace oases {

struct LinkModel {
  double bandwidth_gbps = 0;  // GB/s (10^9 bytes per second)
  double latency_us = 0;
  bool enabled() const { return bandwidth_gbps > 0; }
  // seconds a collective of this kind moving `bytes` (see above) takes over `p` ranks
  double all_reduce_s(double bytes, int p) const;
  double gather_like_s(double bytes, int p) const;
  double broadcast_s(double bytes, int p) const;
  double shift_s(double bytes) const;
};

// Sane bounds for an emulated link: a collective's emulated time stays finite and short enough
// to wait for (1 MB/s moves a 1 GB tensor in 17 minutes; latency at most 10 s per hop).
constexpr double kMinBandwidthGbps = 1e-3;
constexpr double kMaxBandwidthGbps = 1e6;
constexpr double kMaxLatencyUs = 1e7;

// "bw=GBPS,latency=US" within the bounds above; errors name the text.
Expected<LinkModel> parse_link_model(const std::string& text);

}  // namespace oases
