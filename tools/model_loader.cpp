#include "tools/model_loader.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "executor/cpu/blas_select.h"
#include "executor/cpu_evaluator.h"
#include "kernels/cpu/blas_core.h"

namespace oases {

Expected<LoadedModel> load_model(const std::string& path, const ImportOptions& opts) {
  LoadedModel m;
  OASES_ASSIGN_OR_RETURN(m.raw, import_onnx_file(path, opts));
  Status sup = check_supported(m.raw);
  if (!sup.is_ok()) return sup.with_context(path);
  m.graph = m.raw;
  static CpuEvaluator evaluator;
  FoldOptions fold;
  fold.evaluator = &evaluator;
  auto reports = run_canonical_passes(m.graph, fold);
  if (!reports) return reports.status().with_context(path);
  m.reports = *reports;
  return m;
}

Expected<uint64_t> parse_byte_size(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return error("'{}' is not a byte count (e.g. 512M, 8G)", text);
  }
  std::string unit = text.substr(used);
  if (unit.size() > 1 && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();  // 8GB, 8GiB
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();
  static const std::string kUnits = "KMGT";
  double scale = 1;
  if (!unit.empty()) {
    size_t power = unit.size() == 1 ? kUnits.find(static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])))) : std::string::npos;
    if (power == std::string::npos) return error("'{}' is not a byte count (e.g. 512M, 8G)", text);
    scale = std::ldexp(1.0, 10 * static_cast<int>(power + 1));
  }
  double bytes = v * scale;
  // 2^63: far above any machine, and the largest value that converts to uint64 without overflow
  if (!std::isfinite(bytes) || bytes < 1 || bytes >= 9.2e18) return error("byte count '{}' must be at least 1 and finite", text);
  return static_cast<uint64_t>(bytes);
}

void BindingFlags::add_to(CLI::App& app) {
  app.add_option("--max-memory", max_memory, "Largest tensor or activation arena to allocate, e.g. 8G (default: half the machine's RAM)");
  app.add_option("--dim", dims, "Bind a symbolic dimension, NAME=N (repeatable)");
  app.add_option("--shape", shapes, "Fix an input's shape, INPUT=d0,d1,... (repeatable)");
  app.add_flag("--allow-older-opset", allow_older_opsets,
               "Read a model below opset 13 when every op in it is unchanged since (or known in its older form)");
}

Status BindingFlags::apply(ImportOptions* opts) const {
  opts->allow_older_opsets = allow_older_opsets;
  if (!max_memory.empty()) {
    auto bytes = parse_byte_size(max_memory);
    if (!bytes) return error("--max-memory: {}", bytes.status().message());
    set_max_memory_bytes(*bytes);
  }
  for (const auto& d : dims) OASES_RETURN_IF_ERROR(parse_dim_binding(d, opts));
  for (const auto& s : shapes) OASES_RETURN_IF_ERROR(parse_shape_binding(s, opts));
  return Status::ok();
}

int fail_with(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return 2;
}

int run_tool(const std::function<int()>& body) {
  try {
    return body();
  } catch (const OasesError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 2;
}

std::string version_text(const std::string& program) {
  std::string name = program.substr(program.find_last_of('/') + 1);
  return fmt::format("{} (Oases {})\n{}\n{}", name, OASES_VERSION, blas_core_report(), kernels::blas_config());
}

int parse_cli(CLI::App& app, int argc, char** argv) {
  app.set_version_flag(
      "--version", [&app] { return version_text(app.get_name()); }, "Print the version and the OpenBLAS core in use");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    std::printf("%s", app.help("", CLI::AppFormatMode::All).c_str());
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return -1;
}

}  // namespace oases
