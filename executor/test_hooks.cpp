#include "executor/test_hooks.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace oases {

TestFault TestFault::from_env() {
  TestFault f;
  if (const char* env = std::getenv("OASES_TEST_FAULT")) {
    char mode[16] = {0};
    int rank = -1;
    long step = -1;
    if (std::sscanf(env, "%d:%ld:%15s", &rank, &step, mode) == 3) {
      f.rank_ = rank;
      f.step_ = step;
      std::string m(mode);
      f.mode_ = m == "exit" ? Mode::kExit : m == "kill" ? Mode::kKill : m == "hang" ? Mode::kHang : Mode::kError;
    }
  }
  return f;
}

Status TestFault::at_step(int rank, int64_t step) const {
  if (mode_ == Mode::kNone || rank != rank_ || step != step_) return Status::ok();
  if (mode_ == Mode::kExit) std::_Exit(9);
  if (mode_ == Mode::kKill) std::raise(SIGKILL);
  if (mode_ == Mode::kHang) {
    // "forever" for the test (its peers time out in seconds), but bounded: should the launcher fail
    // to stop this process, it does not outlive the test by more than 5 minutes (an orphan holding
    // the test's output open would hold CTest with it)
    std::this_thread::sleep_for(std::chrono::minutes(5));
    std::_Exit(70);
  }
  if (mode_ == Mode::kError) return error("injected failure at step {} (OASES_TEST_FAULT)", step + 1);
  return Status::ok();
}

}  // namespace oases
