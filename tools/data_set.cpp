#include "tools/data_set.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>

#include <fmt/ranges.h>

#include "executor/executor.h"

namespace fs = std::filesystem;

namespace oases {

std::vector<std::string> numbered_files(const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<int, std::string>> found;
  std::regex re(prefix + "_([0-9]{1,9})\\.pb");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) found.push_back({std::stoi(m[1]), e.path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [i, p] : found) out.push_back(p);
  return out;
}

Expected<std::vector<std::pair<std::string, Tensor>>> read_numbered_tensors(const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& f : numbered_files(dir, prefix)) {
    OASES_ASSIGN_OR_RETURN(auto t, read_tensor_file(f));
    out.push_back(std::move(t));
  }
  return out;
}

Expected<std::map<std::string, Tensor>> match_model_inputs(const std::string& model,
                                                           const std::vector<std::pair<std::string, Tensor>>& given,
                                                           const std::string& data_set, const ImportOptions& opts) {
  ImportOptions probe_opts = opts;
  probe_opts.require_bound_dims = false;
  OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(model, probe_opts));
  std::vector<std::string> input_names;
  for (ValueId v : probe.inputs()) input_names.push_back(probe.value(v).name);
  std::map<std::string, Tensor> feeds;
  std::vector<std::string> files = numbered_files(data_set, "input");
  for (size_t i = 0; i < given.size(); ++i) {
    const std::string& nm = given[i].first;
    std::string file = i < files.size() ? files[i] : fmt::format("{}/input_{}.pb", data_set, i);
    bool by_name = std::find(input_names.begin(), input_names.end(), nm) != input_names.end();
    std::string target;
    if (by_name) {
      target = nm;
    } else if (i < input_names.size()) {
      target = input_names[i];
    } else {
      return error("{}: '{}' matches no input of the model", file, nm);
    }
    // types and fixed dims must agree with the model's input (symbolic dims take any size)
    const Tensor& t = given[i].second;
    const Value& want = probe.value(probe.find_value(target));
    bool fits = t.dtype() == want.dtype && (!want.has_shape || t.shape().size() == want.shape.size());
    for (size_t d = 0; fits && want.has_shape && d < want.shape.size(); ++d) fits = want.shape[d] < 0 || want.shape[d] == t.shape()[d];
    if (!fits) {
      std::vector<std::string> dims;  // sizes, or the symbolic names the model gives
      for (size_t d = 0; d < want.shape.size(); ++d) {
        bool named = d < want.dim_names.size() && !want.dim_names[d].empty();
        dims.push_back(want.shape[d] >= 0 ? std::to_string(want.shape[d]) : named ? want.dim_names[d] : "?");
      }
      std::string expected = want.has_shape ? fmt::format("[{}]", fmt::join(dims, ", ")) : "[?]";
      return error("{}: gives input '{}' as {}{}, the model expects {}{}", file, target, dtype_name(t.dtype()), shape_str(t.shape()),
                   dtype_name(want.dtype), expected);
    }
    feeds[target] = t;
  }
  for (const auto& nm : input_names) {
    if (!feeds.count(nm)) return error("{}: no input_N.pb gives the model input '{}'", data_set, nm);
  }
  return feeds;
}

namespace {

// Keeps only the feeds that are still graph inputs.
void drop_fed_constants(const Graph& g, std::map<std::string, Tensor>* feeds) {
  for (auto it = feeds->begin(); it != feeds->end();) {
    ValueId v = g.find_value(it->first);
    it = v != kNoId && g.value(v).is_input ? std::next(it) : feeds->erase(it);
  }
}

}  // namespace

Expected<FedModel> load_model_for_feeds(const std::string& path, ImportOptions opts, std::map<std::string, Tensor>* feeds) {
  for (auto& [nm, t] : *feeds) {
    if (!opts.input_shapes.count(nm)) opts.input_shapes[nm] = t.shape();
  }
  FedModel fm;
  auto m = load_model(path, opts);
  if (m) {
    fm.model = std::move(*m);
    drop_fed_constants(fm.model.graph, feeds);
    return fm;
  }
  // Shapes that depend on the values of inputs: specialise the model to its small integer inputs
  // and single-element ones (OneHot's depth, Range's limits may be floating scalars).
  Status first = m.status();
  auto raw = import_onnx_file(path, opts);
  if (!raw) return first;
  bool any = false;
  for (auto& [nm, t] : *feeds) {
    ValueId v = raw->find_value(nm);
    if (v != kNoId && ((is_integer(t.dtype()) && t.numel() <= 64) || t.numel() == 1)) {
      raw->remove_input(v);
      raw->set_constant(v, t);
      any = true;
    }
  }
  if (!any) return first;
  fm.model.raw = *raw;
  fm.model.graph = *raw;
  static CpuEvaluator evaluator;
  FoldOptions fold;
  fold.evaluator = &evaluator;
  auto reports = run_canonical_passes(fm.model.graph, fold);
  if (!reports) return first;
  fm.model.reports = *reports;
  fm.specialised = true;
  drop_fed_constants(fm.model.graph, feeds);
  return fm;
}

TensorComparison compare_tensors(const Tensor& got, const Tensor& want, double rtol, double atol) {
  TensorComparison c;
  if (got.dtype() != want.dtype()) {
    c.problem = fmt::format("type {} but expected {}", dtype_name(got.dtype()), dtype_name(want.dtype()));
    return c;
  }
  if (got.shape() != want.shape()) {
    c.problem = fmt::format("shape {} but expected {}", shape_str(got.shape()), shape_str(want.shape()));
    return c;
  }
  const int64_t n = got.numel();
  if (!is_floating(got.dtype())) {
    const size_t es = dtype_size(got.dtype());
    const char* a = static_cast<const char*>(got.raw());
    const char* b = static_cast<const char*>(want.raw());
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(a + i * es, b + i * es, es) == 0) continue;
      double d = std::abs(load_as_double(a, got.dtype(), i) - load_as_double(b, want.dtype(), i));
      c.max_abs = std::max(c.max_abs, d);
      if (c.first_bad < 0) c.first_bad = i;
      ++c.bad;
    }
    return c;
  }
  for (int64_t i = 0; i < n; ++i) {
    double a = load_as_double(got.raw(), got.dtype(), i), b = load_as_double(want.raw(), want.dtype(), i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) continue;
    double d = std::abs(a - b);
    if (std::isnan(d)) d = INFINITY;
    c.max_abs = std::max(c.max_abs, d);
    if (b != 0) c.max_rel = std::max(c.max_rel, d / std::abs(b));
    if (!(d <= atol + rtol * std::abs(b))) {  // a NaN tolerance fails, never passes
      if (c.first_bad < 0) c.first_bad = i;
      ++c.bad;
    }
  }
  return c;
}

}  // namespace oases
