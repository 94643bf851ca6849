#include "executor/launcher.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
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
      mpi_->abort(st.message());  // prints "error: rank R: ..." once, then ends every process
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
  bool abandoned = false;
  Status st = run_thread_ranks(world_, mesh, link, per_rank, opts_.comm_timeout, body, &abandoned);
  if (st.is_ok()) return 0;
  int rc = print_error(st);
  if (abandoned) {
    // a hung rank thread still runs this process's code: leave without destructors or atexit
    // handlers, which it could race with
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(rc);
  }
  return rc;
}

Status run_thread_ranks(int64_t n, const Mesh& mesh, const LinkModel& link, int threads, double comm_timeout, const RankBody& body,
                        bool* abandoned) {
  if (abandoned) *abandoned = false;
  // Shared with the rank threads, which may outlive this call: a rank hung in its own code (not in
  // a collective, where an abort wakes it) cannot be stopped, so after an abort the others get a
  // grace period to come back and a rank still out is left behind (detached), its error reported.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Status> results;
    std::vector<bool> finished;
    int running = 0;
    std::chrono::steady_clock::time_point first_failure{};
    bool failed = false;
  };
  auto sh = std::make_shared<Shared>();
  sh->results.resize(static_cast<size_t>(n));
  sh->finished.assign(static_cast<size_t>(n), false);
  sh->running = static_cast<int>(n);
  auto lw = make_local_world(static_cast<int>(n), comm_timeout);
  auto body_copy = std::make_shared<RankBody>(body);
  auto mesh_copy = std::make_shared<Mesh>(mesh);
  std::vector<std::thread> workers;
  for (int64_t r = 0; r < n; ++r) {
    workers.emplace_back([sh, lw, body_copy, mesh_copy, link, threads, n, r] {
      kernels::set_num_threads(threads);
      auto comm = local_communicator(lw, static_cast<int>(r));
      Status st;
      try {
        auto rt = RankRuntime::create(n > 1 ? comm.get() : nullptr, *mesh_copy, link);
        st = rt ? (*body_copy)(**rt) : rt.status();
      } catch (const std::exception& e) {
        st = Status::error(e.what());
      }
      if (!st.is_ok()) comm->abort(fmt::format("rank {} failed: {}", r, st.message()));
      std::lock_guard<std::mutex> lock(sh->mu);
      sh->results[static_cast<size_t>(r)] = st;
      sh->finished[static_cast<size_t>(r)] = true;
      if (!st.is_ok() && !sh->failed) {
        sh->failed = true;
        sh->first_failure = std::chrono::steady_clock::now();
      }
      --sh->running;
      sh->cv.notify_all();
    });
  }
  // Ranks blocked in a collective return at once after an abort, ranks computing at their next
  // collective; one not back within the grace is hung.
  const auto grace = std::chrono::duration<double>(std::min(comm_timeout, 10.0));
  std::vector<int64_t> hung;
  {
    std::unique_lock<std::mutex> lock(sh->mu);
    while (sh->running > 0) {
      if (!sh->failed) {
        sh->cv.wait(lock);
      } else if (sh->cv.wait_until(lock, sh->first_failure + grace) == std::cv_status::timeout && sh->running > 0) {
        for (int64_t r = 0; r < n; ++r) {
          if (!sh->finished[static_cast<size_t>(r)]) hung.push_back(r);
        }
        break;
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    auto& t = workers[static_cast<size_t>(r)];
    if (std::find(hung.begin(), hung.end(), r) != hung.end()) {
      t.detach();
    } else {
      t.join();
    }
  }
  if (abandoned) *abandoned = !hung.empty();
  std::vector<Status> results;
  {
    std::lock_guard<std::mutex> lock(sh->mu);
    results = sh->results;
  }
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
