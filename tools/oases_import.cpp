// oases-import MODEL [--json FILE] [--dot FILE] [--verbose] [--dim NAME=N] [--shape INPUT=d0,..]
// Reads and checks a model, makes it canonical and summarises it.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "executor/cpu/blas_select.h"
#include "graph/atomic_file.h"

#include "tools/summary.h"

using namespace oases;

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-import: read, check and summarise an ONNX transformer"};
    std::string model, json_out, dot_out;
    bool verbose = false, raw_dot = false;
    BindingFlags bind;
    app.add_option("model", model, "ONNX model file")->required();
    app.add_option("--json", json_out, "Write the summary as JSON to FILE ('-' for stdout)");
    app.add_option("--dot", dot_out, "Write the canonical graph as Graphviz DOT to FILE");
    app.add_flag("--dot-raw", raw_dot, "With --dot, write the graph as imported instead");
    app.add_flag("-v,--verbose", verbose, "List the passes and what each found, and every block's weights");
    bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    ImportOptions opts;
    if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
    // refused before the (possibly long) import: a path that cannot be written
    if (json_out != "-" && !json_out.empty()) {
      if (Status s = check_output_file(json_out, "--json " + json_out); !s.is_ok()) return fail_with(s);
    }
    if (!dot_out.empty()) {
      if (Status s = check_output_file(dot_out, "--dot " + dot_out); !s.is_ok()) return fail_with(s);
    }
    auto m = load_model(model, opts);
    if (!m) return fail_with(m.status());
    nlohmann::json s = model_summary_json(*m, model);
    if (json_out == "-") {
      std::printf("%s\n", s.dump(2).c_str());
    } else {
      std::printf("%s", model_summary_text(s, verbose).c_str());
      if (!json_out.empty()) {
        if (Status st = write_file_atomically(json_out, s.dump(2) + "\n"); !st.is_ok()) return fail_with(st);
      }
    }
    if (!dot_out.empty()) {
      if (Status st = write_file_atomically(dot_out, graph_to_dot(raw_dot ? m->raw : m->graph)); !st.is_ok()) return fail_with(st);
    }
    return 0;
  });
}
