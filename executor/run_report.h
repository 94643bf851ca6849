// What oases-train reports about its runs besides the per-op node times (executor/node_time_report.h, --profile):
// communication hidden behind computation and exposed per step and per block (--overlap-report),
// and Chrome traces of the executor's timed events (--trace).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "executor/executor.h"
#include "graph/graph.h"

namespace oases {

// Per-step communication accounting from a run's events: total time of the collectives, the
// part the compute thread waited for (exposed), the rest hidden behind computation.
struct OverlapStats {
  struct Acc {
    double comm = 0, exposed = 0;
  };
  int steps = 0;
  double step_ms = 0;
  Acc total;
  std::map<int, Acc> per_layer;
  std::map<int, Acc> per_layer_bwd;
  // Per group of collectives (embedding, layer N attention/MLP forward or backward, head, loss,
  // data-parallel gradients, transfers between meshes): what ran, what hid, and what could have.
  // A collective's room is the compute the compute thread ran between handing it over and waiting
  // for it, less the compute during which another collective ran on its channel (a channel moves
  // one collective at a time: compute that hid the one ahead cannot hide this one too): at most
  // that much of it can hide under this order ("could hide" = min(its time, room)). What is exposed
  // beyond that could not hide (too little compute beside it, or the channel busy with the
  // collectives ahead); what is exposed within it did not hide though compute was there and the
  // channel free (it started late: its peers late, the cores shared; or ran long). `queued` is
  // what the channel's queue took from the room (counted under could not).
  struct Group {
    int count = 0;
    double comm = 0, exposed = 0, could = 0, late = 0, queued = 0;  // us summed over steps; late: issue to start
  };
  std::map<std::string, Group> groups;

  // Adds one step's events of `g` (the program's graph); `count` false skips it (the first step).
  void add(const Graph& g, const std::vector<TraceEvent>& ev, double ms, bool count);
  // Prints the mean per step and per layer; warns when almost nothing was hidden.
  void print(bool overlap_asked, const std::string& schedule) const;
};

// Chrome trace events ("X" complete events, one pid per rank, tid 0 compute, 1 communication and
// 2 the transfers between meshes: "send VALUE to rank R" / "recv VALUE from rank R"). `stage` >= 0
// names the rank's pipeline stage in its process name.
void append_trace(const Graph& g, const std::vector<TraceEvent>& ev, int rank, nlohmann::json* out, int stage = -1);

// Writes every rank's events (`parts`, one JSON array per rank) as one trace document at `path`
// (written to PATH.tmp and renamed); `about` goes to "otherData".
Status write_trace_file(const std::vector<std::string>& parts, const nlohmann::json& about, const std::string& path, size_t* events);

}  // namespace oases
