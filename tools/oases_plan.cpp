// oases-plan MODEL --gpus N [--cluster FILE] [--profile FILE] [--memory GiB] --out plan.json [--html plan.html]
//   Searches, per part of the model (embedding, each attention and MLP, head), the tp degree (the
//   other ranks data-parallel) and sequence parallelism, with the schedule and the number of
//   micro-batch chunks, for the least predicted step time under a per-GPU memory limit; prints it
//   beside the Megatron strategy and pure data parallelism on the same cluster; --simulate replays
//   each rank's program on the cluster (step time, hidden and exposed communication, memory,
//   --trace writes the predicted timeline). Without --cluster the plan is for the machine at hand.
// oases-plan MODEL --tp T [--dp D] --strategy megatron --out plan.json    one given tp x dp split
// oases-plan --render plan.json --html plan.html                          draw an existing plan
// Planning reads shapes only: weights kept as external data are never loaded.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "executor/cpu/blas_select.h"
#include "graph/atomic_file.h"
#include "planner/plan_report.h"
#include "planner/strategy.h"
#include "tools/plan_command.h"

using namespace oases;

namespace {

// --tp T [--dp D] --strategy megatron: one given split, described and written.
int describe_megatron_split(const PlanOptions& o) {
  const std::string& model = o.model;
  const int64_t tp = std::max<int64_t>(o.tp, 1), dp = std::max<int64_t>(o.dp, 1), batch = o.batch, seq = o.seq;
  ImportOptions opts;
  if (Status s = o.bind.apply(&opts); !s.is_ok()) return fail_with(s);
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
  Plan p = Plan::megatron(tp, dp);
  p.vocab_parallel = !o.no_vocab;
  p.sequence_parallel = o.seq_par;
  auto report = plan_report(loaded->graph, p, model);
  if (!report) return fail_with(report.status());
  const nlohmann::json& plan = *report;
  Mesh mesh{plan["mesh"]["axes"].get<std::vector<std::string>>(), plan["mesh"]["sizes"].get<std::vector<int64_t>>()};
  std::printf("%s: mesh %s, %lld collectives per step, %.3g MiB sent per rank per step, %.3g MiB of parameters per rank\n", model.c_str(),
              mesh.to_string().c_str(), static_cast<long long>(plan["summary"]["collectives_per_step"].get<int64_t>()),
              plan["summary"]["ring_bytes_per_rank_per_step"].get<double>() / (1 << 20),
              plan["memory"]["parameter_bytes_per_rank"].get<double>() / (1 << 20));
  if (Status s = write_plan_files(plan, o.out, o.html, o.dot); !s.is_ok()) return fail_with(s);
  return 0;
}

// --render PLAN.json: an existing plan drawn again (--html, --dot).
int render_plan(const PlanOptions& o) {
  std::ifstream f(o.render);
  if (!f) return fail_with(error("{}: no such plan file", o.render));
  nlohmann::json plan = nlohmann::json::parse(f, nullptr, false);
  if (plan.is_discarded() || !plan.is_object() || plan.value("format", "") != "oases-plan")
    return fail_with(error("{}: not an Oases plan", o.render));
  if (Status s = write_plan_files(plan, o.out, o.html, o.dot); !s.is_ok()) return fail_with(s);
  return 0;
}

// Every flag, straight into `o`; returns --gpus (given or not decides between the search and a
// given split).
CLI::Option* add_plan_flags(CLI::App& app, PlanOptions& o) {
  app.add_option("model", o.model, "ONNX model file");
  CLI::Option* gpus_opt = app.add_option("--gpus", o.gpus, "Plan for this many GPUs (ranks): per-part tp x dp, schedule and chunks");
  app.add_option("--cluster", o.cluster_file, "Cluster file (JSON: device, nodes, links); default: the machine at hand");
  app.add_option("--profile", o.profile_file,
                 "Op and collective times measured by oases-profile (default: roofline from the device table)");
  app.add_option("--memory", o.memory_gib, "Memory per GPU in GiB (default: the device's)");
  app.add_flag("--simulate", o.simulate, "Replay each rank's program: step time, hidden and exposed communication, memory");
  app.add_option("--simulate-candidates", o.sim_candidates,
                 "With --simulate: replay the best plan of each schedule and chunk count, each also without sequence parallelism, and "
                 "Megatron's, up to N in all (the cost model's order), and choose the fastest (1: keep the cost model's choice)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--simulate-pipelines", o.sim_pipelines,
                 "With --simulate: replay the N fastest pipelines the search found (their stage programs) and choose the fastest whose "
                 "programs fit the memory limit (1: replay the search's choice only)")
      ->check(CLI::Range(int64_t{1}, int64_t{16}));
  app.add_option("--trace", o.trace, "Write the chosen plan's predicted timeline as a Chrome trace (implies --simulate)");
  app.add_option("--schedules", o.schedules, "Schedules to consider (comma list; default all five)");
  app.add_option("--chunks", o.chunks, "Micro-batch chunk counts to consider (comma list; default 1,2,4,8)");
  app.add_flag("--uniform", o.uniform, "One layout for every part");
  app.add_option("--degrees", o.degrees, "tp degrees to consider (comma list; default every one dividing the model)");
  app.add_flag("--no-sequence-parallel", o.no_sp, "Never split norms and residuals over the sequence");
  app.add_option("--zero", o.zero,
                 "The distributed optimizer (ZeRO stage 1: optimizer state and update shared over each part's dp ranks, gradients "
                 "reduce-scattered, weights all-gathered beside the next step's first instructions): 1 plans with it, 0 without, auto (default) lets the "
                 "pipeline search weigh both (the one-mesh search plans without); the plan file carries it to oases-train")
      ->check(CLI::IsMember({"0", "1", "auto"}));
  app.add_flag("--no-collective-matmul", o.no_cm, "Never decompose sequence-parallel collectives into ring steps beside the products");
  app.add_option("--dtype", o.dtype,
                 "fp32 | bf16 | fp16: compute type the plan is for (default: bf16 on a cluster whose GPUs have bf16 tensor cores, "
                 "a GPU profile's own type, else fp32); written into the plan file")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--pp", o.pp_list, "Pipeline stage counts to consider (comma list); the plan is then a pipeline when one fits");
  app.add_flag("--no-pipeline", o.no_pipeline, "Plan one mesh only (no pipeline stages)");
  app.add_option("--reference-pipeline", o.reference_pipeline,
                 "Also price a given pipeline PP,TP,MICRO[,gpipe|1f1b|eager-1f1b|zb-h1[,INNER_SCHEDULE]][,vN][,zero] (e.g. Megatron-LM's "
                 "published one; vN: N virtual stages a stage, interleaved 1F1B; zero: with the distributed optimizer)");
  app.add_option("--emulate-link", o.emulate_link, "The machine at hand behind an emulated link bw=GBPS,latency=US (as oases-train)");
  app.add_option("--hosts", o.hosts,
                 "The machine at hand as N emulated hosts (with --emulate-link: the link between them; as oases-train --hosts)");
  app.add_option("--tp", o.tp, "Tensor-parallel degree (a given Megatron split instead of a search)");
  app.add_option("--dp", o.dp, "Data-parallel degree (with --tp)");
  app.add_option("--strategy", o.strategy, "megatron (with --tp/--dp)")->check(CLI::IsMember({"megatron"}));
  app.add_option("--out", o.out, "Write the plan as JSON");
  app.add_option("--html", o.html, "Write a self-contained HTML page of the plan");
  app.add_option("--dot", o.dot, "Write a Graphviz DOT of the plan");
  app.add_option("--render", o.render, "Render an existing plan JSON (with --html/--dot) instead of planning");
  app.add_option("--batch", o.batch, "Global batch (sequences) the plan is made for");
  app.add_option("--seq", o.seq, "Sequence length the plan is made for");
  app.add_flag("--no-vocab-parallel", o.no_vocab, "Replicate the embedding and LM head (with --tp)");
  app.add_flag("--sequence-parallel", o.seq_par, "Split norms and residuals over the sequence (with --tp; with --gpus: only layouts with sequence parallelism where a part has one)");
  o.bind.add_to(app);
  return gpus_opt;
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-plan: choose how to split a model's training over a cluster, or describe a given split"};
    PlanOptions o;
    CLI::Option* gpus_opt = add_plan_flags(app, o);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    // refused before the search (minutes on a large cluster): a path that cannot be written
    for (const auto& [flag, path] :
         {std::pair<const char*, const std::string*>{"--out", &o.out}, {"--html", &o.html}, {"--dot", &o.dot}, {"--trace", &o.trace}}) {
      if (path->empty()) continue;
      if (Status s = check_output_file(*path, fmt::format("{} {}", flag, *path)); !s.is_ok()) return fail_with(s);
    }
    if (!o.render.empty()) return render_plan(o);
    if (o.model.empty()) return fail_with(Status::error("give a MODEL to plan (or --render PLAN.json)"));
    if (gpus_opt->count() > 0) {
      if (o.tp > 0 || o.dp > 0 || !o.strategy.empty())
        return fail_with(Status::error("--gpus searches the split; leave out --tp, --dp and --strategy"));
      return plan_search_command(o);
    }
    if (o.tp <= 0 && o.dp <= 0)
      return fail_with(Status::error("give --gpus N to search a plan, or --tp T [--dp D] for a given Megatron split"));
    return describe_megatron_split(o);
  });
}
