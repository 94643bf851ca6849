// oases-import MODEL [--json FILE] [--dot FILE] [--verbose] [--dim NAME=N] [--shape INPUT=d0,..]
// Reads and checks a model, makes it canonical and summarises it.
#include <cstdio>
#include <fstream>

#include "tools/summary.h"

using namespace oases;

int main(int argc, char** argv) {
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
    auto m = load_model(model, opts);
    if (!m) return fail_with(m.status());
    nlohmann::json s = model_summary_json(*m, model);
    if (json_out == "-") {
      std::printf("%s\n", s.dump(2).c_str());
    } else {
      std::printf("%s", model_summary_text(s, verbose).c_str());
      if (!json_out.empty()) {
        std::ofstream f(json_out);
        if (!f) return fail_with(error("{}: cannot open for writing", json_out));
        f << s.dump(2) << "\n";
      }
    }
    if (!dot_out.empty()) {
      std::ofstream f(dot_out);
      if (!f) return fail_with(error("{}: cannot open for writing", dot_out));
      f << graph_to_dot(raw_dot ? m->raw : m->graph);
    }
    return 0;
  });
}
