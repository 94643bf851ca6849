// Link emulation: a CommGroup that completes each collective no earlier than a link of the given
// bandwidth and latency would under a ring algorithm (planner/link_model.h), sleeping (not
// spinning) for the difference, so overlap can be studied on one machine.
#pragma once

#include <memory>
#include <string>

#include "executor/communicator.h"
#include "graph/status.h"
#include "planner/link_model.h"

namespace oases {

std::unique_ptr<CommGroup> emulate_link(std::unique_ptr<CommGroup> inner, const LinkModel& link);

}  // namespace oases
