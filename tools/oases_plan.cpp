// oases-plan MODEL --tp T [--dp D] --strategy megatron --out plan.json [--html plan.html] [--dot plan.dot]
// Splits a model's training graph over a tp x dp mesh and writes the plan: every value's spec and
// local shape, every op's layout, every collective with its bytes per step, per-rank memory.
// Planning reads shapes only: weights kept as external data are never loaded.
#include <cstdio>
#include <fstream>

#include "executor/training.h"
#include "planner/plan.h"
#include "planner/plan_render.h"
#include "planner/strategy.h"
#include "tools/model_loader.h"

using namespace oases;

namespace {

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) return error("{}: cannot open for writing", path);
  f << text;
  f.close();
  if (!f) return error("{}: write failed", path);
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  return run_tool([&] {
    CLI::App app{"oases-plan: split a model's training over a mesh of ranks and describe the plan"};
    std::string model, out, html, dot, strategy = "megatron", render;
    int64_t tp = 1, dp = 1, batch = 0, seq = 0;
    bool no_vocab = false, seq_par = false;
    BindingFlags bind;
    app.add_option("model", model, "ONNX model file");
    app.add_option("--tp", tp, "Tensor-parallel degree");
    app.add_option("--dp", dp, "Data-parallel degree");
    app.add_option("--strategy", strategy, "megatron")->check(CLI::IsMember({"megatron"}));
    app.add_option("--out", out, "Write the plan as JSON");
    app.add_option("--html", html, "Write a self-contained HTML page of the plan");
    app.add_option("--dot", dot, "Write a Graphviz DOT of the plan");
    app.add_option("--render", render, "Render an existing plan JSON (with --html/--dot) instead of planning");
    app.add_option("--batch", batch, "Global batch (sequences) the plan is made for");
    app.add_option("--seq", seq, "Sequence length the plan is made for");
    app.add_flag("--no-vocab-parallel", no_vocab, "Replicate the embedding and LM head");
    app.add_flag("--sequence-parallel", seq_par, "Split norms and residuals over the sequence");
    bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    nlohmann::json plan;
    if (!render.empty()) {
      std::ifstream f(render);
      if (!f) return fail_with(error("{}: no such plan file", render));
      plan = nlohmann::json::parse(f, nullptr, false);
      if (plan.is_discarded() || plan.value("format", "") != "oases-plan") return fail_with(error("{}: not an Oases plan", render));
    } else {
      if (model.empty()) return fail_with(Status::error("give a MODEL to plan (or --render PLAN.json)"));
      ImportOptions opts;
      if (Status s = bind.apply(&opts); !s.is_ok()) return fail_with(s);
      // token inputs: bind their symbolic dims to [batch, seq]
      ImportOptions probe_opts = opts;
      probe_opts.require_bound_dims = false;
      auto probe = import_onnx_file(model, probe_opts);
      if (!probe) return fail_with(probe.status());
      for (ValueId v : probe->inputs()) {
        const Value& val = probe->value(v);
        if (!is_integer(val.dtype) || val.shape.size() != 2 || opts.input_shapes.count(val.name)) continue;
        Shape s = val.shape;
        if (s[0] < 0) s[0] = batch > 0 ? batch : std::max<int64_t>(8, dp);
        if (s[1] < 0) s[1] = seq > 0 ? seq : 64;
        opts.input_shapes[val.name] = s;
      }
      auto loaded = load_model(model, opts);
      if (!loaded) return fail_with(loaded.status());
      StrategyOptions so;
      so.tp = tp;
      so.dp = dp;
      so.vocab_parallel = !no_vocab;
      so.sequence_parallel = seq_par;
      auto st = megatron_strategy(loaded->graph, so);
      if (!st) return fail_with(st.status().with_context(model));
      auto tg = build_training_graph(loaded->graph, TrainingSpec{});
      if (!tg) return fail_with(tg.status().with_context(model));
      if (Status s = split_batch_inputs(tg->graph, &*st); !s.is_ok()) return fail_with(s.with_context(model));
      ShardingResult sr;
      auto pg = partition_training(tg->graph, tg->params, *st, &sr);
      if (!pg) return fail_with(pg.status().with_context(model));
      plan = plan_to_json(tg->graph, *pg, sr, *st, model);
      std::printf("%s: mesh %s, %lld collectives per step, %.3g MiB sent per rank per step, %.3g MiB of parameters per rank\n",
                  model.c_str(), st->mesh.to_string().c_str(), static_cast<long long>(plan["summary"]["collectives_per_step"].get<int64_t>()),
                  plan["summary"]["ring_bytes_per_rank_per_step"].get<double>() / (1 << 20),
                  plan["memory"]["parameter_bytes_per_rank"].get<double>() / (1 << 20));
    }
    if (!out.empty()) {
      if (Status s = write_file(out, plan.dump(2) + "\n"); !s.is_ok()) return fail_with(s);
    }
    if (!html.empty()) {
      if (Status s = write_file(html, plan_to_html(plan)); !s.is_ok()) return fail_with(s);
    }
    if (!dot.empty()) {
      if (Status s = write_file(dot, plan_to_dot(plan)); !s.is_ok()) return fail_with(s);
    }
    return 0;
  });
}
