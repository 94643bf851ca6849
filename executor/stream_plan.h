// How a device runs a program's instruction stream on its streams without the host waiting
// inside a step: compute instructions on stream 0; a collective start records an event on
// stream 0 (its inputs are ready), stream 1 (2 for a channel's transfers) waits for it, runs the
// collective and records a second event; the collective's wait makes stream 0 wait for that one. One event per
// cross-stream dependency, nothing else.
//
// The plan is device-independent and checked on the CPU: check_stream_plan replays it with vector
// clocks over the memory plan's byte ranges and reports the first access of an arena range that
// is not ordered after a conflicting access on the other stream (a race the CUDA runner would
// have), e.g. memory reused by the compute stream while a collective still reads it.
#pragma once

#include <string>
#include <vector>

#include "executor/executor.h"

namespace oases {

// Streams: 0 compute, 1 the mesh's communication, 2 channel 1 (cross-mesh transfers: the
// Reshard nodes of pipelines, never queued behind, or blocking, a mesh's own collectives).
inline constexpr int kNumStreams = 3;

struct StreamOp {
  enum class Kind { kLaunch, kRecord, kWait };
  Kind kind = Kind::kLaunch;
  int stream = 0;    // 0 compute, 1 communication, 2 channel
  size_t instr = 0;  // kLaunch: instruction index in the program
  int event = -1;    // kRecord / kWait
};

struct StreamPlan {
  std::vector<StreamOp> ops;
  int num_events = 0;
  int launches[kNumStreams] = {0, 0, 0};  // per stream
};

// `channel[i]`: instruction i is a collective start on a channel (a node with channel > 0); it
// runs on stream 2. Missing entries: stream 1.
StreamPlan build_stream_plan(const std::vector<Instr>& instrs, const std::vector<bool>& channel = {});
// The same with the channels read from the program's nodes.
StreamPlan build_stream_plan(const Program& p);

// Ok, or the first unordered conflicting access (names both nodes and the value).
Status check_stream_plan(const Program& p, const StreamPlan& plan);

std::string describe(const StreamPlan& plan, const Program& p);

}  // namespace oases
