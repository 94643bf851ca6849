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

#include <fmt/ranges.h>

#include "executor/cpu/blas_select.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/notes.h"
#include "executor/profile_report.h"
#include "graph/atomic_file.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/parallel.h"
#include "tools/data_set.h"

using namespace oases;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-run: run a model's forward pass on ONNX test data and compare"};
    std::string model, data_set, write_dir;
    double rtol = 1e-4, atol = 1e-5;
    int repeat = 1, warmup = 0, threads = 0;
    bool verbose = false, profile = false;
    std::string device = "cpu";
    BindingFlags bind;
    app.add_option("model", model, "ONNX model file")->required();
    app.add_option("--data-set", data_set, "Folder with input_N.pb (and output_N.pb to compare with)")->required();
    // NaN would make every comparison false, i.e. pass anything; infinity likewise.
    auto tolerance = CLI::Validator(
        [](std::string& s) -> std::string {
          double v = std::strtod(s.c_str(), nullptr);
          return std::isfinite(v) && v >= 0 ? "" : "must be a finite number >= 0, got " + s;
        },
        "TOLERANCE");
    app.add_option("--rtol", rtol, "Relative tolerance (default 1e-4)")->check(tolerance);
    app.add_option("--atol", atol, "Absolute tolerance (default 1e-5)")->check(tolerance);
    app.add_option("--write-outputs", write_dir, "Write the outputs as output_N.pb into DIR");
    app.add_option("--repeat", repeat, "Run the forward pass N times and report the median time");
    app.add_option("--warmup", warmup, "Untimed runs before the timed ones");
    app.add_option("--threads", threads, "Threads for BLAS and kernels (0: OpenMP/OpenBLAS defaults)")
        ->check(CLI::Range(0, kernels::kMaxThreads));
    app.add_option("--device", device, "cpu | cuda (the GPU backend, GPU 0: docs/GPU.md)")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_flag("--profile", profile, "Print the time per op type (summed over the timed runs)");
    app.add_flag("-v,--verbose", verbose, "Say more (also which kernel paths ran and why others were not taken)");
    bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    set_verbose_notes(verbose);
    if (device == "cuda") {
      if (Status s = cuda_select_device(0); !s.is_ok()) return fail_with(s);
    }
    if (!fs::exists(data_set)) return fail_with(error("{}: no such folder", data_set));
    if (!fs::is_directory(data_set)) return fail_with(error("{}: not a folder (--data-set wants the folder of input_N.pb)", data_set));
    if (!write_dir.empty()) {
      if (Status s = check_output_folder(write_dir, "--write-outputs " + write_dir); !s.is_ok()) return fail_with(s);
    }

    // inputs: matched to the model's inputs by name, else by position
    auto given = read_numbered_tensors(data_set, "input");
    if (!given) return fail_with(given.status());
    ImportOptions opts;
    if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
    auto feeds = match_model_inputs(model, *given, data_set, opts);
    if (!feeds) return fail_with(feeds.status());
    auto fed = load_model_for_feeds(model, opts, &*feeds);
    if (!fed) return fail_with(fed.status());
    if (fed->specialised && verbose) std::printf("note: specialised the model to the values of its small integer inputs\n");
    LoadedModel* m = &fed->model;
    ExecOptions eo;
    eo.threads = threads;
    eo.device = device;
    auto ex = Executor::create(m->graph, eo);
    if (!ex) return fail_with((*&ex).status().with_context(model));
    (*ex)->set_profiling(profile);
    std::vector<double> times;
    ProfileReport prof;
    for (int r = 0; r < std::max(0, warmup); ++r) {
      if (Status s = (*ex)->execute(*feeds); !s.is_ok()) return fail_with(s.with_context(model));
    }
    for (int r = 0; r < std::max(1, repeat); ++r) {
      auto t0 = std::chrono::steady_clock::now();
      Status s = (*ex)->execute(*feeds);
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (!s.is_ok()) return fail_with(s.with_context(model));
      if (profile) prof.add(**ex);
    }
    std::vector<Tensor> outs;
    for (ValueId v : (*ex)->graph().outputs()) outs.push_back((*ex)->read(v));
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    size_t nt = sorted.size();
    double ms = nt % 2 ? sorted[nt / 2] : 0.5 * (sorted[nt / 2 - 1] + sorted[nt / 2]);
    const Graph& g = (*ex)->graph();
    std::printf("ran %s: %zu nodes in %.2f ms (arena %.1f MiB, %.1f MiB without reuse)\n", model.c_str(), g.num_nodes(), ms,
                static_cast<double>((*ex)->program().memory.arena_bytes) / (1 << 20),
                static_cast<double>((*ex)->program().memory.total_bytes) / (1 << 20));
    if (verbose) {
      std::printf("blas: %s; %s; %d kernel threads\n", blas_core_report().c_str(), kernels::blas_config().c_str(), kernels::num_threads());
    }
    if (repeat > 1) {
      std::string all;
      for (double t : times) all += fmt::format(" {:.2f}", t);
      std::printf("timing: median %.3f ms, min %.3f ms, max %.3f ms over %zu runs (after %d warm-up); runs:%s\n", ms, sorted.front(),
                  sorted.back(), nt, std::max(0, warmup), all.c_str());
    }
    if (profile) prof.print(**ex, "run", 10);

    if (!write_dir.empty()) {
      std::error_code ec;
      fs::create_directories(write_dir, ec);
      if (ec) return fail_with(error("--write-outputs {}: cannot create the folder: {}", write_dir, ec.message()));
      for (size_t i = 0; i < outs.size(); ++i) {
        Status s = write_tensor_file(outs[i], g.value(g.outputs()[i]).name, fmt::format("{}/output_{}.pb", write_dir, i));
        if (!s.is_ok()) return fail_with(s);
      }
    }
    // expected outputs, matched by name else position
    auto expected_files = numbered_files(data_set, "output");
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
      if (!e) return fail_with(e.status());
      size_t idx = i;
      for (size_t j = 0; j < g.outputs().size(); ++j) {
        if (g.value(g.outputs()[j]).name == e->first) idx = j;
      }
      if (idx >= outs.size()) return fail_with(error("{}: output_{}.pb matches no output of the model", data_set, i));
      TensorComparison c = compare_tensors(outs[idx], e->second, rtol, atol);
      const std::string& name = g.value(g.outputs()[idx]).name;
      if (!c.problem.empty()) {
        std::printf("output %-24s MISMATCH: %s\n", name.c_str(), c.problem.c_str());
        all_ok = false;
        continue;
      }
      bool ok = c.bad == 0;
      all_ok &= ok;
      std::printf("output %-24s %s  max abs err %.3g  max rel err %.3g%s\n", name.c_str(), ok ? "ok      " : "MISMATCH", c.max_abs,
                  c.max_rel,
                  ok ? "" : fmt::format("  ({} of {} elements outside rtol {} atol {})", c.bad, outs[idx].numel(), rtol, atol).c_str());
    }
    return all_ok ? 0 : 1;
  });
}
