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

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "executor/cpu/blas_select.h"
#include "executor/device.h"
#include "executor/measure_machine.h"
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

struct ProfileArgs {
  std::string backend = "cpu", out, model, degrees, chunks = "1,2,4", emulate, sizes, dtype = "bf16";
  std::string calibration;  // --calibration: the executor's fitted terms from this profile, not this model's runs
  std::string machine;      // --machine: this machine's measurements from this profile, not measured again
  int64_t ranks = 2, batch = 0, seq = 0;
  bool ranks_given = false;  // --ranks on the command line (the cuda backend's default is 8)
  int reps = 3, threads = 0;
  double comm_timeout = kDefaultCommTimeoutS;
  BindingFlags bind;
};

void add_profile_options(CLI::App& app, ProfileArgs& a) {
  app.add_option("--backend", a.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--out", a.out, "Write the profile (JSON)")->required();
  app.add_option("--model", a.model, "Also time every op of this model's training at the shapes its plans produce");
  app.add_option("--ranks", a.ranks, "Ranks (threads) sharing this machine, as oases-train --local-ranks N");
  app.add_option("--batch", a.batch, "Global batch the plans are made for");
  app.add_option("--seq", a.seq, "Sequence length the plans are made for");
  app.add_option("--degrees", a.degrees,
                 "tp degrees whose programs are run (comma list; default every one dividing the model and the ranks); the op shapes "
                 "of every degree are measured");
  app.add_option("--chunks", a.chunks, "Micro-batch chunk counts whose programs are run (comma list); also measured beside oases-plan's");
  app.add_option("--emulate-link", a.emulate, "Also time collectives behind an emulated link bw=GBPS,latency=US");
  app.add_option("--sizes", a.sizes, "Collective message sizes in bytes (comma list; default 4 KiB to 16 MiB)");
  app.add_option("--reps", a.reps, "Timed repetitions (the median is kept)");
  app.add_option("--dtype", a.dtype, "--backend cuda: the compute type the ops are timed in (fp32 | bf16 | fp16)")->capture_default_str();
  app.add_option("--threads", a.threads, "Threads per rank (default: the cores shared among the ranks)")
      ->check(CLI::Range(0, kernels::kMaxThreads));
  app.add_option("--calibration", a.calibration,
                 "With --model: take the executor's fitted terms (cores turned into work, a collective's extra time, dispatch) from this "
                 "profile of another model or configuration instead of fitting them to this model's runs (out-of-sample validation)")
      ->check(CLI::ExistingFile);
  app.add_option("--machine", a.machine,
                 "With --model: take this machine's measurements (sgemm and copy rates, collectives, optimizer, the cores available) "
                 "from this earlier profile of it at the same --ranks, --threads and --emulate-link instead of measuring them again; "
                 "only the model's ops and runs are timed (profiling many models on one machine)")
      ->check(CLI::ExistingFile);
  app.add_option("--comm-timeout", a.comm_timeout, "Seconds a collective of the thread ranks waits for its peers before the run stops")
      ->capture_default_str();
  a.bind.add_to(app);
}

// --backend cuda: the GPU at hand (tools/profile_cuda.h).
int profile_gpu(const ProfileArgs& a) {
  CudaProfileOptions co;
  co.out = a.out;
  co.model = a.model;
  co.dtype = a.dtype;
  co.ranks = a.ranks_given ? a.ranks : 8;
  co.batch = a.batch;
  co.seq = a.seq;
  co.degrees = parse_ints(a.degrees, "--degrees");
  co.chunks = parse_ints(a.chunks, "--chunks");
  co.reps = a.reps;
  if (Status s = a.bind.apply(&co.import); !s.is_ok()) return fail_with(s);
  return profile_cuda(co);
}

// What the CPU measurements share: the cores, the threads per rank, the busy threads the cores
// available are measured with (`available`: before, between and after the model's runs), the
// emulated link, and the lists parsed from the flags.
struct CpuSetup {
  int cores = 1, threads = 1, demand = 1;
  std::optional<LinkModel> link;
  std::vector<int64_t> sizes, chunks;
  std::vector<double> available;
  bool machine_given = false;  // --machine: `available` is that profile's, not sampled here

  // One sample of the cores available to `demand` busy threads, unless --machine gave them.
  void sample_cores() {
    if (!machine_given) available.push_back(measure_available_cores(demand));
  }
};

Expected<CpuSetup> cpu_setup(const ProfileArgs& a) {
  if (a.ranks < 1) return error("--ranks must be at least 1, not {}", a.ranks);
  OASES_RETURN_IF_ERROR(check_output_file(a.out, "--out " + a.out));
  if (a.reps < 1) return error("--reps must be at least 1, not {}", a.reps);
  if (!(a.comm_timeout > 0 && a.comm_timeout <= kMaxCommTimeoutS)) {
    return error("--comm-timeout must be in (0, {:g}] seconds, not {:g}", kMaxCommTimeoutS, a.comm_timeout);
  }
  CpuSetup c;
  c.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.threads = a.threads > 0 ? a.threads : std::max(1, c.cores / static_cast<int>(a.ranks));
  if (!a.emulate.empty()) {
    auto lm = parse_link_model(a.emulate);
    if (!lm) return lm.status();
    c.link = *lm;
  }
  c.sizes = a.sizes.empty() ? std::vector<int64_t>{4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20} : parse_ints(a.sizes, "--sizes");
  c.chunks = parse_ints(a.chunks, "--chunks");
  return c;
}

// The device's rates, the collectives over group sizes and message sizes, the optimizer.
void measure_machine(const ProfileArgs& a, const CpuSetup& c, Profile& p) {
  p.backend = a.backend;
  p.machine = machine_description(a.ranks, c.threads);
  p.ranks = a.ranks;
  p.threads_per_rank = c.threads;
  p.op_clock = profile_op_clock(c.threads);
  p.device = measure_device(c.threads, p.machine["memory_gib"].get<double>(), a.ranks);
  p.has_device = true;
  std::printf("device: %.1f GFLOP/s sgemm, %.1f GB/s copy (%d thread(s) per rank)\n", p.device.fp32_tflops * 1e3, p.device.memory_gbps,
              c.threads);
  for (int64_t g = 2; g <= std::max<int64_t>(a.ranks, 2); g *= 2) {
    for (const CollectiveSample& s : measure_collectives(g, c.sizes, nullptr, a.reps, a.comm_timeout)) p.collectives.push_back(s);
    if (c.link) {
      for (const CollectiveSample& s : measure_collectives(g, c.sizes, &*c.link, a.reps, a.comm_timeout)) p.collectives.push_back(s);
    }
  }
  std::printf("collectives: %zu samples (group sizes 2..%lld, %zu sizes%s)\n", p.collectives.size(),
              static_cast<long long>(std::max<int64_t>(a.ranks, 2)), c.sizes.size(), c.link ? ", also behind the emulated link" : "");
  p.optimizer_us_per_mib = measure_optimizer(c.threads);
  std::printf("optimizer: AdamW %.1f us per MiB of parameters\n", p.optimizer_us_per_mib);
  p.machine["emulate_link"] = a.emulate;
}

// --machine FILE: the machine's measurements (measure_machine's and the cores available) from an
// earlier profile of this machine under the same ranks, threads and link; refused otherwise.
Status machine_from(const ProfileArgs& a, CpuSetup& c, Profile& p) {
  OASES_ASSIGN_OR_RETURN(Profile from, load_profile(a.machine));
  auto refuse = [&](const std::string& why) { return error("--machine {}: {}", a.machine, why); };
  auto text = [](const nlohmann::json& m, const char* key) {  // a string field of `machine`, "(not recorded)" if none
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string("(not recorded)");
  };
  const std::string here = text(machine_description(a.ranks, c.threads), "host"), there = text(from.machine, "host");
  if (from.backend != "cpu") return refuse(fmt::format("a profile of backend {}, not cpu", from.backend));
  if (!from.has_device || from.collectives.empty()) return refuse("it has no measurements of the machine (device rates, collectives)");
  if (there != here) return refuse(fmt::format("a profile of host '{}', this is '{}'", there, here));
  if (from.ranks != a.ranks || from.threads_per_rank != c.threads)
    return refuse(fmt::format("measured for {} rank(s) of {} thread(s), not {} of {}", from.ranks, from.threads_per_rank, a.ranks, c.threads));
  if (text(from.machine, "emulate_link") != a.emulate)
    return refuse(fmt::format("measured with --emulate-link '{}', not '{}'", text(from.machine, "emulate_link"), a.emulate));
  p.backend = "cpu";
  p.machine = from.machine;
  p.machine.erase("calibrated_from");
  p.machine["measured_in"] = a.machine;
  p.ranks = a.ranks;
  p.threads_per_rank = c.threads;
  p.op_clock = profile_op_clock(c.threads);
  p.device = from.device;
  p.has_device = true;
  p.collectives = from.collectives;
  p.optimizer_us_per_mib = from.optimizer_us_per_mib;
  c.machine_given = true;
  c.available = {from.machine.value("cores_available", static_cast<double>(c.cores))};
  std::printf("machine: the device rates, %zu collective samples, the optimizer and the cores available (%.2f) of %s\n",
              p.collectives.size(), c.available[0], a.machine.c_str());
  return Status::ok();
}

// The mean of the cores-available samples into the profile, and the line saying so.
void record_available(const CpuSetup& c, Profile& p) {
  double avail = 0;
  for (double x : c.available) avail += x / static_cast<double>(c.available.size());
  p.machine["cores_available"] = std::min(avail, static_cast<double>(c.cores));
  std::printf("cores: %d, available to %d busy thread(s): %s (other work takes the rest)\n", c.cores, c.demand,
              fmt::format("{:.2f}", fmt::join(c.available, ", ")).c_str());
}

// What the model's program runs give: op samples, executor overheads, calibration runs, (tp, chunks) run.
struct ModelRuns {
  std::map<std::string, OpSample> ops;
  ExecutorOverheads overheads;
  std::vector<CalibrationRun> calib;
  nlohmann::json done = nlohmann::json::array();
};

// Runs rank 0's program for every tp degree and chunk count (plain schedule), plus interleaved
// runs for the calibration only (collectives beside computation, which the plain runs seldom
// have; their op samples and gaps are not kept).
Status run_model_programs(const ProfileArgs& a, CpuSetup& c, const PlanningModel& pm, const ModelAnalysis& an,
                          const std::vector<int64_t>& degrees, ModelRuns* runs) {
  const LinkModel link = c.link ? *c.link : LinkModel{};
  auto interleaved_run = [&](int64_t t, int64_t k) {
    std::map<std::string, OpSample> unused_ops;
    ExecutorOverheads unused_ovh;
    return measure_model_ops(pm.forward, pm.path, an, a.ranks, t, k, c.threads, a.reps, link, &unused_ops, &unused_ovh, &runs->calib,
                             "oases", a.comm_timeout);
  };
  for (int64_t t : degrees) {
    for (int64_t k : c.chunks) {
      if (k < 1 || pm.batch % (a.ranks / t * k) != 0) continue;
      auto t0 = Clock::now();
      OASES_RETURN_IF_ERROR(measure_model_ops(pm.forward, pm.path, an, a.ranks, t, k, c.threads, a.reps, link, &runs->ops, &runs->overheads,
                                              &runs->calib, "plain", a.comm_timeout));
      c.sample_cores();
      if (k > 1 && t > 1) OASES_RETURN_IF_ERROR(interleaved_run(t, k));  // with chunks, also the interleaved schedule
      std::printf("ops: tp %lld x dp %lld, %lld chunk(s): %.1f s\n", static_cast<long long>(t), static_cast<long long>(a.ranks / t),
                  static_cast<long long>(k), seconds_since(t0));
      runs->done.push_back({{"tp", t}, {"chunks", k}});
    }
    // without a chunked run above, one interleaved run at 2 chunks for the calibration
    bool interleaved = std::any_of(runs->done.begin(), runs->done.end(),
                                   [&](const nlohmann::json& d) { return d["tp"].get<int64_t>() == t && d["chunks"].get<int64_t>() > 1; });
    if (t > 1 && !interleaved && pm.batch % (a.ranks / t * 2) == 0) OASES_RETURN_IF_ERROR(interleaved_run(t, 2));
  }
  return Status::ok();
}

// Fits the executor's terms to the calibration runs and says how well the simulator then replays
// them.
Status calibrate_and_report(const ProfileArgs& a, const CpuSetup& c, const ModelRuns& runs, Profile& p) {
  std::vector<std::pair<double, double>> replayed;
  OASES_RETURN_IF_ERROR(calibrate_executor(runs.calib, a.emulate, c.threads, &p, &replayed));
  std::printf(
      "executor: the ranks turn %.1f%% of the %.2f free core(s) into work; a collective takes %.1f us beyond the link and the "
      "shared cores; a communication thread takes %.0f%% of a core beside computation\n",
      p.core_efficiency * 100, p.core_capacity(), p.comm_sync_us, p.comm_thread_share * 100);
  for (size_t i = 0; i < replayed.size(); ++i) {
    const CalibrationRun& r = runs.calib[i];
    std::printf(
        "executor: profiled run %zu (%s, tp %lld, %lld chunk(s), %lld rank(s) on %.2f free core(s), %d thread(s) each): measured %.1f ms, "
        "simulator %.1f ms (%+.1f%%)\n",
        i, r.schedule.c_str(), static_cast<long long>(r.tp), static_cast<long long>(r.chunks), static_cast<long long>(r.ranks),
        p.core_capacity(), c.threads, replayed[i].second / 1e3, replayed[i].first / 1e3,
        (replayed[i].first / replayed[i].second - 1) * 100);
  }
  std::printf("executor: %.1f us between instructions, %.1f us more after starting a collective (%lld starts timed)\n", p.instr_us,
              p.comm_start_us, static_cast<long long>(runs.overheads.starts));
  return Status::ok();
}

// --model: every op of the model's training at the shapes its plans produce, then the executor's
// calibration (errors name the model).
Status profile_model(const ProfileArgs& a, CpuSetup& c, Profile& p) {
  ImportOptions opts;
  OASES_RETURN_IF_ERROR(a.bind.apply(&opts));
  OASES_ASSIGN_OR_RETURN(PlanningModel pm, load_planning_model(a.model, opts, a.batch, a.seq));
  auto an = analyze_model(pm.forward, pm.train.graph, pm.train.params, a.ranks);
  if (!an) return an.status().with_context(a.model);
  OASES_ASSIGN_OR_RETURN(std::vector<int64_t> degrees, profiled_degrees(*an, parse_ints(a.degrees, "--degrees"), a.model, a.ranks));
  ModelRuns runs;
  OASES_RETURN_IF_ERROR(run_model_programs(a, c, pm, *an, degrees, &runs).with_context(a.model));
  // Every op shape the planner prices (planner/coverage.h: oases-plan's default space on these
  // ranks, its chunk counts widened by --chunks) that the runs did not time, timed alone: the
  // products the CPU fusion merged, the layouts, chunk counts and pipeline stages not run, the
  // whole-vocabulary ops that tp lowers
  PricingSpace space = default_pricing_space(a.ranks, c.chunks);
  auto priced = priced_ops(pm.forward, pm.train.graph, pm.train.params, *an, space);
  if (!priced) return priced.status().with_context(a.model);
  auto t0 = Clock::now();
  auto alone = measure_priced_ops(pm.train.graph, *priced, c.threads, a.reps, p.work_divisor(), &runs.ops);
  if (!alone) return alone.status().with_context(a.model);
  std::printf("ops: the planner prices %zu op shapes (tp %s, chunks %s, pipeline stages); %d not in the runs timed alone: %.1f s\n",
              priced->size(), fmt::format("{}", fmt::join(an->tp_candidates, ",")).c_str(),
              fmt::format("{}", fmt::join(space.search.chunks, ",")).c_str(), *alone, seconds_since(t0));
  for (auto& [k, s] : runs.ops) p.ops.push_back(s);
  const ExecutorOverheads& ovh = runs.overheads;
  if (ovh.instr_gaps > 0) p.instr_us = ovh.instr_gap_us / static_cast<double>(ovh.instr_gaps);
  if (ovh.starts > 0) p.comm_start_us = std::max(0.0, ovh.start_gap_us / static_cast<double>(ovh.starts) - p.instr_us);
  c.sample_cores();
  record_available(c, p);
  OASES_RETURN_IF_ERROR(calibrate_and_report(a, c, runs, p).with_context(a.model));
  if (!a.calibration.empty()) {
    // out of sample: the terms fitted to another model's (or configuration's) runs; this model's
    // runs gave only its op times
    OASES_ASSIGN_OR_RETURN(Profile from, load_profile(a.calibration));
    p.core_efficiency = from.core_efficiency;
    p.comm_sync_us = from.comm_sync_us;
    p.comm_beside_compute_us = from.comm_beside_compute_us;
    p.comm_thread_share = from.comm_thread_share;
    p.instr_us = from.instr_us;
    p.comm_start_us = from.comm_start_us;
    p.machine["calibrated_from"] = a.calibration;
    std::printf("executor: the fitted terms of %s instead (cores turned into work %.1f%%, %.1f us a collective, %.1f us between "
                "instructions, %.0f%% of a core a communication thread takes): this model's runs fitted nothing\n",
                a.calibration.c_str(), p.core_efficiency * 100, p.comm_sync_us, p.instr_us, p.comm_thread_share * 100);
  }
  nlohmann::json covers = {{"chunks", space.search.chunks}, {"op_shapes", priced->size()}};
  p.model = {{"path", a.model}, {"batch", pm.batch}, {"seq", pm.seq}, {"ranks", a.ranks}, {"profiled", runs.done}, {"covers", covers}};
  std::printf("ops: %zu distinct op shapes of %s\n", p.ops.size(), a.model.c_str());
  return Status::ok();
}

// --backend cpu: what the planner's cost model needs, measured on the machine at hand.
int profile_cpu(const ProfileArgs& a) {
  auto setup = cpu_setup(a);
  if (!setup) return fail_with(setup.status());
  CpuSetup& c = *setup;
  auto t_start = Clock::now();
  Profile p;
  // The cores the ranks get: measured with as many busy threads as the ranks run kernels (at
  // least the cores), before, between and after the model's runs (other work comes and goes).
  c.demand = std::max(c.cores, static_cast<int>(a.ranks) * c.threads);
  if (!a.machine.empty()) {
    if (a.model.empty()) return fail_with(error("--machine {} takes a profile's machine for --model's ops: give --model", a.machine));
    if (Status s = machine_from(a, c, p); !s.is_ok()) return fail_with(s);
  } else {
    measure_machine(a, c, p);
  }
  c.sample_cores();
  if (!a.model.empty()) {
    if (Status s = profile_model(a, c, p); !s.is_ok()) return fail_with(s);
  } else {
    record_available(c, p);
  }
  if (Status s = write_file_atomically(a.out, p.to_json().dump(1) + "\n"); !s.is_ok()) return fail_with(s);
  std::printf("wrote %s in %.1f s\n", a.out.c_str(), seconds_since(t_start));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-profile: measure op and collective times on this machine for the planner"};
    ProfileArgs a;
    add_profile_options(app, a);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    a.ranks_given = app.count("--ranks") > 0;
    return a.backend == "cuda" ? profile_gpu(a) : profile_cpu(a);
  });
}
