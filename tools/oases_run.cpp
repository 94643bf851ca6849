// oases-run MODEL --data-set DIR [--rtol R] [--atol A] [--write-outputs DIR]
//           [--repeat N] [--warmup W] [--threads T] [--profile]
// Runs the forward pass on inputs in the ONNX test-data layout and compares with the expected
// outputs. Exit 0 within tolerance, 1 on a mismatch, 2 on an error. With --repeat it times N runs
// (after W untimed ones) and prints their median; --profile adds the time per op type.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include "executor/cpu/blas_select.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/node_time_report.h"
#include "executor/notes.h"
#include "graph/atomic_file.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/parallel.h"
#include "tools/data_set.h"

using namespace oases;
namespace fs = std::filesystem;

namespace {

struct RunArgs {
  std::string model, data_set, write_dir;
  double rtol = 1e-4, atol = 1e-5;
  int repeat = 1, warmup = 0, threads = 0;
  bool verbose = false, profile = false;
  std::string device = "cpu";
  BindingFlags bind;
};

void add_run_options(CLI::App& app, RunArgs& a) {
  app.add_option("model", a.model, "ONNX model file")->required();
  app.add_option("--data-set", a.data_set, "Folder with input_N.pb (and output_N.pb to compare with)")->required();
  // NaN would make every comparison false, i.e. pass anything; infinity likewise.
  auto tolerance = CLI::Validator(
      [](std::string& s) -> std::string {
        double v = std::strtod(s.c_str(), nullptr);
        return std::isfinite(v) && v >= 0 ? "" : "must be a finite number >= 0, got " + s;
      },
      "TOLERANCE");
  app.add_option("--rtol", a.rtol, "Relative tolerance (default 1e-4)")->check(tolerance);
  app.add_option("--atol", a.atol, "Absolute tolerance (default 1e-5)")->check(tolerance);
  app.add_option("--write-outputs", a.write_dir, "Write the outputs as output_N.pb into DIR");
  app.add_option("--repeat", a.repeat, "Run the forward pass N times and report the median time");
  app.add_option("--warmup", a.warmup, "Untimed runs before the timed ones");
  app.add_option("--threads", a.threads, "Threads for BLAS and kernels (0: OpenMP/OpenBLAS defaults)")
      ->check(CLI::Range(0, kernels::kMaxThreads));
  app.add_option("--device", a.device, "cpu | cuda (the GPU backend, GPU 0: docs/GPU.md)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--profile", a.profile, "Print the time per op type (summed over the timed runs)");
  app.add_flag("-v,--verbose", a.verbose, "Say more (also which kernel paths ran and why others were not taken)");
  a.bind.add_to(app);
}

// The device, the data-set folder and the output folder, checked before anything loads.
Status check_run_args(const RunArgs& a) {
  if (a.device == "cuda") OASES_RETURN_IF_ERROR(cuda_select_device(0));
  if (!fs::exists(a.data_set)) return error("{}: no such folder", a.data_set);
  if (!fs::is_directory(a.data_set)) return error("{}: not a folder (--data-set wants the folder of input_N.pb)", a.data_set);
  if (!a.write_dir.empty()) OASES_RETURN_IF_ERROR(check_output_folder(a.write_dir, "--write-outputs " + a.write_dir));
  return Status::ok();
}

// The warm-up runs, then the timed ones: their times in ms (each run's op times into `prof` with
// --profile).
Expected<std::vector<double>> run_timed(Executor& ex, const std::map<std::string, Tensor>& feeds, const RunArgs& a, NodeTimeReport* prof) {
  for (int r = 0; r < std::max(0, a.warmup); ++r) OASES_RETURN_IF_ERROR(ex.execute(feeds).with_context(a.model));
  std::vector<double> times;
  for (int r = 0; r < std::max(1, a.repeat); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = ex.execute(feeds);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!s.is_ok()) return s.with_context(a.model);
    if (a.profile) prof->add(ex);
  }
  return times;
}

// "ran MODEL: N nodes in T ms (arena ...)", the BLAS setup with -v, the timing line with --repeat.
void print_timing(const Executor& ex, const RunArgs& a, const std::vector<double>& times) {
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  size_t nt = sorted.size();
  double ms = nt % 2 ? sorted[nt / 2] : 0.5 * (sorted[nt / 2 - 1] + sorted[nt / 2]);
  std::printf("ran %s: %zu nodes in %.2f ms (arena %.1f MiB, %.1f MiB without reuse)\n", a.model.c_str(), ex.graph().num_nodes(), ms,
              static_cast<double>(ex.program().memory.arena_bytes) / (1 << 20),
              static_cast<double>(ex.program().memory.total_bytes) / (1 << 20));
  if (a.verbose) {
    std::printf("blas: %s; %s; %d kernel threads\n", blas_core_report().c_str(), kernels::blas_config().c_str(), kernels::num_threads());
  }
  if (a.repeat > 1) {
    std::string all;
    for (double t : times) all += fmt::format(" {:.2f}", t);
    std::printf("timing: median %.3f ms, min %.3f ms, max %.3f ms over %zu runs (after %d warm-up); runs:%s\n", ms, sorted.front(),
                sorted.back(), nt, std::max(0, a.warmup), all.c_str());
  }
}

Status write_outputs(const Graph& g, const std::vector<Tensor>& outs, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error("--write-outputs {}: cannot create the folder: {}", dir, ec.message());
  for (size_t i = 0; i < outs.size(); ++i) {
    OASES_RETURN_IF_ERROR(write_tensor_file(outs[i], g.value(g.outputs()[i]).name, fmt::format("{}/output_{}.pb", dir, i)));
  }
  return Status::ok();
}

// Compares the outputs with the data set's output_N.pb (matched by name, else position), one line
// each: 0 when all are within tolerance, 1 on a mismatch. Without expected outputs it lists the
// outputs' types and shapes (0).
Expected<int> compare_outputs(const Graph& g, const std::vector<Tensor>& outs, const RunArgs& a) {
  auto expected_files = numbered_files(a.data_set, "output");
  if (expected_files.empty()) {
    for (size_t i = 0; i < outs.size(); ++i) {
      std::printf("output %s: %s%s\n", g.value(g.outputs()[i]).name.c_str(), dtype_name(outs[i].dtype()),
                  shape_str(outs[i].shape()).c_str());
    }
    return 0;
  }
  bool all_ok = true;
  for (size_t i = 0; i < expected_files.size(); ++i) {
    auto e = read_tensor_file(expected_files[i]);
    if (!e) return e.status();
    size_t idx = i;
    for (size_t j = 0; j < g.outputs().size(); ++j) {
      if (g.value(g.outputs()[j]).name == e->first) idx = j;
    }
    if (idx >= outs.size()) return error("{}: output_{}.pb matches no output of the model", a.data_set, i);
    TensorComparison c = compare_tensors(outs[idx], e->second, a.rtol, a.atol);
    const std::string& name = g.value(g.outputs()[idx]).name;
    if (!c.problem.empty()) {
      std::printf("output %-24s MISMATCH: %s\n", name.c_str(), c.problem.c_str());
      all_ok = false;
      continue;
    }
    bool ok = c.bad == 0;
    all_ok &= ok;
    std::printf("output %-24s %s  max abs err %.3g  max rel err %.3g%s\n", name.c_str(), ok ? "ok      " : "MISMATCH", c.max_abs, c.max_rel,
                ok ? "" : fmt::format("  ({} of {} elements outside rtol {} atol {})", c.bad, outs[idx].numel(), a.rtol, a.atol).c_str());
  }
  return all_ok ? 0 : 1;
}

int run(const RunArgs& a) {
  set_verbose_notes(a.verbose);
  if (Status s = check_run_args(a); !s.is_ok()) return fail_with(s);
  // inputs: matched to the model's inputs by name, else by position
  auto given = read_numbered_tensors(a.data_set, "input");
  if (!given) return fail_with(given.status());
  ImportOptions opts;
  if (Status s = a.bind.apply(&opts); !s.is_ok()) return fail_with(s);
  auto feeds = match_model_inputs(a.model, *given, a.data_set, opts);
  if (!feeds) return fail_with(feeds.status());
  auto fed = load_model_for_feeds(a.model, opts, &*feeds);
  if (!fed) return fail_with(fed.status());
  if (fed->specialised && a.verbose) std::printf("note: specialised the model to the values of its small integer inputs\n");
  ExecOptions eo;
  eo.threads = a.threads;
  eo.device = a.device;
  auto ex = Executor::create(fed->model.graph, eo);
  if (!ex) return fail_with(ex.status().with_context(a.model));
  (*ex)->set_node_timing(a.profile);
  NodeTimeReport prof;
  auto times = run_timed(**ex, *feeds, a, &prof);
  if (!times) return fail_with(times.status());
  std::vector<Tensor> outs;
  for (ValueId v : (*ex)->graph().outputs()) outs.push_back((*ex)->read(v));
  print_timing(**ex, a, *times);
  if (a.profile) prof.print(**ex, "run", 10);
  if (!a.write_dir.empty()) {
    if (Status s = write_outputs((*ex)->graph(), outs, a.write_dir); !s.is_ok()) return fail_with(s);
  }
  auto rc = compare_outputs((*ex)->graph(), outs, a);
  return rc ? *rc : fail_with(rc.status());
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-run: run a model's forward pass on ONNX test data and compare"};
    RunArgs a;
    add_run_options(app, a);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    return run(a);
  });
}
