// Link emulation: a CommGroup that completes each collective no earlier than the last member's
// arrival plus what a link of the given bandwidth and latency would take under a ring algorithm
// (planner/link_model.h), sleeping (not spinning) for the difference, so overlap can be studied on
// one machine. Every member leaves at that moment, the early ones too: ranks that share cores
// cannot hide one rank's link time behind another's computation, which the real link would not let
// them do either.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "executor/communicator.h"
#include "graph/status.h"
#include "planner/link_model.h"

namespace oases {

std::unique_ptr<CommGroup> emulate_link(std::unique_ptr<CommGroup> inner, const LinkModel& link);

// Emulated hosts (oases-train --hosts N): the host of each world rank, set once per process before
// the ranks make their groups. A group whose members share one host then runs at the speed of the
// machine (the link emulated is the one between hosts); empty: every group is emulated.
void set_emulated_hosts(std::vector<int> host_of);
const std::vector<int>& emulated_hosts();
// The link a group of these world ranks is emulated with: none when they share an emulated host.
LinkModel link_for_members(const std::vector<int>& members, const LinkModel& link);

}  // namespace oases
