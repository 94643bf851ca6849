// One instruction of a rank's program order, as the planner's scheduler makes it and the executor
// runs it: a compute node, or the start / the wait of a collective.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace oases {

struct ScheduledOp {
  enum class Kind { kCompute, kCommStart, kCommWait };
  Kind kind = Kind::kCompute;
  NodeId node = kNoId;
};

}  // namespace oases
