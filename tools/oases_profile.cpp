// oases-profile --backend cpu|cuda --out profile.json [--model MODEL --ranks N [--batch B --seq T]]
//   --backend cuda: the GPU at hand (tools/profile_cuda.h): its rates, the device optimizer, and
//   with --model every op at the shapes rank 0 of a plan over --ranks GPUs has, in --dtype.
//   --backend cpu measures, on the machine at hand, what the planner's cost model needs (planner/profile.h):
//   the device's matrix-product and streaming rates; collective times over message sizes and
//   group sizes on the local communicator (and behind --emulate-link); the optimizer's update
//   rate; and with --model, every op of the training program at the shapes its plans produce (each
//   tp degree of --degrees dividing the model on N ranks, each chunk count of --chunks): the ranks
//   run as threads sharing the cores as oases-train --local-ranks N does, and rank 0's kernels are
//   timed one by one; then every op shape `oases-plan MODEL --gpus N` prices (planner/coverage.h:
//   every degree, chunk count, sequence parallelism and pipeline stage of its default search, the
//   chunk counts widened by --chunks) that those runs did not time is timed alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "executor/cpu/blas_select.h"
#include "executor/device.h"
#include "executor/machine_profile.h"
#include "graph/atomic_file.h"
#include "kernels/cpu/parallel.h"
#include "planner/coverage.h"
#include "planner/profile.h"
#include "tools/plan_driver.h"
#include "tools/profile_cuda.h"

using namespace oases;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<int64_t> parse_ints(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      throw OasesError(fmt::format("{} '{}': '{}' is not a number", flag, s, item));
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-profile: measure op and collective times on this machine for the planner"};
    std::string backend = "cpu", out, model, degrees_s, chunks_s = "1,2,4", emulate, sizes_s, dtype = "bf16";
    int64_t ranks = 2, batch = 0, seq = 0;
    int reps = 3, threads = 0;
    double comm_timeout = kDefaultCommTimeoutS;
    BindingFlags bind;
    app.add_option("--backend", backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--out", out, "Write the profile (JSON)")->required();
    app.add_option("--model", model, "Also time every op of this model's training at the shapes its plans produce");
    app.add_option("--ranks", ranks, "Ranks (threads) sharing this machine, as oases-train --local-ranks N");
    app.add_option("--batch", batch, "Global batch the plans are made for");
    app.add_option("--seq", seq, "Sequence length the plans are made for");
    app.add_option("--degrees", degrees_s,
                   "tp degrees whose programs are run (comma list; default every one dividing the model and the ranks); the op shapes "
                   "of every degree are measured");
    app.add_option("--chunks", chunks_s, "Micro-batch chunk counts whose programs are run (comma list); also measured beside oases-plan's");
    app.add_option("--emulate-link", emulate, "Also time collectives behind an emulated link bw=GBPS,latency=US");
    app.add_option("--sizes", sizes_s, "Collective message sizes in bytes (comma list; default 4 KiB to 16 MiB)");
    app.add_option("--reps", reps, "Timed repetitions (the median is kept)");
    app.add_option("--dtype", dtype, "--backend cuda: the compute type the ops are timed in (fp32 | bf16 | fp16)")->capture_default_str();
    app.add_option("--threads", threads, "Threads per rank (default: the cores shared among the ranks)")
        ->check(CLI::Range(0, kernels::kMaxThreads));
    app.add_option("--comm-timeout", comm_timeout, "Seconds a collective of the thread ranks waits for its peers before the run stops")
        ->capture_default_str();
    bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    if (backend == "cuda") {
      CudaProfileOptions co;
      co.out = out;
      co.model = model;
      co.dtype = dtype;
      co.ranks = app.count("--ranks") ? ranks : 8;
      co.batch = batch;
      co.seq = seq;
      co.degrees = parse_ints(degrees_s, "--degrees");
      co.chunks = parse_ints(chunks_s, "--chunks");
      co.reps = reps;
      if (Status s = bind.apply(&co.import); !s.is_ok()) return fail_with(s);
      return profile_cuda(co);
    }
    if (ranks < 1) return fail_with(error("--ranks must be at least 1, not {}", ranks));
    if (Status s = check_output_file(out, "--out " + out); !s.is_ok()) return fail_with(s);
    if (reps < 1) return fail_with(error("--reps must be at least 1, not {}", reps));
    if (!(comm_timeout > 0 && comm_timeout <= kMaxCommTimeoutS)) {
      return fail_with(error("--comm-timeout must be in (0, {:g}] seconds, not {:g}", kMaxCommTimeoutS, comm_timeout));
    }
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (threads <= 0) threads = std::max(1, cores / static_cast<int>(ranks));
    std::optional<LinkModel> link;
    if (!emulate.empty()) {
      auto lm = parse_link_model(emulate);
      if (!lm) return fail_with(lm.status());
      link = *lm;
    }
    std::vector<int64_t> sizes =
        sizes_s.empty() ? std::vector<int64_t>{4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20} : parse_ints(sizes_s, "--sizes");
    std::vector<int64_t> chunks = parse_ints(chunks_s, "--chunks");
    auto t_start = Clock::now();
    Profile p;
    p.backend = backend;
    p.machine = machine_description(ranks, threads);
    p.ranks = ranks;
    p.threads_per_rank = threads;
    p.op_clock = profile_op_clock(threads);
    p.device = measure_device(threads, p.machine["memory_gib"].get<double>(), ranks);
    p.has_device = true;
    std::printf("device: %.1f GFLOP/s sgemm, %.1f GB/s copy (%d thread(s) per rank)\n", p.device.fp32_tflops * 1e3, p.device.memory_gbps,
                threads);
    for (int64_t g = 2; g <= std::max<int64_t>(ranks, 2); g *= 2) {
      for (const CollectiveSample& s : measure_collectives(g, sizes, nullptr, reps, comm_timeout)) p.collectives.push_back(s);
      if (link) {
        for (const CollectiveSample& s : measure_collectives(g, sizes, &*link, reps, comm_timeout)) p.collectives.push_back(s);
      }
    }
    std::printf("collectives: %zu samples (group sizes 2..%lld, %zu sizes%s)\n", p.collectives.size(),
                static_cast<long long>(std::max<int64_t>(ranks, 2)), sizes.size(), link ? ", also behind the emulated link" : "");
    p.optimizer_us_per_mib = measure_optimizer(threads);
    std::printf("optimizer: AdamW %.1f us per MiB of parameters\n", p.optimizer_us_per_mib);
    // The cores the ranks get: measured with as many busy threads as the ranks run kernels (at
    // least the cores), before, between and after the model's runs (other work comes and goes).
    const int demand = std::max(cores, static_cast<int>(ranks) * threads);
    std::vector<double> available{measure_available_cores(demand)};
    auto record_available = [&] {
      double avail = 0;
      for (double c : available) avail += c / static_cast<double>(available.size());
      p.machine["cores_available"] = std::min(avail, static_cast<double>(cores));
      std::printf("cores: %d, available to %d busy thread(s): %s (other work takes the rest)\n", cores, demand,
                  fmt::format("{:.2f}", fmt::join(available, ", ")).c_str());
    };
    if (!model.empty()) {
      ImportOptions opts;
      if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
      auto pm = load_planning_model(model, opts, batch, seq);
      if (!pm) return fail_with(pm.status());
      auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, ranks);
      if (!a) return fail_with(a.status().with_context(model));
      auto degrees = profiled_degrees(*a, parse_ints(degrees_s, "--degrees"), model, ranks);
      if (!degrees) return fail_with(degrees.status());
      std::map<std::string, OpSample> acc;
      ExecutorOverheads ovh;
      std::vector<CalibrationRun> calib;
      // an interleaved (oases) run, for the calibration only (collectives beside computation, which
      // the plain runs seldom have); the op samples and gaps stay those of the plain runs
      auto interleaved_run = [&](int64_t t, int64_t k) {
        std::map<std::string, OpSample> unused_ops;
        ExecutorOverheads unused_ovh;
        return measure_model_ops(pm->forward, pm->path, *a, ranks, t, k, threads, reps, link ? *link : LinkModel{}, &unused_ops,
                                 &unused_ovh, &calib, "oases", comm_timeout);
      };
      nlohmann::json done = nlohmann::json::array();
      for (int64_t t : *degrees) {
        for (int64_t k : chunks) {
          if (k < 1 || pm->batch % (ranks / t * k) != 0) continue;
          auto t0 = Clock::now();
          if (Status s = measure_model_ops(pm->forward, pm->path, *a, ranks, t, k, threads, reps, link ? *link : LinkModel{}, &acc, &ovh,
                                           &calib, "plain", comm_timeout);
              !s.is_ok())
            return fail_with(s.with_context(model));
          available.push_back(measure_available_cores(demand));
          if (k > 1 && t > 1) {  // with chunks, also the interleaved schedule
            if (Status s = interleaved_run(t, k); !s.is_ok()) return fail_with(s.with_context(model));
          }
          std::printf("ops: tp %lld x dp %lld, %lld chunk(s): %.1f s\n", static_cast<long long>(t), static_cast<long long>(ranks / t),
                      static_cast<long long>(k), seconds_since(t0));
          done.push_back({{"tp", t}, {"chunks", k}});
        }
        // without a chunked run above, one interleaved run at 2 chunks for the calibration
        bool interleaved = std::any_of(done.begin(), done.end(), [&](const nlohmann::json& d) {
          return d["tp"].get<int64_t>() == t && d["chunks"].get<int64_t>() > 1;
        });
        if (t > 1 && !interleaved && pm->batch % (ranks / t * 2) == 0) {
          if (Status s = interleaved_run(t, 2); !s.is_ok()) return fail_with(s.with_context(model));
        }
      }
      // Every op shape the planner prices (planner/coverage.h: oases-plan's default space on these
      // ranks, its chunk counts widened by --chunks) that the runs did not time, timed alone: the
      // products the CPU fusion merged, the layouts, chunk counts and pipeline stages not run, the
      // whole-vocabulary ops that tp lowers
      PricingSpace space = default_pricing_space(ranks, chunks);
      auto priced = priced_ops(pm->forward, pm->train.graph, pm->train.params, *a, space);
      if (!priced) return fail_with(priced.status().with_context(model));
      {
        auto t0 = Clock::now();
        auto alone = measure_priced_ops(pm->train.graph, *priced, threads, reps, p.work_divisor(), &acc);
        if (!alone) return fail_with(alone.status().with_context(model));
        std::printf("ops: the planner prices %zu op shapes (tp %s, chunks %s, pipeline stages); %d not in the runs timed alone: %.1f s\n",
                    priced->size(), fmt::format("{}", fmt::join(a->tp_candidates, ",")).c_str(),
                    fmt::format("{}", fmt::join(space.search.chunks, ",")).c_str(), *alone, seconds_since(t0));
      }
      for (auto& [k, s] : acc) p.ops.push_back(s);
      if (ovh.instr_gaps > 0) p.instr_us = ovh.instr_gap_us / static_cast<double>(ovh.instr_gaps);
      if (ovh.starts > 0) p.comm_start_us = std::max(0.0, ovh.start_gap_us / static_cast<double>(ovh.starts) - p.instr_us);
      available.push_back(measure_available_cores(demand));
      record_available();
      std::vector<std::pair<double, double>> replayed;
      if (Status s = calibrate_executor(calib, emulate, threads, &p, &replayed); !s.is_ok()) return fail_with(s.with_context(model));
      std::printf("executor: the ranks turn %.1f%% of the %.2f free core(s) into work; a collective takes %.1f us beyond the link and the "
                  "shared cores\n",
                  p.core_efficiency * 100, p.core_capacity(), p.comm_sync_us);
      for (size_t i = 0; i < replayed.size(); ++i) {
        std::printf(
            "executor: profiled run %zu (%s, tp %lld, %lld chunk(s), %lld rank(s) on %.2f free core(s), %d thread(s) each): measured %.1f ms, "
            "simulator %.1f ms (%+.1f%%)\n",
            i, calib[i].schedule.c_str(), static_cast<long long>(calib[i].tp), static_cast<long long>(calib[i].chunks),
            static_cast<long long>(calib[i].ranks), p.core_capacity(), threads, replayed[i].second / 1e3, replayed[i].first / 1e3,
            (replayed[i].first / replayed[i].second - 1) * 100);
      }
      std::printf("executor: %.1f us between instructions, %.1f us more after starting a collective (%lld starts timed)\n", p.instr_us,
                  p.comm_start_us, static_cast<long long>(ovh.starts));
      nlohmann::json covers = {{"chunks", space.search.chunks}, {"op_shapes", priced->size()}};
      p.model = {{"path", model}, {"batch", pm->batch}, {"seq", pm->seq}, {"ranks", ranks}, {"profiled", done}, {"covers", covers}};
      std::printf("ops: %zu distinct op shapes of %s\n", p.ops.size(), model.c_str());
    } else {
      record_available();
    }
    if (Status s = write_file_atomically(out, p.to_json().dump(1) + "\n"); !s.is_ok()) return fail_with(s);
    std::printf("wrote %s in %.1f s\n", out.c_str(), seconds_since(t_start));
    return 0;
  });
}
