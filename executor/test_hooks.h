// Hooks the end-to-end tests use to make a rank fail on purpose (tests/e2e: peer failures, abort
// and root-cause reporting). Set by the environment only:
//   OASES_TEST_FAULT=RANK:STEP:MODE   at 0-based step STEP, rank RANK fails: MODE error (returns an
//                                     error naming the step), exit (the process exits with 9 at
//                                     once), kill (the process kills itself with SIGKILL, as the
//                                     OOM killer or an operator would), hang (sleeps inside the step, so
//                                     its peers time out; after 5 minutes it exits with 70, so that
//                                     a rank its launcher failed to stop never outlives the test)
#pragma once

#include <cstdint>

#include "graph/status.h"

namespace oases {

class TestFault {
 public:
  enum class Mode { kNone, kError, kExit, kKill, kHang };
  // Reads OASES_TEST_FAULT (none when unset or malformed).
  static TestFault from_env();
  // Fires the fault when `rank` and `step` are the configured ones.
  Status at_step(int rank, int64_t step) const;

 private:
  int rank_ = -1;
  int64_t step_ = -1;
  Mode mode_ = Mode::kNone;
};

}  // namespace oases
