#include "executor/launcher.h"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "executor/mpi_communicator.h"
#include "kernels/cpu/parallel.h"

namespace oases {

namespace {

int print_error(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return 2;
}

int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

Expected<std::unique_ptr<RankLauncher>> RankLauncher::start(int* argc, char*** argv, const LaunchOptions& o) {
  auto l = std::make_unique<RankLauncher>();
  l->opts_ = o;
  if (launched_by_mpi_launcher() && mpi_available()) {
    l->mpi_ = mpi_communicator(argc, argv);
    l->mpi_->timeout_s = o.comm_timeout;
    l->world_ = l->mpi_->size();
    if (o.local_ranks > 0) return Status::error("--local-ranks cannot be combined with mpirun/srun");
  } else if (o.local_ranks > 0) {
    l->world_ = o.local_ranks;
  }
  return l;
}

int RankLauncher::process_rank() const {
  return mpi_ ? mpi_->rank() : 0;
}

int RankLauncher::fail_before_run(const Status& s) const {
  if (process_rank() == 0 || !mpi_) return print_error(s);
  return 2;
}

int RankLauncher::run(const Mesh& mesh, const LinkModel& link, const RankBody& body) {
  if (mpi_) {
    // the cores of a node are shared by the ranks on it
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
    int per_node = local ? std::max(1, std::atoi(local)) : 1;
    kernels::set_num_threads(opts_.threads > 0 ? opts_.threads : std::max(1, hardware_threads() / per_node));
    auto rt = RankRuntime::create(mpi_.get(), mesh, link);
    if (!rt) return print_error(rt.status());
    Status st = body(**rt);
    if (!st.is_ok()) {
      std::fprintf(stderr, "error: rank %d: %s\n", mpi_->rank(), st.message().c_str());
      mpi_->abort(st.message());
      return 2;
    }
    return 0;
  }
  if (world_ == 1) {
    auto rt = RankRuntime::create(nullptr, mesh);
    if (!rt) return print_error(rt.status());
    Status st = body(**rt);
    return st.is_ok() ? 0 : print_error(st);
  }
  // N ranks as threads: BLAS single-threaded per rank, the cores shared out
  int per_rank = opts_.threads > 0 ? opts_.threads : std::max(1, hardware_threads() / static_cast<int>(world_));
  Status st = run_thread_ranks(world_, mesh, link, per_rank, opts_.comm_timeout, body);
  return st.is_ok() ? 0 : print_error(st);
}

Status run_thread_ranks(int64_t n, const Mesh& mesh, const LinkModel& link, int threads, double comm_timeout, const RankBody& body) {
  auto lw = make_local_world(static_cast<int>(n), comm_timeout);
  std::vector<Status> results(static_cast<size_t>(n));
  std::vector<std::thread> workers;
  for (int64_t r = 0; r < n; ++r) {
    workers.emplace_back([&, r] {
      kernels::set_num_threads(threads);
      auto comm = local_communicator(lw, static_cast<int>(r));
      Status st;
      try {
        auto rt = RankRuntime::create(n > 1 ? comm.get() : nullptr, mesh, link);
        st = rt ? body(**rt) : rt.status();
      } catch (const std::exception& e) {
        st = Status::error(e.what());
      }
      if (!st.is_ok()) comm->abort(fmt::format("rank {} failed: {}", r, st.message()));
      results[static_cast<size_t>(r)] = st;
    });
  }
  for (auto& t : workers) t.join();
  // the root cause: the first rank whose error is not a consequence of another's
  for (const Status& st : results) {
    if (!st.is_ok() && st.message().find("stopped: rank") == std::string::npos) return st;
  }
  for (const Status& st : results) {
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

}  // namespace oases
