// oases-train MODEL [--data F | --inputs DIR | --synthetic] [--steps N] [--batch B --seq T]
//   [--optimizer sgd|adamw --lr ...] [--save CKPT] [--resume CKPT] [--export-onnx OUT.onnx]
//   [--dump-grads DIR] [--log-json FILE] [--threads T] [--profile]
// Trains an imported model on one rank.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "executor/training.h"
#include "importer/onnx_export.h"
#include "tools/model_loader.h"

using namespace oases;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string model, data, inputs_dir, save, resume, export_onnx, dump_grads, log_json;
  bool synthetic = false, quiet = false, profile = false;
  int64_t steps = 100, batch = 0, seq = 0, grad_accum = 1;
  std::string optimizer = "adamw", loss = "auto", freeze;
  double lr = 1e-3, min_lr = -1, weight_decay = 0.0, momentum = 0.9, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, clip = 1.0;
  int64_t stop_after = 0;
  int64_t warmup = 0, ignore_index = -100, val_every = 0, val_batches = 4, save_every = 0, log_every = 0;
  double val_fraction = 0.1;
  uint64_t seed = 1234;
  int threads = 0;
  bool nesterov = false, no_cosine = false, decay_all = false;
  BindingFlags bind;
};

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

// Binds the token inputs' symbolic dims to [batch, seq]; fixed models give their own batch/seq.
Status bind_token_shapes(const Args& a, ImportOptions* opts, int64_t* batch, int64_t* seq) {
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

}  // namespace

int main(int argc, char** argv) {
  return run_tool([&] {
    Args a;
    CLI::App app{"oases-train: train an ONNX transformer on one rank"};
    app.add_option("model", a.model, "ONNX model file")->required();
    app.add_option("--data", a.data, "Token file: llm.c/nanoGPT uint16 .bin, int32 .i32, or UTF-8 text (bytes)");
    app.add_option("--inputs", a.inputs_dir, "Feed the graph inputs from input_N.pb files (ONNX test-data layout)");
    app.add_flag("--synthetic", a.synthetic, "Random tokens (benchmarks)");
    app.add_option("--steps", a.steps, "Optimizer steps (0 with --dump-grads: gradients only)");
    app.add_option("--batch", a.batch, "Sequences per micro-batch");
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
    app.add_option("--seed", a.seed, "Seed of batch sampling and dropout");
    app.add_option("--val-every", a.val_every, "Validation loss every N steps (0: only at the end)");
    app.add_option("--val-batches", a.val_batches, "Batches per validation");
    app.add_option("--val-fraction", a.val_fraction, "Fraction of the data held out for validation");
    app.add_option("--save", a.save, "Write a checkpoint to CKPT (at the end, and every --save-every steps)");
    app.add_option("--save-every", a.save_every, "Checkpoint every N steps");
    app.add_option("--resume", a.resume, "Continue from a checkpoint");
    app.add_option("--stop-after", a.stop_after, "Stop (and save) after N steps of this run; --steps still sets the schedule");
    app.add_option("--export-onnx", a.export_onnx, "Write the model with the trained weights");
    app.add_option("--dump-grads", a.dump_grads, "Write the first step's gradients (one TensorProto per parameter)");
    app.add_option("--log-json", a.log_json, "One JSON object per step");
    app.add_option("--log-every", a.log_every, "Progress line every N steps (default: about 20 lines a run)");
    app.add_option("--threads", a.threads, "Threads for BLAS and kernels (0: all cores)");
    app.add_flag("-q,--quiet", a.quiet, "No progress lines");
    app.add_flag("--profile", a.profile, "Print the time per op type (and the optimizer's) per step, averaged over the steps after the first");
    a.bind.add_to(app);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

    int sources = (!a.data.empty()) + (!a.inputs_dir.empty()) + a.synthetic;
    if (sources != 1) return fail_with(Status::error("give exactly one of --data FILE, --inputs DIR or --synthetic"));
    if (a.steps < 0 || a.grad_accum < 1) return fail_with(Status::error("--steps must be >= 0 and --grad-accum >= 1"));
    if (a.steps == 0 && a.dump_grads.empty() && a.export_onnx.empty()) {
      return fail_with(Status::error("--steps 0 does nothing without --dump-grads or --export-onnx"));
    }

    ImportOptions opts;
    if (Status s = a.bind.apply(&opts); !s.is_ok()) return fail_with(s);
    std::map<std::string, Tensor> fixed_feeds;  // --inputs
    int64_t batch = 0, seq = 0;
    if (!a.inputs_dir.empty()) {
      if (!fs::is_directory(a.inputs_dir)) return fail_with(error("{}: no such folder", a.inputs_dir));
      std::vector<std::pair<int, std::string>> files;
      std::regex re("input_([0-9]+)\\.pb");
      for (const auto& e : fs::directory_iterator(a.inputs_dir)) {
        std::smatch m;
        std::string n = e.path().filename().string();
        if (std::regex_match(n, m, re)) files.push_back({std::stoi(m[1]), e.path().string()});
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) return fail_with(error("{}: no input_N.pb files", a.inputs_dir));
      ImportOptions probe_opts = opts;
      probe_opts.require_bound_dims = false;
      auto probe = import_onnx_file(a.model, probe_opts);
      if (!probe) return fail_with(probe.status());
      for (size_t i = 0; i < files.size(); ++i) {
        auto t = read_tensor_file(files[i].second);
        if (!t) return fail_with(t.status());
        std::string name = t->first;
        bool known = false;
        for (ValueId v : probe->inputs()) known |= probe->value(v).name == name;
        if (!known) {
          if (i >= probe->inputs().size()) return fail_with(error("{} matches no model input", files[i].second));
          name = probe->value(probe->inputs()[i]).name;
        }
        fixed_feeds[name] = t->second;
        if (!opts.input_shapes.count(name)) opts.input_shapes[name] = t->second.shape();
        if (is_integer(t->second.dtype()) && t->second.rank() == 2 && batch == 0) {
          batch = t->second.shape()[0];
          seq = t->second.shape()[1];
        }
      }
    } else {
      if (Status s = bind_token_shapes(a, &opts, &batch, &seq); !s.is_ok()) return fail_with(s);
    }

    auto loaded = load_model(a.model, opts);
    if (!loaded) return fail_with(loaded.status());
    TrainingSpec spec;
    spec.loss = a.loss;
    spec.ignore_index = a.ignore_index;
    spec.freeze = a.freeze;
    auto tg = build_training_graph(loaded->graph, spec);
    if (!tg) return fail_with(tg.status().with_context(a.model));
    int64_t vocab = tg->vocab;
    if (vocab == 0) {
      // loss inside the model: the token embedding's rows bound the ids
      for (ValueId v : tg->graph.initializers()) {
        const Value& val = tg->graph.value(v);
        for (const Use& u : val.uses) {
          const Node& n = tg->graph.node(u.node);
          if (n.op_type == "Gather" && u.slot == 0 && val.shape.size() == 2) vocab = std::max(vocab, val.shape[0]);
        }
      }
    }
    ValueId targets_value = tg->targets;
    auto roles = fixed_feeds.empty() ? input_roles(tg->graph, targets_value) : Expected<std::vector<InputRole>>(std::vector<InputRole>{});
    if (!roles) return fail_with(roles.status().with_context(a.model));
    if (!fixed_feeds.empty() && tg->appended_loss) {
      // targets: the token input shifted left
      auto token_roles = input_roles(tg->graph, targets_value);
      if (!token_roles) return fail_with(token_roles.status().with_context(a.model));
      for (const InputRole& r : *token_roles) {
        if (r.kind == InputRole::kTokens && fixed_feeds.count(r.name)) {
          fixed_feeds["oases_targets"] = shifted_targets(fixed_feeds[r.name], a.ignore_index);
        }
      }
      if (!fixed_feeds.count("oases_targets")) return fail_with(Status::error("cannot derive next-token targets from --inputs"));
    }

    // data
    TokenData data;
    int64_t split = 0;
    if (!a.data.empty() || a.synthetic) {
      if (a.synthetic) {
        data = synthetic_tokens(std::max<int64_t>(1 << 20, (batch * (seq + 1)) * 16), std::max<int64_t>(vocab, 2), a.seed);
      } else {
        auto d = load_tokens(a.data);
        if (!d) return fail_with(d.status());
        data = std::move(*d);
      }
      if (vocab > 0) {
        if (Status s = check_vocab(data, vocab); !s.is_ok()) return fail_with(s);
      }
      int64_t n = static_cast<int64_t>(data.tokens.size());
      split = n - static_cast<int64_t>(std::floor(static_cast<double>(n) * a.val_fraction));
      if (split < seq + 1) {
        return fail_with(error("{}: {} tokens ({} after holding out {:.0f}% for validation) are fewer than one batch row of {} tokens",
                               a.synthetic ? "synthetic data" : a.data, n, split, a.val_fraction * 100, seq + 1));
      }
    }
    BatchSampler sampler(&data.tokens, 0, split, a.seed);
    BatchSampler val_sampler(&data.tokens, split, static_cast<int64_t>(data.tokens.size()), a.seed + 1);
    bool have_val = static_cast<int64_t>(data.tokens.size()) - split >= seq + 1;

    OptimizerConfig oc;
    oc.kind = a.optimizer;
    oc.lr = a.lr;
    oc.min_lr = a.min_lr;
    oc.warmup = a.warmup;
    oc.total_steps = a.steps;
    oc.cosine = !a.no_cosine;
    oc.weight_decay = a.weight_decay;
    oc.momentum = a.momentum;
    oc.nesterov = a.nesterov;
    oc.beta1 = a.beta1;
    oc.beta2 = a.beta2;
    oc.eps = a.eps;
    oc.clip = a.clip;
    oc.decay_all = a.decay_all;
    const Graph model_graph = tg->graph;
    auto trainer_or = Trainer::create(std::move(*tg), oc, a.threads);
    if (!trainer_or) return fail_with(trainer_or.status().with_context(a.model));
    Trainer& tr = **trainer_or;
    tr.executor().state().seed = a.seed;

    int64_t start = 0;
    if (!a.resume.empty()) {
      auto ck = load_checkpoint(a.resume);
      if (!ck) return fail_with(ck.status());
      if (ck->fingerprint != tr.fingerprint()) {
        return fail_with(error("{}: the checkpoint was written for another model (its parameters differ from {}'s)", a.resume, a.model));
      }
      if (ck->optimizer_kind != a.optimizer) {
        return fail_with(error("{}: the checkpoint holds {} state, this run uses --optimizer {}", a.resume, ck->optimizer_kind, a.optimizer));
      }
      auto params = tr.parameters();
      for (auto& [name, t] : params) {
        auto it = ck->tensors.find(name);
        if (it == ck->tensors.end() || it->second.nbytes() != t.nbytes()) return fail_with(error("{}: parameter '{}' is missing", a.resume, name));
        std::memcpy(t.raw_mutable(), it->second.raw(), t.nbytes());
      }
      tr.optimizer().set_state(ck->tensors, ck->optimizer_t);
      if (!ck->sampler_state.empty()) {
        if (Status s = sampler.set_state(ck->sampler_state); !s.is_ok()) return fail_with(s.with_context(a.resume));
      }
      start = ck->step;
      tr.executor().state().step = static_cast<uint64_t>(start);
      if (!a.quiet) std::fprintf(stderr, "resumed from %s at step %lld\n", a.resume.c_str(), static_cast<long long>(start));
    }
    auto save = [&](int64_t step) -> Status {
      Checkpoint ck;
      ck.fingerprint = tr.fingerprint();
      ck.step = step;
      ck.optimizer_kind = a.optimizer;
      ck.optimizer_t = tr.optimizer().steps_taken();
      ck.sampler_state = sampler.state();
      ck.seed = a.seed;
      ck.tensors = tr.parameters();
      for (auto& [k, v] : tr.optimizer().state()) ck.tensors[k] = v;
      return save_checkpoint(ck, a.save);
    };

    std::unique_ptr<std::ofstream> log;
    if (!a.log_json.empty()) {
      log = std::make_unique<std::ofstream>(a.log_json, std::ios::app);
      if (!*log) return fail_with(error("{}: cannot open for writing", a.log_json));
    }
    auto next_feeds = [&]() -> Expected<std::vector<std::map<std::string, Tensor>>> {
      std::vector<std::map<std::string, Tensor>> micro;
      for (int64_t i = 0; i < a.grad_accum; ++i) {
        if (!fixed_feeds.empty()) {
          micro.push_back(fixed_feeds);
          continue;
        }
        OASES_ASSIGN_OR_RETURN(Batch b, sampler.next(batch, seq));
        micro.push_back(feeds_for_batch(tr.training_graph().graph, *roles, b));
      }
      return micro;
    };
    auto validate = [&]() -> Expected<double> {
      if (!fixed_feeds.empty()) return tr.eval_loss(fixed_feeds);
      double s = 0;
      for (int64_t i = 0; i < a.val_batches; ++i) {
        Batch b = val_sampler.at(i, batch, seq);
        OASES_ASSIGN_OR_RETURN(double l, tr.eval_loss(feeds_for_batch(tr.training_graph().graph, *roles, b)));
        s += l;
      }
      return s / static_cast<double>(a.val_batches);
    };
    auto dump = [&]() -> Status {
      std::error_code ec;
      fs::create_directories(a.dump_grads, ec);
      for (size_t i = 0; i < tr.training_graph().params.size(); ++i) {
        std::string name = tr.param_name(i);
        OASES_RETURN_IF_ERROR(write_tensor_file(tr.gradient(i), name, fmt::format("{}/grad_{:04d}_{}.pb", a.dump_grads, i, sanitize(name))));
      }
      if (!a.quiet) std::fprintf(stderr, "wrote %zu gradients to %s\n", tr.training_graph().params.size(), a.dump_grads.c_str());
      return Status::ok();
    };

    if (a.steps == 0) {
      if (!a.dump_grads.empty()) {
        auto micro = next_feeds();
        if (!micro) return fail_with(micro.status());
        auto l = tr.compute_gradients((*micro)[0]);
        if (!l) return fail_with(l.status());
        std::printf("loss %.6f\n", *l);
        if (Status s = dump(); !s.is_ok()) return fail_with(s);
      }
    }
    int64_t tokens_per_step = batch * seq * a.grad_accum;
    int64_t log_every = a.log_every > 0 ? a.log_every : std::max<int64_t>(1, a.steps / 20);
    if (!a.quiet && a.steps > start) {
      std::fprintf(stderr, "training %s: %zu parameters (%lld values), batch %lld x %lld tokens%s, %lld steps\n", a.model.c_str(),
                   tr.training_graph().params.size(),
                   static_cast<long long>([&] {
                     int64_t n = 0;
                     for (auto& [k, t] : tr.parameters()) n += t.numel();
                     return n;
                   }()),
                   static_cast<long long>(batch), static_cast<long long>(seq),
                   a.grad_accum > 1 ? fmt::format(" x {} micro-batches", a.grad_accum).c_str() : "", static_cast<long long>(a.steps));
    }
    auto run_start = std::chrono::steady_clock::now();
    double first_val = NAN, last_val = NAN;
    if (have_val && !a.quiet && start < a.steps && fixed_feeds.empty()) {
      auto v = validate();
      if (!v) return fail_with(v.status());
      first_val = *v;
      std::fprintf(stderr, "step %lld  val loss %.4f\n", static_cast<long long>(start), *v);
    }
    int64_t end = a.stop_after > 0 ? std::min(a.steps, start + a.stop_after) : a.steps;
    std::map<std::string, std::pair<double, int>> by_op;  // --profile: op type -> (ms, nodes)
    std::vector<double> by_node;                            // --profile: instruction -> ms
    double profiled_ms = 0;
    int profiled_steps = 0;
    tr.executor().set_profiling(a.profile);
    for (int64_t step = start; step < end; ++step) {
      auto micro = next_feeds();
      if (!micro) return fail_with(micro.status());
      bool dump_now = !a.dump_grads.empty() && step == start;
      auto st = tr.step(*micro, dump_now ? std::function<Status()>(dump) : std::function<Status()>());
      if (!st) return fail_with(st.status());
      if (!std::isfinite(st->loss)) return fail_with(error("step {}: the loss is {} (lower --lr?)", step + 1, st->loss));
      if (a.profile && step > start) {
        const Program& p = tr.executor().program();
        for (size_t i = 0; i < p.instrs.size(); ++i) {
          const Node& n = p.graph.node(p.instrs[i].node);
          auto& e = by_op[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type];
          e.first += tr.executor().node_ms()[i];
          if (profiled_steps == 0) e.second++;
          by_node.resize(p.instrs.size());
          by_node[i] += tr.executor().node_ms()[i];
        }
        profiled_ms += st->ms;
        profiled_steps++;
      }
      double tps = static_cast<double>(tokens_per_step) / (st->ms / 1000.0);
      int64_t done = step + 1;
      std::optional<double> val;
      if (have_val && ((a.val_every > 0 && done % a.val_every == 0) || done == end)) {
        auto v = validate();
        if (!v) return fail_with(v.status());
        val = *v;
        last_val = *v;
      }
      if (log) {
        nlohmann::json j{{"step", done}, {"loss", st->loss}, {"lr", st->lr}, {"grad_norm", st->grad_norm}, {"tokens_per_s", tps}, {"ms", st->ms}};
        if (val) j["val_loss"] = *val;
        *log << j.dump() << "\n";
        log->flush();
      }
      if (!a.quiet && (done % log_every == 0 || done == end || val)) {
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
        double eta = elapsed / static_cast<double>(done - start) * static_cast<double>(a.steps - done);
        std::fprintf(stderr, "step %lld/%lld  loss %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  %.1f ms/step  ETA %s\n",
                     static_cast<long long>(done), static_cast<long long>(a.steps), st->loss,
                     val ? fmt::format("  val loss {:.4f}", *val).c_str() : "", st->lr, st->grad_norm, tps, st->ms, fmt_eta(eta).c_str());
      }
      if (!a.save.empty() && a.save_every > 0 && done % a.save_every == 0 && done != end) {
        if (Status s = save(done); !s.is_ok()) return fail_with(s);
      }
    }
    if (a.profile && profiled_steps > 0) {
      std::vector<std::pair<double, std::string>> rows;
      double nodes_ms = 0;
      for (auto& [op, e] : by_op) {
        rows.push_back({e.first / profiled_steps, op});
        nodes_ms += e.first / profiled_steps;
      }
      rows.push_back({profiled_ms / profiled_steps - nodes_ms, "(optimizer and the rest of the step)"});
      std::sort(rows.rbegin(), rows.rend());
      double total = profiled_ms / profiled_steps;
      std::printf("profile (ms per step, by op type, over %d steps):\n", profiled_steps);
      for (auto& [t, op] : rows) {
        int nodes = by_op.count(op) ? by_op[op].second : 0;
        std::printf("  %-36s %4d nodes %9.2f ms %5.1f%%\n", op.c_str(), nodes, t, 100.0 * t / total);
      }
      std::vector<std::pair<double, size_t>> nodes;
      for (size_t i = 0; i < by_node.size(); ++i) nodes.push_back({by_node[i] / profiled_steps, i});
      std::sort(nodes.rbegin(), nodes.rend());
      const Program& p = tr.executor().program();
      std::printf("slowest nodes (ms per step):\n");
      for (size_t j = 0; j < std::min<size_t>(15, nodes.size()); ++j) {
        const Node& n = p.graph.node(p.instrs[nodes[j].second].node);
        std::printf("  %9.2f ms  %s -> %s\n", nodes[j].first, n.describe().c_str(),
                    n.outputs.empty() || n.outputs[0] == kNoId ? "" : describe_value(p.graph, n.outputs[0]).c_str());
      }
      std::printf("activation arena %.1f MiB (%.1f MiB without reuse)\n", static_cast<double>(p.memory.arena_bytes) / (1 << 20),
                  static_cast<double>(p.memory.total_bytes) / (1 << 20));
    }
    if (!a.save.empty() && a.steps > 0) {
      if (Status s = save(std::max(end, start)); !s.is_ok()) return fail_with(s);
      if (!a.quiet) std::fprintf(stderr, "saved checkpoint %s\n", a.save.c_str());
    }
    if (!a.export_onnx.empty()) {
      if (Status s = export_with_initializers(a.model, tr.parameters(), a.export_onnx); !s.is_ok()) return fail_with(s);
      if (!a.quiet) std::fprintf(stderr, "wrote %s\n", a.export_onnx.c_str());
    }
    if (!a.quiet && std::isfinite(first_val) && std::isfinite(last_val)) {
      std::fprintf(stderr, "validation loss %.4f -> %.4f\n", first_val, last_val);
    }
    return 0;
  });
}
