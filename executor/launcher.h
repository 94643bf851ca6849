// Starting the ranks of a run: one rank, N ranks as threads of this process (--local-ranks), or one
// rank per process under mpirun/srun (MPI). The cores are shared out among the ranks of a node
// (kernel threads per rank), and when ranks fail the error reported is the root cause: the first
// rank whose error is not a consequence of another rank stopping. oases-train and oases-profile
// launch their ranks here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "executor/communicator.h"
#include "executor/distributed.h"
#include "executor/emulated_link.h"
#include "graph/sharding.h"
#include "graph/status.h"

namespace oases {

struct LaunchOptions {
  int64_t local_ranks = 0;                     // N > 0: N ranks as threads of this process
  int threads = 0;                             // kernel threads per rank; 0: the node's cores shared among its ranks
  double comm_timeout = kDefaultCommTimeoutS;  // seconds a collective waits for its peers
};

using RankBody = std::function<Status(RankRuntime&)>;

class RankLauncher {
 public:
  // Joins the MPI job when started by mpirun/srun (and MPI is built in); --local-ranks cannot go
  // with it.
  static Expected<std::unique_ptr<RankLauncher>> start(int* argc, char*** argv, const LaunchOptions& o);

  int64_t world() const { return world_; }
  int process_rank() const;  // this process's rank under MPI, else 0
  bool is_mpi() const { return mpi_ != nullptr; }

  // Reports an error found before the ranks run (every process found it): printed once (rank 0,
  // or a process of its own), exit code 2.
  int fail_before_run(const Status& s) const;
  // Runs `body` on every rank of this process over `mesh`; prints the error as the tools do
  // (`error: ...`) and returns the exit code (0, or 2). Under MPI a failing rank aborts the job.
  int run(const Mesh& mesh, const LinkModel& link, const RankBody& body);

 private:
  LaunchOptions opts_;
  std::unique_ptr<Communicator> mpi_;
  int64_t world_ = 1;
};

// N ranks as threads of this process over `mesh` (each with `threads` kernel threads): the root-
// cause error, or ok when every rank succeeded. When a rank failed and another did not return
// within min(comm_timeout, 10 s) after it (hung in its own code), that thread is detached and
// `*abandoned` set: the caller must then end the process without running destructors.
Status run_thread_ranks(int64_t n, const Mesh& mesh, const LinkModel& link, int threads, double comm_timeout, const RankBody& body,
                        bool* abandoned = nullptr);

}  // namespace oases
