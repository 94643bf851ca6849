// oases-run MODEL --data-set DIR [--rtol R] [--atol A] [--write-outputs DIR]
// Runs the forward pass on inputs in the ONNX test-data layout and compares with the expected
// outputs. Exit 0 within tolerance, 1 on a mismatch, 2 on an error.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>

#include <fmt/ranges.h>

#include "executor/executor.h"
#include "tools/model_loader.h"

using namespace oases;
namespace fs = std::filesystem;

namespace {

// input_N.pb / output_N.pb files of a data set, in N order.
std::vector<std::string> numbered_files(const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<int, std::string>> found;
  std::regex re(prefix + "_([0-9]{1,9})\\.pb");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) found.push_back({std::stoi(m[1]), e.path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [i, p] : found) out.push_back(p);
  return out;
}

struct Comparison {
  double max_abs = 0, max_rel = 0;
  int64_t bad = 0;
  std::string problem;
};

Comparison compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  Comparison c;
  if (got.dtype() != want.dtype()) {
    c.problem = fmt::format("type {} but expected {}", dtype_name(got.dtype()), dtype_name(want.dtype()));
    return c;
  }
  if (got.shape() != want.shape()) {
    c.problem = fmt::format("shape {} but expected {}", shape_str(got.shape()), shape_str(want.shape()));
    return c;
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    double a = load_as_double(got.raw(), got.dtype(), i), b = load_as_double(want.raw(), want.dtype(), i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) continue;
    double d = std::abs(a - b);
    if (std::isnan(d)) d = INFINITY;
    c.max_abs = std::max(c.max_abs, d);
    if (b != 0) c.max_rel = std::max(c.max_rel, d / std::abs(b));
    if (d > atol + rtol * std::abs(b)) ++c.bad;
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  return run_tool([&] {
    CLI::App app{"oases-run: run a model's forward pass on ONNX test data and compare"};
    std::string model, data_set, write_dir;
    double rtol = 1e-4, atol = 1e-5;
    int repeat = 1;
    bool verbose = false;
    BindingFlags bind;
    app.add_option("model", model, "ONNX model file")->required();
    app.add_option("--data-set", data_set, "Folder with input_N.pb (and output_N.pb to compare with)")->required();
    app.add_option("--rtol", rtol, "Relative tolerance (default 1e-4)");
    app.add_option("--atol", atol, "Absolute tolerance (default 1e-5)");
    app.add_option("--write-outputs", write_dir, "Write the outputs as output_N.pb into DIR");
    app.add_option("--repeat", repeat, "Run the forward pass N times and report the mean time");
    app.add_flag("-v,--verbose", verbose, "Say more");
    bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    if (!fs::exists(data_set)) return fail_with(error("{}: no such folder", data_set));
    if (!fs::is_directory(data_set)) return fail_with(error("{}: not a folder (--data-set wants the folder of input_N.pb)", data_set));

    // inputs: matched to the model's inputs by name, else by position
    std::vector<std::pair<std::string, Tensor>> given;
    std::vector<std::string> given_files;
    for (const auto& f : numbered_files(data_set, "input")) {
      auto t = read_tensor_file(f);
      if (!t) return fail_with(t.status());
      given.push_back(*t);
      given_files.push_back(f);
    }
    ImportOptions probe_opts;
    probe_opts.require_bound_dims = false;
    auto probe = import_onnx_file(model, probe_opts);
    if (!probe) return fail_with(probe.status());
    std::vector<std::string> input_names;
    for (ValueId v : probe->inputs()) input_names.push_back(probe->value(v).name);
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < given.size(); ++i) {
      const std::string& nm = given[i].first;
      bool by_name = std::find(input_names.begin(), input_names.end(), nm) != input_names.end();
      std::string target;
      if (by_name) {
        target = nm;
      } else if (i < input_names.size()) {
        target = input_names[i];
      } else {
        return fail_with(error("{}: '{}' matches no input of the model", given_files[i], nm));
      }
      // Types and fixed dims must agree with the model's input (symbolic dims take any size).
      const Tensor& t = given[i].second;
      const Value& want = probe->value(probe->find_value(target));
      bool fits = t.dtype() == want.dtype && (!want.has_shape || t.shape().size() == want.shape.size());
      for (size_t d = 0; fits && d < want.shape.size(); ++d) fits = want.shape[d] < 0 || want.shape[d] == t.shape()[d];
      if (!fits) {
        std::vector<std::string> dims;  // sizes, or the symbolic names the model gives
        for (size_t d = 0; d < want.shape.size(); ++d) {
          bool named = d < want.dim_names.size() && !want.dim_names[d].empty();
          dims.push_back(want.shape[d] >= 0 ? std::to_string(want.shape[d]) : named ? want.dim_names[d] : "?");
        }
        std::string expected = want.has_shape ? fmt::format("[{}]", fmt::join(dims, ", ")) : "[?]";
        return fail_with(error("{}: gives input '{}' as {}{}, the model expects {}{}", given_files[i], target,
                               dtype_name(t.dtype()), shape_str(t.shape()), dtype_name(want.dtype), expected));
      }
      feeds[target] = t;
    }
    for (const auto& nm : input_names) {
      if (!feeds.count(nm)) return fail_with(error("{}: no input_N.pb gives the model input '{}'", data_set, nm));
    }
    ImportOptions opts;
    if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
    for (auto& [nm, t] : feeds) {
      if (!opts.input_shapes.count(nm)) opts.input_shapes[nm] = t.shape();
    }
    auto m = load_model(model, opts);
    if (!m) {
      // Shapes that depend on the values of small integer inputs: specialise the model to them.
      Status first = m.status();
      auto raw = import_onnx_file(model, opts);
      if (!raw) return fail_with(first);
      bool any = false;
      for (auto& [nm, t] : feeds) {
        ValueId v = raw->find_value(nm);
        if (v != kNoId && is_integer(t.dtype()) && t.numel() <= 64) {
          raw->remove_input(v);
          raw->set_constant(v, t);
          any = true;
        }
      }
      if (!any) return fail_with(first);
      LoadedModel lm;
      lm.raw = *raw;
      lm.graph = *raw;
      static CpuEvaluator ev;
      FoldOptions fo;
      fo.evaluator = &ev;
      auto rep = run_canonical_pipeline(lm.graph, fo);
      if (!rep) return fail_with(first);
      if (verbose) std::printf("note: specialised the model to the values of its small integer inputs\n");
      m = std::move(lm);
    }
    for (auto it = feeds.begin(); it != feeds.end();) {
      it = m->graph.find_value(it->first) != kNoId && m->graph.value(m->graph.find_value(it->first)).is_input ? std::next(it) : feeds.erase(it);
    }
    auto ex = Executor::create(m->graph);
    if (!ex) return fail_with((*&ex).status().with_context(model));
    double ms = 0;
    std::vector<Tensor> outs;
    for (int r = 0; r < std::max(1, repeat); ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto o = (*ex)->run(feeds);
      ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!o) return fail_with(o.status().with_context(model));
      outs = *o;
    }
    ms /= std::max(1, repeat);
    const Graph& g = (*ex)->graph();
    std::printf("ran %s: %zu nodes in %.2f ms (arena %.1f MiB, %.1f MiB without reuse)\n", model.c_str(), g.num_nodes(), ms,
                static_cast<double>((*ex)->program().memory.arena_bytes) / (1 << 20),
                static_cast<double>((*ex)->program().memory.total_bytes) / (1 << 20));

    if (!write_dir.empty()) {
      std::error_code ec;
      fs::create_directories(write_dir, ec);
      for (size_t i = 0; i < outs.size(); ++i) {
        Status s = write_tensor_file(outs[i], g.value(g.outputs()[i]).name, fmt::format("{}/output_{}.pb", write_dir, i));
        if (!s.is_ok()) return fail_with(s);
      }
    }
    // expected outputs, matched by name else position
    auto expected_files = numbered_files(data_set, "output");
    if (expected_files.empty()) {
      for (size_t i = 0; i < outs.size(); ++i) {
        std::printf("output %s: %s%s\n", g.value(g.outputs()[i]).name.c_str(), dtype_name(outs[i].dtype()), shape_str(outs[i].shape()).c_str());
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
      Comparison c = compare(outs[idx], e->second, rtol, atol);
      const std::string& name = g.value(g.outputs()[idx]).name;
      if (!c.problem.empty()) {
        std::printf("output %-24s MISMATCH: %s\n", name.c_str(), c.problem.c_str());
        all_ok = false;
        continue;
      }
      bool ok = c.bad == 0;
      all_ok &= ok;
      std::printf("output %-24s %s  max abs err %.3g  max rel err %.3g%s\n", name.c_str(), ok ? "ok      " : "MISMATCH", c.max_abs,
                  c.max_rel, ok ? "" : fmt::format("  ({} of {} elements outside rtol {} atol {})", c.bad, outs[idx].numel(), rtol, atol).c_str());
    }
    return all_ok ? 0 : 1;
  });
}
