#include "tools/train_driver.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "executor/device.h"
#include "executor/distributed.h"
#include "executor/loss_scaler.h"
#include "executor/mpi_communicator.h"
#include "executor/profile_report.h"
#include "executor/training.h"
#include "graph/passes/mixed_precision.h"
#include "importer/onnx_export.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "planner/chunking.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/strategy.h"

namespace fs = std::filesystem;

namespace oases {

void add_train_options(CLI::App& app, TrainArgs& a) {
  app.add_option("model", a.model, "ONNX model file")->required();
  app.add_option("--data", a.data, "Token file: llm.c/nanoGPT uint16 .bin, int32 .i32, or UTF-8 text (bytes)");
  app.add_option("--inputs", a.inputs_dir, "Feed the graph inputs from input_N.pb files (ONNX test-data layout)");
  app.add_flag("--synthetic", a.synthetic, "Random tokens (benchmarks)");
  app.add_option("--steps", a.steps, "Optimizer steps (0 with --dump-grads: gradients only)");
  app.add_option("--batch", a.batch, "Sequences per micro-batch (the global batch under data parallelism)");
  app.add_option("--seq", a.seq, "Tokens per sequence");
  app.add_option("--grad-accum", a.grad_accum, "Micro-batches per optimizer step");
  app.add_option("--optimizer", a.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", a.lr, "Peak learning rate");
  app.add_option("--min-lr", a.min_lr, "Learning rate at the end of the cosine decay (default lr/10)");
  app.add_option("--warmup", a.warmup, "Steps of linear warm-up");
  app.add_flag("--no-cosine", a.no_cosine, "Constant learning rate after warm-up");
  app.add_option("--weight-decay", a.weight_decay, "Decoupled weight decay (AdamW) or L2 (SGD)");
  app.add_flag("--decay-all", a.decay_all, "Also decay rank-1 parameters (biases, norm scales)");
  app.add_option("--momentum", a.momentum, "SGD momentum");
  app.add_flag("--nesterov", a.nesterov, "Nesterov momentum (SGD)");
  app.add_option("--beta1", a.beta1, "AdamW beta1");
  app.add_option("--beta2", a.beta2, "AdamW beta2");
  app.add_option("--eps", a.eps, "AdamW epsilon");
  app.add_option("--clip", a.clip, "Global gradient-norm clip (0: off)");
  app.add_option("--loss", a.loss, "auto | cross_entropy")->check(CLI::IsMember({"auto", "cross_entropy"}));
  app.add_option("--ignore-index", a.ignore_index, "Target id the appended cross-entropy ignores");
  app.add_option("--freeze", a.freeze, "Hold initializers whose names match this regex fixed");
  app.add_option("--train", a.train, "Train initializers whose names match this regex though they look like buffers (--freeze wins)");
  app.add_option("--seed", a.seed, "Seed of batch sampling and dropout");
  app.add_option("--val-every", a.val_every, "Validation loss every N steps (0: only at the end)");
  app.add_option("--val-batches", a.val_batches, "Batches per validation");
  app.add_option("--val-fraction", a.val_fraction, "Fraction of the data held out for validation");
  app.add_option("--save", a.save, "Write a checkpoint to CKPT (at the end, and every --save-every steps)");
  app.add_option("--save-every", a.save_every, "Checkpoint every N steps");
  app.add_option("--resume", a.resume, "Continue from a checkpoint (also one written with another tp/dp layout)");
  app.add_option("--stop-after", a.stop_after, "Stop (and save) after N steps of this run; --steps still sets the schedule");
  app.add_option("--export-onnx", a.export_onnx, "Write the model with the trained weights");
  app.add_option("--dump-grads", a.dump_grads, "Write the first step's gradients (one TensorProto per parameter, full tensors)");
  app.add_option("--log-json", a.log_json, "One JSON object per step");
  app.add_option("--log-every", a.log_every, "Progress line every N steps (default: about 20 lines a run)");
  app.add_option("--threads", a.threads, "Threads for BLAS and kernels per rank (0: the cores shared among ranks)");
  app.add_flag("-q,--quiet", a.quiet, "No progress lines");
  app.add_flag("--profile", a.profile, "Print the time per op type and the slowest nodes per step (rank 0, steps after the first)");
  app.add_option("--tp", a.tp, "Tensor-parallel degree");
  app.add_option("--dp", a.dp, "Data-parallel degree");
  app.add_option("--local-ranks", a.local_ranks, "Run N ranks as threads of this process");
  app.add_flag("--no-vocab-parallel", a.no_vocab_parallel, "Replicate the embedding and LM head instead of splitting the vocabulary");
  app.add_flag("--sequence-parallel", a.sequence_parallel, "Split norms and residuals over the sequence (reduce-scatter + all-gather)");
  app.add_option("--dp-bucket-mb", a.dp_bucket_mb, "MiB of gradients per data-parallel all-reduce (0: one all-reduce per gradient)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--export-plan", a.export_plan, "Write the partitioned plan as JSON");
  app.add_option("--plan", a.plan, "Run this plan (oases-plan output, or specs per initializer)");
  app.add_option("--comm-timeout", a.comm_timeout, "Seconds a collective waits for its peers before the run stops");
  app.add_option("--chunks", a.chunks, "Micro-batch chunks per batch (default 2 with --schedule, else 1)");
  app.add_option("--schedule", a.schedule, "plain | default_checkpoint | optim_comm_checkpoint | overlap_checkpoint | oases")
      ->check(CLI::IsMember({"plain", "default_checkpoint", "optim_comm_checkpoint", "overlap_checkpoint", "oases"}));
  app.add_option("--emulate-link", a.emulate_link, "Delay collectives as a link of bw=GBPS,latency=US would (ring algorithm)");
  app.add_option("--trace", a.trace, "Write a Chrome trace (Perfetto) of the first --trace-steps steps after the first");
  app.add_option("--trace-steps", a.trace_steps, "Steps in the trace");
  app.add_flag("--overlap-report", a.overlap_report, "Print total, hidden and exposed communication time per step and per block");
  app.add_flag("--memory-report", a.memory_report, "Print the bytes of activations each block keeps for the backward pass");
  app.add_option("--device", a.device, "cpu | cuda (the GPU backend: docs/GPU.md)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", a.dtype,
                 "fp32 | bf16 | fp16: compute type; parameters and optimizer state stay fp32, fp16 adds dynamic loss scaling")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  a.bind.add_to(app);
}

namespace {

std::string fmt_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

std::string sanitize(const std::string& name) {
  std::string r;
  for (char c : name) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return r;
}

// Everything that is the same on every rank, built once per process.
struct Setup {
  TrainArgs a;
  TrainingGraph global;  // forward + loss + backward, global shapes
  int64_t batch = 0, seq = 0, vocab = 0;
  std::map<std::string, Tensor> fixed_feeds;
  std::vector<InputRole> roles;
  TokenData data;
  int64_t split = 0;
  bool have_val = false;
  OptimizerConfig oc;
  Strategy strategy;
  std::optional<PartitionedGraph> pg;
  std::vector<ShardingSpec> param_specs;  // per trainable parameter
  std::vector<Shape> param_shapes;
  std::string fingerprint;
  uint64_t model_hash = 0;
};

Status bind_token_shapes(const TrainArgs& a, ImportOptions* opts, int64_t* batch, int64_t* seq) {
  ImportOptions probe_opts = *opts;
  probe_opts.require_bound_dims = false;
  OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(a.model, probe_opts));
  int64_t b = a.batch, t = a.seq;
  for (ValueId v : probe.inputs()) {
    const Value& val = probe.value(v);
    if (!is_integer(val.dtype) || val.shape.size() != 2 || opts->input_shapes.count(val.name)) continue;
    for (int d = 0; d < 2; ++d) {
      int64_t fixed = val.shape[d];
      int64_t& want = d == 0 ? b : t;
      if (fixed >= 0) {
        if (want > 0 && want != fixed) {
          return error("the model fixes input '{}' to {}; give --batch {} --seq {} or export it with dynamic axes", val.name,
                       shape_str(val.shape), val.shape[0] >= 0 ? val.shape[0] : b, val.shape[1] >= 0 ? val.shape[1] : t);
        }
        want = fixed;
      }
    }
  }
  if (b <= 0) b = 8;
  if (t <= 0) t = 64;
  for (ValueId v : probe.inputs()) {
    const Value& val = probe.value(v);
    if (is_integer(val.dtype) && val.shape.size() == 2 && !opts->input_shapes.count(val.name)) opts->input_shapes[val.name] = {b, t};
  }
  *batch = b;
  *seq = t;
  return Status::ok();
}

Expected<Setup> prepare(const TrainArgs& args, int64_t world) {
  Setup s;
  s.a = args;
  TrainArgs& a = s.a;
  int sources = (!a.data.empty()) + (!a.inputs_dir.empty()) + a.synthetic;
  if (sources != 1) return Status::error("give exactly one of --data FILE, --inputs DIR or --synthetic");
  if (a.steps < 0 || a.grad_accum < 1) return Status::error("--steps must be >= 0 and --grad-accum >= 1");
  if (a.steps == 0 && a.dump_grads.empty() && a.export_onnx.empty() && a.export_plan.empty()) {
    return Status::error("--steps 0 does nothing without --dump-grads, --export-onnx or --export-plan");
  }
  // a plan fixes the layout, the shapes and the schedule where the command line does not
  if (!a.plan.empty()) {
    OASES_ASSIGN_OR_RETURN(PlanSettings ps, read_plan_settings(a.plan));
    OASES_RETURN_IF_ERROR(adopt_plan_settings(ps, a.plan, world, &a.tp, &a.dp, &a.batch, &a.seq, &a.schedule, &a.chunks));
  }
  // the parallel layout
  if (a.tp <= 0 && a.dp <= 0) {
    a.tp = 1;
    a.dp = world;
  } else if (a.tp <= 0) {
    if (world % a.dp != 0) return error("dp {} does not divide the {} ranks of this run (world size must equal tp x dp)", a.dp, world);
    a.tp = world / a.dp;
  } else if (a.dp <= 0) {
    if (world % a.tp != 0) return error("tp {} does not divide the {} ranks of this run (world size must equal tp x dp)", a.tp, world);
    a.dp = world / a.tp;
  }
  if (a.tp * a.dp != world) {
    return error("tp {} x dp {} = {} ranks, but the run has {} (world size must equal tp x dp)", a.tp, a.dp, a.tp * a.dp, world);
  }

  ImportOptions opts;
  OASES_RETURN_IF_ERROR(a.bind.apply(&opts));
  if (!a.inputs_dir.empty()) {
    if (!fs::is_directory(a.inputs_dir)) return error("{}: no such folder", a.inputs_dir);
    std::vector<std::pair<int, std::string>> files;
    std::regex re("input_([0-9]+)\\.pb");
    for (const auto& e : fs::directory_iterator(a.inputs_dir)) {
      std::smatch m;
      std::string n = e.path().filename().string();
      if (std::regex_match(n, m, re)) files.push_back({std::stoi(m[1]), e.path().string()});
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) return error("{}: no input_N.pb files", a.inputs_dir);
    ImportOptions probe_opts = opts;
    probe_opts.require_bound_dims = false;
    OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(a.model, probe_opts));
    for (size_t i = 0; i < files.size(); ++i) {
      OASES_ASSIGN_OR_RETURN(auto t, read_tensor_file(files[i].second));
      std::string name = t.first;
      bool known = false;
      for (ValueId v : probe.inputs()) known |= probe.value(v).name == name;
      if (!known) {
        if (i >= probe.inputs().size()) return error("{} matches no model input", files[i].second);
        name = probe.value(probe.inputs()[i]).name;
      }
      s.fixed_feeds[name] = t.second;
      if (!opts.input_shapes.count(name)) opts.input_shapes[name] = t.second.shape();
      if (is_integer(t.second.dtype()) && t.second.rank() == 2 && s.batch == 0) {
        s.batch = t.second.shape()[0];
        s.seq = t.second.shape()[1];
      }
    }
  } else {
    OASES_RETURN_IF_ERROR(bind_token_shapes(a, &opts, &s.batch, &s.seq));
  }

  OASES_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(a.model, opts));
  // the strategy is found on the forward graph
  StrategyOptions so;
  so.tp = a.tp;
  so.dp = a.dp;
  so.vocab_parallel = !a.no_vocab_parallel;
  so.sequence_parallel = a.sequence_parallel;
  so.dp_bucket_bytes = static_cast<int64_t>(a.dp_bucket_mb * (1 << 20));
  if (!a.plan.empty()) {
    OASES_ASSIGN_OR_RETURN(s.strategy, strategy_from_plan_file(a.plan, loaded.graph, so));
  } else {
    auto st = megatron_strategy(loaded.graph, so);
    if (!st) return st.status().with_context(a.model);
    s.strategy = std::move(*st);
  }
  TrainingSpec spec;
  spec.loss = a.loss;
  spec.ignore_index = a.ignore_index;
  spec.freeze = a.freeze;
  spec.train = a.train;
  if (a.chunks <= 0) a.chunks = a.schedule.empty() ? 1 : 2;
  OASES_ASSIGN_OR_RETURN(DType compute, compute_dtype_from_name(a.dtype));
  if (a.chunks > 1 || compute != DType::kF32) {
    int k = static_cast<int>(a.chunks);
    // mixed precision first (the chunked copies inherit its casts), then the micro-batch chunks,
    // then (fp16) the loss-scale input the backward pass starts from
    spec.before_autodiff = [k, compute](Graph g) -> Expected<Graph> {
      if (compute != DType::kF32) OASES_RETURN_IF_ERROR(apply_mixed_precision(g, compute).status());
      if (k > 1) {
        OASES_ASSIGN_OR_RETURN(g, chunk_batch(std::move(g), k));
      }
      if (compute == DType::kF16) OASES_RETURN_IF_ERROR(insert_loss_scale_input(g));
      return g;
    };
  }
  auto tg = build_training_graph(loaded.graph, spec);
  if (!tg) return tg.status().with_context(a.model);
  s.global = std::move(*tg);
  s.vocab = s.global.vocab;
  if (s.vocab == 0) {
    for (ValueId v : s.global.graph.initializers()) {
      const Value& val = s.global.graph.value(v);
      for (const Use& u : val.uses) {
        const Node& n = s.global.graph.node(u.node);
        if (n.op_type == "Gather" && u.slot == 0 && val.shape.size() == 2) s.vocab = std::max(s.vocab, val.shape[0]);
      }
    }
  }
  if (s.fixed_feeds.empty()) {
    auto roles = input_roles(s.global.graph, s.global.targets);
    if (!roles) return roles.status().with_context(a.model);
    s.roles = std::move(*roles);
  } else if (s.global.appended_loss) {
    auto token_roles = input_roles(s.global.graph, s.global.targets);
    if (!token_roles) return token_roles.status().with_context(a.model);
    // the decoder's input when there is one (an encoder-decoder model), else the token input
    for (InputRole::Kind kind : {InputRole::kDecoderTokens, InputRole::kTokens}) {
      for (const InputRole& r : *token_roles) {
        if (r.kind == kind && s.fixed_feeds.count(r.name) && !s.fixed_feeds.count("oases_targets")) {
          s.fixed_feeds["oases_targets"] = shifted_targets(s.fixed_feeds[r.name], a.ignore_index);
        }
      }
    }
    if (!s.fixed_feeds.count("oases_targets")) return Status::error("cannot derive next-token targets from --inputs");
  }
  // data
  if (!a.data.empty() || a.synthetic) {
    if (a.synthetic) {
      s.data = synthetic_tokens(std::max<int64_t>(1 << 20, (s.batch * (s.seq + 1)) * 16), std::max<int64_t>(s.vocab, 2), a.seed);
    } else {
      OASES_ASSIGN_OR_RETURN(s.data, load_tokens(a.data));
    }
    if (s.vocab > 0) OASES_RETURN_IF_ERROR(check_vocab(s.data, s.vocab));
    int64_t n = static_cast<int64_t>(s.data.tokens.size());
    s.split = n - static_cast<int64_t>(std::floor(static_cast<double>(n) * a.val_fraction));
    if (s.split < s.seq + 1) {
      return error("{}: {} tokens ({} after holding out {:.0f}% for validation) are fewer than one batch row of {} tokens",
                   a.synthetic ? "synthetic data" : a.data, n, s.split, a.val_fraction * 100, s.seq + 1);
    }
    s.have_val = n - s.split >= s.seq + 1;
  }
  // the partition
  OASES_RETURN_IF_ERROR(split_batch_inputs(s.global.graph, &s.strategy));
  for (ValueId p : s.global.params) {
    auto it = s.strategy.specs.find(p);
    s.param_specs.push_back(it != s.strategy.specs.end() ? it->second : ShardingSpec::replicated(s.global.graph.value(p).shape.size()));
    s.param_shapes.push_back(s.global.graph.value(p).shape);
  }
  if (world > 1 || !a.export_plan.empty()) {
    ShardingResult sr;
    auto pg = partition_training(s.global.graph, s.global.params, s.strategy, &sr);
    if (!pg) return pg.status().with_context(a.model);
    if (!a.export_plan.empty()) {
      nlohmann::json plan = plan_to_json(s.global.graph, *pg, sr, s.strategy, a.model);
      std::ofstream f(a.export_plan);
      if (!f) return error("{}: cannot open for writing", a.export_plan);
      f << plan.dump(2) << "\n";
    }
    if (world > 1) s.pg = std::move(*pg);
  }
  s.oc.kind = a.optimizer;
  s.oc.lr = a.lr;
  s.oc.min_lr = a.min_lr;
  s.oc.warmup = a.warmup;
  s.oc.total_steps = a.steps;
  s.oc.cosine = !a.no_cosine;
  s.oc.weight_decay = a.weight_decay;
  s.oc.momentum = a.momentum;
  s.oc.nesterov = a.nesterov;
  s.oc.beta1 = a.beta1;
  s.oc.beta2 = a.beta2;
  s.oc.eps = a.eps;
  s.oc.clip = a.clip;
  s.oc.decay_all = a.decay_all;
  for (size_t i = 0; i < s.global.params.size(); ++i) {
    const Value& v = s.global.graph.value(s.global.params[i]);
    s.fingerprint += fmt::format("{}:{}{};", v.name, dtype_name(v.dtype), shape_str(v.shape));
  }
  s.model_hash = fnv1a(s.fingerprint + fmt::format("nodes={};tp={};dp={};", s.global.graph.num_nodes(), a.tp, a.dp) + binary_identity());
  return s;
}

// Per-step communication accounting from a run's events: total time of the collectives, the
// part the compute thread waited for (exposed), the rest hidden behind computation.
struct OverlapStats {
  struct Acc {
    double comm = 0, exposed = 0;
  };
  int steps = 0;
  double step_ms = 0;
  Acc total;
  std::map<int, Acc> per_layer;
  std::map<int, Acc> per_layer_bwd;

  static int layer_of(const Node& n) {
    if (n.scope.rfind("layer.", 0) != 0) return -1;
    return std::atoi(n.scope.c_str() + 6);
  }
  void add(const Graph& g, const std::vector<TraceEvent>& ev, double ms, bool count) {
    if (!count) return;
    ++steps;
    step_ms += ms;
    for (const TraceEvent& e : ev) {
      if (e.node == kNoId || !g.alive(e.node)) continue;
      const Node& n = g.node(e.node);
      if (e.category == "comm") {
        total.comm += e.dur_us;
        per_layer[layer_of(n)].comm += e.dur_us;
        if (e.thread == 0) {  // run in line: all of it exposed
          total.exposed += e.dur_us;
          per_layer[layer_of(n)].exposed += e.dur_us;
        }
      } else if (e.category == "wait") {
        total.exposed += e.dur_us;
        per_layer[layer_of(n)].exposed += e.dur_us;
      }
    }
  }
  void print(bool overlap_asked, const std::string& schedule) const {
    if (steps == 0) {
      std::fprintf(stderr, "overlap report: no step after the first to measure\n");
      return;
    }
    double n = steps;
    double comm = total.comm / 1000.0 / n, exposed = std::min(comm, total.exposed / 1000.0 / n), hidden = comm - exposed;
    std::fprintf(
        stderr,
        "overlap report (rank 0, mean of %d steps): step %.1f ms; communication %.1f ms: hidden %.1f ms (%.0f%%), exposed %.1f ms\n", steps,
        step_ms / n, comm, hidden, comm > 0 ? 100.0 * hidden / comm : 0.0, exposed);
    for (const auto& [layer, acc] : per_layer) {
      double c = acc.comm / 1000.0 / n, x = std::min(c, acc.exposed / 1000.0 / n);
      std::fprintf(stderr, "  %-10s comm %8.2f ms  hidden %8.2f ms  exposed %8.2f ms\n",
                   layer < 0 ? "other" : fmt::format("layer {}", layer).c_str(), c, c - x, x);
    }
    if (comm > 0 && hidden < 0.05 * comm) {
      std::fprintf(stderr, "WARNING: %s\n",
                   overlap_asked ? fmt::format("overlap was asked for (--schedule {}) but almost no communication was hidden ({:.0f}%)",
                                               schedule, 100.0 * hidden / comm)
                                       .c_str()
                                 : "no communication was hidden behind computation (use --schedule oases or overlap_checkpoint)");
    }
  }
};

// Chrome trace events ("X" complete events, one pid per rank, tid 0 compute and 1 communication).
void append_trace(const Graph& g, const std::vector<TraceEvent>& ev, int rank, nlohmann::json* out) {
  if (out->empty()) {
    out->push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
    out->push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    out->push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 1}, {"args", {{"name", "communication"}}}});
  }
  for (const TraceEvent& e : ev) {
    if (e.node == kNoId || !g.alive(e.node)) continue;
    const Node& n = g.node(e.node);
    std::string name = e.category == "wait" ? "wait " + n.op_type : n.op_type;
    if (n.chunk >= 0) name += fmt::format(" (chunk {})", n.chunk);
    out->push_back({{"name", name},
                    {"cat", e.category == "wait" ? "comm" : e.category},
                    {"ph", "X"},
                    {"ts", e.start_us},
                    {"dur", std::max(e.dur_us, 0.01)},
                    {"pid", rank},
                    {"tid", e.thread},
                    {"args", {{"node", n.name}, {"scope", n.scope}, {"chunk", n.chunk}, {"kind", e.category}}}});
  }
}

// One rank's training loop. `log` is true on rank 0.
Status run_rank(const Setup& s, RankRuntime& rt) {
  const TrainArgs& a = s.a;
  bool lead = rt.rank() == 0;
  // this rank's training graph
  TrainingGraph tg;
  if (s.pg) {
    tg.graph = local_graph_for_rank(*s.pg, rt.rank());
    tg.loss = tg.graph.outputs()[0];
    tg.params = s.global.params;
    for (size_t i = 1; i < tg.graph.outputs().size(); ++i) tg.grads.push_back(tg.graph.outputs()[i]);
    tg.targets = s.global.targets;
    tg.appended_loss = s.global.appended_loss;
    tg.vocab = s.global.vocab;
  } else {
    tg = s.global;
  }
  ExecOptions eo;
  eo.threads = a.threads;
  eo.groups = rt.axis_groups();
  eo.device = a.device;
  std::vector<std::unique_ptr<CommGroup>> nccl_groups;
  if (a.device == "cuda") {
    // one GPU per rank (the node-local rank picks it); collectives over NCCL, bootstrapped over
    // this run's communicator
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!local) local = std::getenv("SLURM_LOCALID");
    OASES_RETURN_IF_ERROR(cuda_select_device(local ? std::atoi(local) : rt.rank()));
    if (rt.distributed()) {
      OASES_ASSIGN_OR_RETURN(nccl_groups, make_nccl_groups(rt.communicator(), rt.mesh(), rt.rank(), a.comm_timeout));
      eo.groups.clear();
      for (auto& g : nccl_groups) eo.groups.push_back(g.get());
    }
  }
  // the schedule: recomputation, then the instruction order (the same on every rank)
  std::optional<ScheduleOptions> sched;
  RecomputeReport recompute;
  std::map<int, int64_t> saved_bytes;
  std::map<int, int> saved_count;
  if (!a.schedule.empty()) {
    OASES_ASSIGN_OR_RETURN(sched, schedule_by_name(a.schedule));
    OASES_ASSIGN_OR_RETURN(recompute, apply_recompute(tg.graph, sched->checkpoint));
    OASES_ASSIGN_OR_RETURN(eo.order, schedule_program(tg.graph, *sched));
    if (lead && std::getenv("OASES_DUMP_SCHEDULE")) {
      for (const ScheduledOp& op : eo.order) {
        const Node& n = tg.graph.node(op.node);
        const char* k = op.kind == ScheduledOp::Kind::kCompute ? "    " : op.kind == ScheduledOp::Kind::kCommStart ? "START" : "WAIT ";
        std::fprintf(stderr, "%s c%-2d %-9s %-22s %s\n", k, n.chunk,
                     n.phase == Node::Phase::kForward    ? "fwd"
                     : n.phase == Node::Phase::kLoss     ? "loss"
                     : n.phase == Node::Phase::kBackward ? "bwd"
                                                         : "recompute",
                     n.op_type.c_str(), n.scope.c_str());
      }
    }
    saved_bytes = saved_activation_bytes(tg.graph, eo.order);
    saved_count = saved_activation_count(tg.graph, eo.order);
  }
  OASES_ASSIGN_OR_RETURN(auto trainer, Trainer::create(std::move(tg), s.oc, eo));
  Trainer& tr = *trainer;
  tr.executor().state().seed = a.seed;
  // fp16: dynamic loss scaling (a step with non-finite gradients is skipped and the scale halves)
  LossScalerConfig lsc;
  lsc.dynamic = a.dtype == "fp16";
  LossScaler scaler(lsc);
  tr.skip_nonfinite = lsc.dynamic;
  bool tracing = !a.trace.empty() || a.overlap_report;
  tr.executor().set_tracing(tracing);
  if (lead && (a.memory_report || a.overlap_report) && sched) {
    std::fprintf(stderr, "schedule %s, %lld chunks: %d recomputed nodes (%d collectives); activations kept for backward per block:\n",
                 sched->name.c_str(), static_cast<long long>(a.chunks), recompute.nodes, recompute.collectives);
    for (const auto& [layer, bytes] : saved_bytes) {
      std::string where = layer < 0 ? std::string("outside blocks") : fmt::format("layer {}", layer);
      std::fprintf(stderr, "  %s: %d tensors, %.1f KiB\n", where.c_str(), saved_count[layer], static_cast<double>(bytes) / 1024.0);
    }
  }
  const std::vector<ShardingSpec>& pspecs = s.param_specs;
  if (rt.distributed()) {
    tr.global_norm = [&rt, &pspecs](const std::vector<double>& ss) { return std::sqrt(rt.global_sum_squares(ss, pspecs)); };
  }
  OASES_RETURN_IF_ERROR(rt.check_same("model or binary", s.model_hash));
  const Graph& lg = tr.training_graph().graph;
  auto slice_feeds = [&](const std::map<std::string, Tensor>& global) {
    if (!s.pg) return global;
    std::map<std::string, Tensor> local;
    for (const auto& [name, t] : global) {
      ValueId v = lg.find_value(name);
      if (v == kNoId) continue;
      local[name] = slice_for_rank(t, s.pg->specs[static_cast<size_t>(v)], rt.mesh(), rt.rank());
    }
    return local;
  };
  auto gathered_params = [&]() {
    std::map<std::string, Tensor> full;
    auto local = tr.parameters();
    for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
      std::string name = tr.param_name(i);
      full[name] = rt.gather(local.at(name), pspecs[i], s.param_shapes[i]);
    }
    return full;
  };

  BatchSampler sampler(&s.data.tokens, 0, s.split, a.seed);
  BatchSampler val_sampler(&s.data.tokens, s.split, static_cast<int64_t>(s.data.tokens.size()), a.seed + 1);
  int64_t start = 0;
  if (!a.resume.empty()) {
    OASES_ASSIGN_OR_RETURN(Checkpoint ck, load_checkpoint(a.resume));
    if (ck.fingerprint != s.fingerprint) {
      return error("{}: the checkpoint was written for another model (its parameters differ from {}'s)", a.resume, a.model);
    }
    if (ck.optimizer_kind != a.optimizer) {
      return error("{}: the checkpoint holds {} state, this run uses --optimizer {}", a.resume, ck.optimizer_kind, a.optimizer);
    }
    auto params = tr.parameters();
    std::map<std::string, Tensor> opt_state;
    for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
      std::string name = tr.param_name(i);
      auto it = ck.tensors.find(name);
      if (it == ck.tensors.end() || it->second.shape() != s.param_shapes[i]) return error("{}: parameter '{}' is missing", a.resume, name);
      Tensor local = slice_for_rank(it->second, pspecs[i], rt.mesh(), rt.rank());
      std::memcpy(params.at(name).raw_mutable(), local.raw(), local.nbytes());
      for (const char* suffix : {".m", ".v", ".momentum"}) {
        auto st = ck.tensors.find(name + suffix);
        if (st != ck.tensors.end()) opt_state[name + suffix] = slice_for_rank(st->second, pspecs[i], rt.mesh(), rt.rank());
      }
    }
    tr.optimizer().set_state(opt_state, ck.optimizer_t);
    if (!ck.sampler_state.empty()) OASES_RETURN_IF_ERROR(sampler.set_state(ck.sampler_state).with_context(a.resume));
    start = ck.step;
    tr.executor().state().step = static_cast<uint64_t>(start);
    if (lead && !a.quiet) std::fprintf(stderr, "resumed from %s at step %lld\n", a.resume.c_str(), static_cast<long long>(start));
  }
  auto save = [&](int64_t step) -> Status {
    Checkpoint ck;
    ck.fingerprint = s.fingerprint;
    ck.step = step;
    ck.optimizer_kind = a.optimizer;
    ck.optimizer_t = tr.optimizer().steps_taken();
    ck.sampler_state = sampler.state();
    ck.seed = a.seed;
    ck.tensors = gathered_params();
    auto st = tr.optimizer().state();
    for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
      std::string name = tr.param_name(i);
      for (const char* suffix : {".m", ".v", ".momentum"}) {
        auto it = st.find(name + suffix);
        if (it != st.end()) ck.tensors[name + suffix] = rt.gather(it->second, pspecs[i], s.param_shapes[i]);
      }
    }
    if (!lead) return Status::ok();
    return save_checkpoint(ck, a.save);
  };
  std::unique_ptr<std::ofstream> log;
  if (lead && !a.log_json.empty()) {
    log = std::make_unique<std::ofstream>(a.log_json, std::ios::app);
    if (!*log) return error("{}: cannot open for writing", a.log_json);
  }
  auto next_feeds = [&]() -> Expected<std::vector<std::map<std::string, Tensor>>> {
    std::vector<std::map<std::string, Tensor>> micro;
    for (int64_t i = 0; i < a.grad_accum; ++i) {
      if (!s.fixed_feeds.empty()) {
        micro.push_back(slice_feeds(s.fixed_feeds));
        continue;
      }
      OASES_ASSIGN_OR_RETURN(Batch b, sampler.next(s.batch, s.seq));
      micro.push_back(slice_feeds(feeds_for_batch(s.global.graph, s.roles, b)));
    }
    return micro;
  };
  auto validate = [&]() -> Expected<double> {
    if (!s.fixed_feeds.empty()) return tr.eval_loss(slice_feeds(s.fixed_feeds));
    double sum = 0;
    for (int64_t i = 0; i < a.val_batches; ++i) {
      Batch b = val_sampler.at(i, s.batch, s.seq);
      OASES_ASSIGN_OR_RETURN(double l, tr.eval_loss(slice_feeds(feeds_for_batch(s.global.graph, s.roles, b))));
      sum += l;
    }
    return sum / static_cast<double>(a.val_batches);
  };
  auto dump = [&]() -> Status {
    if (lead) {
      std::error_code ec;
      fs::create_directories(a.dump_grads, ec);
    }
    for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
      std::string name = tr.param_name(i);
      Tensor full = rt.gather(tr.gradient(i), pspecs[i], s.param_shapes[i]);
      if (lead) OASES_RETURN_IF_ERROR(write_tensor_file(full, name, fmt::format("{}/grad_{:04d}_{}.pb", a.dump_grads, i, sanitize(name))));
    }
    if (lead && !a.quiet) std::fprintf(stderr, "wrote %zu gradients to %s\n", tr.training_graph().params.size(), a.dump_grads.c_str());
    return Status::ok();
  };

  if (lead && !a.quiet) {
    // which initializers train, and why each buffer does not (graph/parameters.h)
    for (const std::string& line : describe_parameter_split(s.global.graph, s.global.roles)) std::fprintf(stderr, "%s\n", line.c_str());
  }
  if (a.steps == 0 && !a.dump_grads.empty()) {
    OASES_ASSIGN_OR_RETURN(auto micro, next_feeds());
    OASES_ASSIGN_OR_RETURN(double l, tr.compute_gradients(micro[0]));
    if (lead) std::printf("loss %.6f\n", l);
    OASES_RETURN_IF_ERROR(dump());
  }
  int64_t tokens_per_step = s.batch * s.seq * a.grad_accum;
  int64_t log_every = a.log_every > 0 ? a.log_every : std::max<int64_t>(1, a.steps / 20);
  if (lead && !a.quiet && a.steps > start) {
    int64_t values = 0;
    for (const Shape& sh : s.param_shapes) values += shape_numel(sh);
    std::fprintf(stderr, "training %s: %zu parameters (%lld values), batch %lld x %lld tokens%s, %lld steps%s\n", a.model.c_str(),
                 s.param_shapes.size(), static_cast<long long>(values), static_cast<long long>(s.batch), static_cast<long long>(s.seq),
                 a.grad_accum > 1 ? fmt::format(" x {} micro-batches", a.grad_accum).c_str() : "", static_cast<long long>(a.steps),
                 rt.size() > 1 ? fmt::format(", {} ranks (tp {} x dp {}, {})", rt.size(), a.tp, a.dp,
                                             rt.communicator() ? rt.communicator()->kind() : "local")
                                     .c_str()
                               : "");
  }
  auto run_start = std::chrono::steady_clock::now();
  double first_val = NAN, last_val = NAN;
  if (s.have_val && !a.quiet && start < a.steps && s.fixed_feeds.empty()) {
    OASES_ASSIGN_OR_RETURN(double v, validate());
    first_val = v;
    if (lead) std::fprintf(stderr, "step %lld  val loss %.4f\n", static_cast<long long>(start), v);
  }
  int64_t end = a.stop_after > 0 ? std::min(a.steps, start + a.stop_after) : a.steps;
  OverlapStats overlap;
  nlohmann::json trace_json = nlohmann::json::array();
  // Fault injection for the tests of peer failures: OASES_TEST_FAULT=RANK:STEP:error|exit|hang
  int fault_rank = -1, fault_mode = 0;
  int64_t fault_step = -1;
  if (const char* f = std::getenv("OASES_TEST_FAULT")) {
    char mode[16] = {0};
    if (std::sscanf(f, "%d:%ld:%15s", &fault_rank, &fault_step, mode) == 3) {
      fault_mode = std::string(mode) == "exit" ? 2 : std::string(mode) == "hang" ? 3 : 1;
    }
  }
  ProfileReport prof;
  tr.executor().set_profiling(a.profile);
  for (int64_t step = start; step < end; ++step) {
    if (rt.rank() == fault_rank && step == fault_step) {
      if (fault_mode == 2) std::_Exit(9);
      if (fault_mode == 3) std::this_thread::sleep_for(std::chrono::seconds(4));
      if (fault_mode == 1) return error("injected failure at step {} (OASES_TEST_FAULT)", step + 1);
    }
    OASES_ASSIGN_OR_RETURN(auto micro, next_feeds());
    bool dump_now = !a.dump_grads.empty() && step == start;
    if (lsc.dynamic) tr.set_loss_scale(scaler.scale());
    OASES_ASSIGN_OR_RETURN(StepStats st, tr.step(micro, dump_now ? std::function<Status()>(dump) : std::function<Status()>()));
    if (lsc.dynamic) {
      double used = scaler.scale();
      scaler.update(!st.skipped);
      if (st.skipped && lead && !a.quiet) {
        std::fprintf(stderr, "step %lld: non-finite gradients at loss scale %g; update skipped, scale now %g\n",
                     static_cast<long long>(step + 1), used, scaler.scale());
      }
    }
    if (tracing) {
      std::vector<TraceEvent> ev = tr.executor().take_events();
      int64_t done_steps = step - start;
      const Graph& run_graph = tr.executor().graph();  // the program's graph (with the executor's fused nodes)
      overlap.add(run_graph, ev, st.ms, done_steps >= 1);
      if (!a.trace.empty() && done_steps >= 1 && done_steps <= a.trace_steps) append_trace(run_graph, ev, rt.rank(), &trace_json);
    }
    if (!std::isfinite(st.loss)) return error("step {}: the loss is {} (lower --lr?)", step + 1, st.loss);
    if (a.profile && step > start) prof.add(tr.executor(), st.ms);
    double tps = static_cast<double>(tokens_per_step) / (st.ms / 1000.0);
    int64_t done = step + 1;
    std::optional<double> val;
    if (s.have_val && ((a.val_every > 0 && done % a.val_every == 0) || done == end)) {
      OASES_ASSIGN_OR_RETURN(double v, validate());
      val = v;
      last_val = v;
    }
    if (log) {
      nlohmann::json j{{"step", done}, {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"tokens_per_s", tps}, {"ms", st.ms}};
      if (val) j["val_loss"] = *val;
      if (lsc.dynamic) {
        j["loss_scale"] = scaler.scale();
        j["skipped"] = st.skipped;
      }
      *log << j.dump() << "\n";
      log->flush();
    }
    if (lead && !a.quiet && (done % log_every == 0 || done == end || val)) {
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      double eta = elapsed / static_cast<double>(done - start) * static_cast<double>(a.steps - done);
      std::fprintf(stderr, "step %lld/%lld  loss %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  %.1f ms/step  ETA %s\n",
                   static_cast<long long>(done), static_cast<long long>(a.steps), st.loss,
                   val ? fmt::format("  val loss {:.4f}", *val).c_str() : "", st.lr, st.grad_norm, tps, st.ms, fmt_eta(eta).c_str());
    }
    if (!a.save.empty() && a.save_every > 0 && done % a.save_every == 0 && done != end) OASES_RETURN_IF_ERROR(save(done));
  }
  if (!a.trace.empty()) {
    std::vector<std::string> all = rt.gather_strings(trace_json.dump());
    if (lead) {
      nlohmann::json merged = nlohmann::json::array();
      for (const std::string& part : all) {
        for (auto& e : nlohmann::json::parse(part)) merged.push_back(std::move(e));
      }
      nlohmann::json doc{{"traceEvents", merged},
                         {"displayTimeUnit", "ms"},
                         {"otherData",
                          {{"model", a.model},
                           {"schedule", a.schedule.empty() ? "plain (in line)" : a.schedule},
                           {"chunks", a.chunks},
                           {"tp", a.tp},
                           {"dp", a.dp},
                           {"emulated_link", a.emulate_link}}}};
      std::string tmp = a.trace + ".tmp";
      {
        std::ofstream f(tmp);
        if (!f) return error("{}: cannot open for writing", a.trace);
        f << doc.dump() << "\n";
      }
      std::error_code ec;
      fs::rename(tmp, a.trace, ec);
      if (ec) return error("{}: cannot rename: {}", a.trace, ec.message());
      if (!a.quiet) std::fprintf(stderr, "wrote trace %s (%zu events; open in https://ui.perfetto.dev)\n", a.trace.c_str(), merged.size());
    }
  }
  if (a.profile && lead) prof.print(tr.executor(), "step");
  if (a.overlap_report && lead) overlap.print(sched.has_value() && sched->interleave, a.schedule);
  if (!a.save.empty() && a.steps > 0) {
    OASES_RETURN_IF_ERROR(save(std::max(end, start)));
    if (lead && !a.quiet) std::fprintf(stderr, "saved checkpoint %s\n", a.save.c_str());
  }
  if (!a.export_onnx.empty()) {
    auto full = gathered_params();
    if (lead) {
      OASES_RETURN_IF_ERROR(export_with_initializers(a.model, full, a.export_onnx));
      if (!a.quiet) std::fprintf(stderr, "wrote %s\n", a.export_onnx.c_str());
    }
  }
  if (lead && !a.quiet && std::isfinite(first_val) && std::isfinite(last_val)) {
    std::fprintf(stderr, "validation loss %.4f -> %.4f\n", first_val, last_val);
  }
  return Status::ok();
}

}  // namespace

int run_training(TrainArgs& a, int argc, char** argv) {
  if (a.device == "cuda") {
    if (Status st = cuda_usable(); !st.is_ok()) return fail_with(st);
    if (!a.trace.empty() || a.overlap_report) {
      return fail_with(
          Status::error("--trace and --overlap-report time the CPU executor's threads; with --device cuda use Nsight Systems"));
    }
  }
  // one rank, N threads, or MPI processes
  std::unique_ptr<Communicator> mpi;
  int64_t world = 1;
  if (launched_by_mpi_launcher() && mpi_available()) {
    mpi = mpi_communicator(&argc, &argv);
    mpi->timeout_s = a.comm_timeout;
    world = mpi->size();
    if (a.local_ranks > 0) return fail_with(Status::error("--local-ranks cannot be combined with mpirun/srun"));
  } else if (a.local_ranks > 0) {
    world = a.local_ranks;
  }
  int my_rank = mpi ? mpi->rank() : 0;
  auto setup = prepare(a, world);
  if (!setup) {
    if (my_rank == 0 || !mpi) return fail_with(setup.status());
    return 2;
  }
  Mesh mesh = setup->strategy.mesh;
  LinkModel link;
  if (!a.emulate_link.empty()) {
    auto lm = parse_link_model(a.emulate_link);
    if (!lm) return fail_with(lm.status());
    link = *lm;
  }
  if (mpi) {
    // the cores of a node are shared by the ranks on it
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
    int per_node = local ? std::max(1, std::atoi(local)) : 1;
    int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int threads = a.threads > 0 ? a.threads : std::max(1, hw / per_node);
    kernels::set_num_threads(threads);
    auto rt = RankRuntime::create(mpi.get(), mesh, link);
    if (!rt) return fail_with(rt.status());
    Status st = run_rank(*setup, **rt);
    if (!st.is_ok()) {
      std::fprintf(stderr, "error: rank %d: %s\n", my_rank, st.message().c_str());
      mpi->abort(st.message());
      return 2;
    }
    return 0;
  }
  if (world == 1) {
    auto rt = RankRuntime::create(nullptr, mesh);
    if (!rt) return fail_with(rt.status());
    Status st = run_rank(*setup, **rt);
    return st.is_ok() ? 0 : fail_with(st);
  }
  // N ranks as threads: BLAS single-threaded per rank, the cores shared out
  auto lw = make_local_world(static_cast<int>(world), a.comm_timeout);
  int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int per_rank = a.threads > 0 ? a.threads : std::max(1, hw / static_cast<int>(world));
  std::vector<Status> results(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      kernels::set_num_threads(per_rank);
      auto comm = local_communicator(lw, static_cast<int>(r));
      Status st;
      try {
        auto rt = RankRuntime::create(comm.get(), mesh, link);
        st = rt ? run_rank(*setup, **rt) : rt.status();
      } catch (const std::exception& e) {
        st = Status::error(e.what());
      }
      if (!st.is_ok()) comm->abort(fmt::format("rank {} failed: {}", r, st.message()));
      results[static_cast<size_t>(r)] = st;
    });
  }
  for (auto& t : threads) t.join();
  // report the root cause: the first rank whose error is not a consequence of another's
  for (const Status& st : results) {
    if (!st.is_ok() && st.message().find("stopped: rank") == std::string::npos) return fail_with(st);
  }
  for (const Status& st : results) {
    if (!st.is_ok()) return fail_with(st);
  }
  return 0;
}

}  // namespace oases
