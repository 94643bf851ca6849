// Shared by the oases-* tools: loading a model into a canonical graph, the common command-line
// options, and the error convention (one line `error: …`, exit code 2).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graph/passes/pass.h"
#include "importer/onnx_import.h"

namespace CLI {
class App;  // CLI11 (<CLI/CLI.hpp>) only where a tool's options are built: it costs seconds a unit
}  // namespace CLI

namespace oases {

struct LoadedModel {
  Graph raw;    // as imported (before passes)
  Graph graph;  // canonical
  std::vector<PassReport> reports;
};

// Imports `path` and runs the canonical pipeline (constant folding with the CPU kernels).
Expected<LoadedModel> load_model(const std::string& path, const ImportOptions& opts);

// Parses a byte count with an optional binary suffix: "512", "64K", "1.5G", "2GiB" (K, M, G, T).
Expected<uint64_t> parse_byte_size(const std::string& text);

// --dim NAME=N and --shape INPUT=d0,d1 (repeatable), and --max-memory BYTES (the limit every
// tensor and the activation arena must fit in; apply() sets it for the whole process).
struct BindingFlags {
  std::vector<std::string> dims, shapes;
  std::string max_memory;
  bool allow_older_opsets = false;
  void add_to(CLI::App& app);
  Status apply(ImportOptions* opts) const;
};

// Runs a tool's body: OasesError and other exceptions become `error: …` with exit code 2.
int run_tool(const std::function<int()>& body);
int fail_with(const Status& s);  // prints `error: <message>`, returns 2
// Parses the command line; parse errors print `error: …` and give 2, --help and --version give 0.
// Returns -1 to go on. Adds --version to every tool: version_text().
int parse_cli(CLI::App& app, int argc, char** argv);
// "oases-run (Oases 0.1.0)", then the OpenBLAS core in use and how it was chosen
// (executor/cpu/blas_select.h), then OpenBLAS's build configuration.
std::string version_text(const std::string& program);

}  // namespace oases
