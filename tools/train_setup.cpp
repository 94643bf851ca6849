#include "tools/train_setup.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <tuple>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "executor/device.h"
#include "executor/distributed.h"
#include "graph/atomic_file.h"
#include "planner/plan.h"

namespace fs = std::filesystem;

namespace oases {

namespace {

Status bind_token_shapes(const TrainArgs& a, ImportOptions* opts, int64_t* batch, int64_t* seq) {
  ImportOptions probe_opts = *opts;
  probe_opts.require_bound_dims = false;
  OASES_ASSIGN_OR_RETURN(Graph probe, import_onnx_file(a.model, probe_opts));
  int64_t b = a.batch, t = a.seq;
  // token inputs [B, T]; images [B, C, H, W] (InputRole::kImage) take the batch size only
  auto is_image = [](const Value& val) { return is_floating(val.dtype) && val.shape.size() >= 3; };
  for (ValueId v : probe.inputs()) {
    const Value& val = probe.value(v);
    if (opts->input_shapes.count(val.name)) continue;
    if (is_image(val)) {
      for (size_t d = 1; d < val.shape.size(); ++d) {
        if (val.shape[d] < 0)
          return error("image input '{}' {} has a dynamic dim {}: give its shape with --dim", val.name, shape_str(val.shape), d);
      }
    } else if (!is_integer(val.dtype) || val.shape.size() != 2) {
      continue;
    }
    for (int d = 0; d < (is_image(val) ? 1 : 2); ++d) {
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
    if (opts->input_shapes.count(val.name)) continue;
    if (is_integer(val.dtype) && val.shape.size() == 2) opts->input_shapes[val.name] = {b, t};
    if (is_image(val)) {
      Shape image = val.shape;
      image[0] = b;
      opts->input_shapes[val.name] = image;
    }
  }
  *batch = b;
  *seq = t;
  return Status::ok();
}

// The run's layout: the plan file's (adopted where the command line left it open), tp x dp from
// the world size.
Expected<Plan> run_plan(TrainArgs& a, int64_t world) {
  Plan plan;
  if (!a.plan.empty()) {
    OASES_ASSIGN_OR_RETURN(plan, Plan::read(a.plan));
    RunShape run{a.tp, a.dp, a.batch, a.seq, a.chunks, a.schedule};
    OASES_RETURN_IF_ERROR(adopt_plan(plan, a.plan, world, &run));
    a.tp = run.tp;
    a.dp = run.dp;
    a.batch = run.batch;
    a.seq = run.seq;
    a.chunks = run.chunks;
    a.schedule = run.schedule;
  } else {
    plan.vocab_parallel = !a.no_vocab_parallel;
  }
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
  if (a.chunks <= 0) a.chunks = a.schedule.empty() ? 1 : 2;
  plan.mesh.tp = a.tp;
  plan.mesh.dp = a.dp;
  if (plan.mesh.ranks <= 0) plan.mesh.ranks = world;
  plan.mesh.schedule = a.schedule;
  plan.mesh.chunks = a.chunks;
  plan.sequence_parallel = plan.sequence_parallel || a.sequence_parallel;
  plan.collective_matmul = plan.collective_matmul || a.collective_matmul;
  bool cm = plan.collective_matmul;
  for (const PartLayout& l : plan.mesh.parts) cm = cm || l.collective_matmul;
  if (cm) {
    bool sp = plan.sequence_parallel;
    for (const PartLayout& l : plan.mesh.parts) sp = sp || l.sequence_parallel;
    if (!sp) return Status::error("--collective-matmul decomposes the gathers and scatters of sequence parallelism: add --sequence-parallel");
  }
  plan.dp_bucket_bytes = static_cast<int64_t>(a.dp_bucket_mb * (1 << 20));
  // the compute type: --dtype, else the plan file's (what oases-plan planned for), else fp32
  if (a.dtype.empty()) a.dtype = a.plan.empty() ? "fp32" : plan.dtype;
  plan.dtype = a.dtype;
  return plan;
}

// --inputs DIR: input_N.pb files by name (or position), their shapes bound.
Status read_input_files(const TrainArgs& a, ImportOptions* opts, TrainSetup* s) {
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
  // an image classifier's targets (its logits [B, classes] give no tokens to shift)
  fs::path labels = fs::path(a.inputs_dir) / "labels.pb";
  if (fs::exists(labels)) {
    OASES_ASSIGN_OR_RETURN(auto t, read_tensor_file(labels.string()));
    if (!is_integer(t.second.dtype()) || t.second.rank() != 1) {
      return error("{}: class labels must be one integer per image, [B]; got {} {}", labels.string(), dtype_name(t.second.dtype()),
                   shape_str(t.second.shape()));
    }
    Tensor l(DType::kI64, t.second.shape());
    for (int64_t i = 0; i < l.numel(); ++i)
      l.mutable_data<int64_t>()[i] = static_cast<int64_t>(load_as_double(t.second.raw(), t.second.dtype(), i));
    s->class_labels = l;
  }
  ImportOptions probe_opts = *opts;
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
    s->fixed_feeds[name] = t.second;
    if (!opts->input_shapes.count(name)) opts->input_shapes[name] = t.second.shape();
    if (is_integer(t.second.dtype()) && t.second.rank() == 2 && s->batch == 0) {
      s->batch = t.second.shape()[0];
      s->seq = t.second.shape()[1];
    }
  }
  return Status::ok();
}

// How the batches feed the inputs, and the tokens (with the validation split).
Status prepare_data(TrainSetup& s) {
  const TrainArgs& a = s.a;
  const TrainingGraph& train = s.gp.train;
  if (s.fixed_feeds.empty()) {
    auto roles = input_roles(train.graph, train.targets);
    if (!roles) return roles.status().with_context(a.model);
    s.roles = std::move(*roles);
  } else if (train.appended_loss) {
    auto token_roles = input_roles(train.graph, train.targets);
    if (!token_roles) return token_roles.status().with_context(a.model);
    const Shape& targets = train.graph.value(train.targets).shape;
    if (s.class_labels) {
      if (s.class_labels->shape() != targets) {
        return error("{}/labels.pb: {} labels, the model's targets are {}", a.inputs_dir, shape_str(s.class_labels->shape()),
                     shape_str(targets));
      }
      s.fixed_feeds["oases_targets"] = *s.class_labels;
    }
    // the decoder's input when there is one (an encoder-decoder model), else the token input
    for (InputRole::Kind kind : {InputRole::kDecoderTokens, InputRole::kTokens}) {
      for (const InputRole& r : *token_roles) {
        if (r.kind == kind && s.fixed_feeds.count(r.name) && !s.fixed_feeds.count("oases_targets")) {
          s.fixed_feeds["oases_targets"] = shifted_targets(s.fixed_feeds[r.name], a.ignore_index);
        }
      }
    }
    if (!s.fixed_feeds.count("oases_targets")) {
      if (targets.size() == 1) {
        return error(
            "{}: the logits are one row of class scores per input, so the loss needs class labels: put them in {}/labels.pb "
            "(int64 {})",
            a.model, a.inputs_dir, shape_str(targets));
      }
      return Status::error("cannot derive next-token targets from --inputs");
    }
  }
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
  return Status::ok();
}

// The files the run writes (at its end, for most) must be creatable now: a missing or read-only
// folder found after hours of training loses them.
Status check_output_paths(const TrainArgs& a) {
  std::pair<const char*, const std::string*> files[] = {{"--save", &a.save},
                                                        {"--export-onnx", &a.export_onnx},
                                                        {"--log-json", &a.log_json},
                                                        {"--trace", &a.trace},
                                                        {"--export-plan", &a.export_plan}};
  for (const auto& [flag, path] : files) {
    if (!path->empty()) OASES_RETURN_IF_ERROR(check_output_file(*path, fmt::format("{} {}", flag, *path)));
  }
  if (!a.dump_grads.empty()) OASES_RETURN_IF_ERROR(check_output_folder(a.dump_grads, "--dump-grads " + a.dump_grads));
  return Status::ok();
}

void print_schedule(const Graph& g, const std::vector<ScheduledOp>& order) {
  for (const ScheduledOp& op : order) {
    const Node& n = g.node(op.node);
    const char* k = op.kind == ScheduledOp::Kind::kCompute ? "    " : op.kind == ScheduledOp::Kind::kCommStart ? "START" : "WAIT ";
    std::fprintf(stderr, "%s c%-2d %-9s %-22s %s\n", k, n.chunk,
                 n.phase == Node::Phase::kForward    ? "fwd"
                 : n.phase == Node::Phase::kLoss     ? "loss"
                 : n.phase == Node::Phase::kBackward ? "bwd"
                                                     : "recompute",
                 n.op_type.c_str(), n.scope.c_str());
  }
}

}  // namespace

Expected<TrainSetup> prepare_training(const TrainArgs& args, int64_t world) {
  TrainSetup s;
  s.a = args;
  TrainArgs& a = s.a;
  int sources = (!a.data.empty()) + (!a.inputs_dir.empty()) + a.synthetic;
  if (sources != 1) return Status::error("give exactly one of --data FILE, --inputs DIR or --synthetic");
  if (a.steps < 0 || a.grad_accum < 1) return Status::error("--steps must be >= 0 and --grad-accum >= 1");
  OASES_RETURN_IF_ERROR(check_output_paths(a));
  if (a.steps == 0 && a.dump_grads.empty() && a.export_onnx.empty() && a.export_plan.empty()) {
    return Status::error("--steps 0 does nothing without --dump-grads, --export-onnx or --export-plan");
  }
  // pipeline stages: the world is pp meshes of tp x dp ranks; a version-3 plan names them
  if (!a.plan.empty()) {
    OASES_ASSIGN_OR_RETURN(Plan from_file, Plan::read(a.plan));
    const Plan::Pipeline& fp = from_file.pipeline;
    if (fp.stages > 1 && a.pp <= 1) {
      a.pp = fp.stages;
      if (a.micro_batches <= 0) a.micro_batches = fp.micro_batches;
      if (a.stages.empty()) a.stages = fp.cuts;
      if (!fp.schedule.empty()) a.pipeline = fp.schedule;
      if (a.stage_meshes.empty()) a.stage_meshes = stage_meshes_string(fp.meshes);
    } else if (fp.stages > 1 && a.pp != fp.stages) {
      return error("{}: the plan has {} pipeline stages, --pp says {}", a.plan, fp.stages, a.pp);
    }
  }
  const bool piped = a.pp > 1;
  if (!piped && (a.micro_batches > 0 || !a.stages.empty() || !a.stage_meshes.empty()))
    return Status::error("--micro-batches, --stages and --stage-meshes need --pp 2 or more");
  // --stage-meshes: each stage its own tp x dp (and schedule); the world is the sum of the meshes
  std::vector<Plan::Pipeline::StageMesh> meshes;
  if (piped && !a.stage_meshes.empty()) {
    OASES_ASSIGN_OR_RETURN(meshes, parse_stage_meshes(a.stage_meshes, a.pp));
    if (a.tp > 0 || a.dp > 0) return Status::error("give --tp/--dp (every stage) or --stage-meshes (each stage), not both");
    int64_t sum = 0;
    for (const auto& m : meshes) sum += m.tp * m.dp;
    if (sum != world) return error("--stage-meshes {} needs {} ranks, the run has {}", a.stage_meshes, sum, world);
    a.tp = meshes[0].tp;
    a.dp = meshes[0].dp;
    if (!meshes[0].schedule.empty()) a.schedule = meshes[0].schedule;
  }
  if (piped) {
    if (meshes.empty() && world % a.pp != 0)
      return error("--pp {} does not divide the {} ranks of this run (world size must equal pp x tp x dp)", a.pp, world);
    if (a.grad_accum > 1) return Status::error("--grad-accum with --pp: the pipeline's --micro-batches accumulate the gradients");
    if (a.device != "cpu") return Status::error("--pp runs on the CPU only: cross-stage transfers have no GPU path yet");
    if (a.micro_batches <= 0) a.micro_batches = a.pp;
  }
  const int64_t stage_world = !piped ? world : meshes.empty() ? world / a.pp : meshes[0].tp * meshes[0].dp;
  if (a.hosts > 0 && world % a.hosts != 0) return error("--hosts {} does not divide the {} ranks of this run", a.hosts, world);
  if (a.hosts > 1) {
    for (int64_t r = 0; r < world; ++r) s.host_of.push_back(static_cast<int>(r / (world / a.hosts)));
  }
  // a plan fixes the layout, the shapes and the schedule where the command line does not
  OASES_ASSIGN_OR_RETURN(Plan plan, run_plan(a, stage_world));
  if (piped) plan.mesh.chunks = a.chunks * a.micro_batches;  // every micro-batch's chunks, cut into stages later
  ImportOptions opts;
  OASES_RETURN_IF_ERROR(a.bind.apply(&opts));
  if (!a.inputs_dir.empty()) {
    OASES_RETURN_IF_ERROR(read_input_files(a, &opts, &s));
  } else {
    OASES_RETURN_IF_ERROR(bind_token_shapes(a, &opts, &s.batch, &s.seq));
  }
  plan.batch = s.batch;
  plan.seq = s.seq;
  if (piped) OASES_RETURN_IF_ERROR(check_pipeline_batch(s.batch, a.dp, a.micro_batches, a.chunks));
  for (const auto& m : meshes) OASES_RETURN_IF_ERROR(check_pipeline_batch(s.batch, m.dp, a.micro_batches, a.chunks));
  OASES_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(a.model, opts));
  TrainingSpec spec;
  spec.loss = a.loss;
  spec.ignore_index = a.ignore_index;
  spec.freeze = a.freeze;
  spec.train = a.train;
  GlobalProgramOptions go;
  go.model_path = a.model;
  go.plan_path = a.plan;
  go.partition = !a.export_plan.empty();
  go.pipeline = a.pp > 1;
  std::vector<StageCut> cuts;
  if (piped) {
    // the stages' block ranges first: the programs mark the values that cross them
    int blocks = count_blocks(loaded.graph);
    if (blocks == 0) return error("{}: no transformer blocks found; pipeline stages are cut at block boundaries", a.model);
    OASES_ASSIGN_OR_RETURN(cuts, cut_stages(blocks, static_cast<int>(a.pp), a.stages));
    go.stage_cuts = cuts;
  }
  // stages with another mesh than the first: their own program of the same training graph, laid
  // out by Megatron's rules on their tp x dp (a plan file's per-parameter specs are the first's)
  std::optional<Graph> forward;
  if (!meshes.empty()) forward = loaded.graph;
  OASES_ASSIGN_OR_RETURN(s.gp, build_global_program(std::move(loaded.graph), spec, plan, stage_world, go));
  // one program per distinct (tp, dp, schedule); the first stage's is s.gp (null here)
  std::map<std::tuple<int64_t, int64_t, std::string>, std::shared_ptr<const GlobalProgram>> built{{{a.tp, a.dp, a.schedule}, nullptr}};
  for (size_t k = 0; k < meshes.size(); ++k) {
    const auto& m = meshes[k];
    const std::string sched = m.schedule.empty() ? a.schedule : m.schedule;
    auto same = built.find({m.tp, m.dp, sched});
    if (same != built.end()) {
      s.stage_gp.push_back(same->second);
      continue;
    }
    Plan ps = plan;
    ps.mesh.tp = m.tp;
    ps.mesh.dp = m.dp;
    ps.mesh.ranks = m.tp * m.dp;
    ps.mesh.mesh = Mesh{};
    ps.mesh.parts.clear();
    ps.mesh.schedule = sched;
    ps.mesh.recompute.reset();
    ps.parameters.clear();
    GlobalProgramOptions gs = go;
    gs.plan_path.clear();
    auto gk = build_global_program(*forward, spec, ps, m.tp * m.dp, gs);
    if (!gk) return gk.status().with_context(fmt::format("stage {} (tp {} x dp {})", k, m.tp, m.dp));
    s.stage_gp.push_back(std::make_shared<const GlobalProgram>(std::move(*gk)));
    built.emplace(std::make_tuple(m.tp, m.dp, sched), s.stage_gp.back());
  }
  const TrainingGraph& train = s.gp.train;
  if (piped) {
    PipelineLayout pl;
    pl.stages = static_cast<int>(a.pp);
    pl.micro_batches = static_cast<int>(a.micro_batches);
    pl.chunks = static_cast<int>(a.chunks);
    pl.set_uniform(stage_world);
    for (size_t k = 0; k < meshes.size(); ++k) pl.stage_ranks[k] = meshes[k].tp * meshes[k].dp;
    OASES_ASSIGN_OR_RETURN(pl.schedule, parse_pipeline(a.pipeline));
    pl.cuts = cuts;
    if (!s.host_of.empty()) {
      pl.hosts.assign(s.host_of.begin(), s.host_of.end());
      if (!a.emulate_link.empty()) {
        OASES_ASSIGN_OR_RETURN(LinkModel lm, parse_link_model(a.emulate_link));
        pl.inter_gbps = lm.bandwidth_gbps;
        pl.inter_latency_us = lm.latency_us;
      }
    }
    s.pipe = pl;
  }
  s.vocab = train.vocab;
  if (s.vocab == 0) {
    for (ValueId v : train.graph.initializers()) {
      const Value& val = train.graph.value(v);
      for (const Use& u : val.uses) {
        const Node& n = train.graph.node(u.node);
        if (n.op_type == "Gather" && u.slot == 0 && val.shape.size() == 2) s.vocab = std::max(s.vocab, val.shape[0]);
      }
    }
  }
  OASES_RETURN_IF_ERROR(prepare_data(s));
  if (!a.export_plan.empty()) {
    nlohmann::json j = plan_to_json(train.graph, *s.gp.partitioned, s.gp.sharding, s.gp.strategy, a.model);
    if (s.pipe) {
      // one stage's layout (every stage's) and the stages: oases-train --plan runs it again
      j["version"] = kPlanVersionPipeline;
      j["pipeline"] = Plan::Pipeline{s.pipe->stages, s.pipe->micro_batches, stages_string(s.pipe->cuts), pipeline_name(s.pipe->schedule), meshes}.to_json();
    }
    OASES_RETURN_IF_ERROR(write_file_atomically(a.export_plan, j.dump(2) + "\n"));
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
  for (size_t i = 0; i < train.params.size(); ++i) {
    const Value& v = train.graph.value(train.params[i]);
    s.fingerprint += fmt::format("{}:{}{};", v.name, dtype_name(v.dtype), shape_str(v.shape));
  }
  s.model_hash = fnv1a(s.fingerprint +
                           fmt::format("nodes={};tp={};dp={};pp={};stages={};meshes={};", train.graph.num_nodes(), a.tp, a.dp, a.pp,
                                       s.pipe ? stages_string(s.pipe->cuts) : "", a.stage_meshes) +
                       binary_identity());
  return s;
}

// This rank's program (planner/rank_program.h) bound to the executor in a Trainer.
Expected<std::unique_ptr<Trainer>> make_trainer(const TrainSetup& s, RankRuntime& rt, std::vector<std::unique_ptr<CommGroup>>* nccl_groups,
                                                std::optional<ScheduleOptions>* sched, StageProgramInfo* stage) {
  const TrainArgs& a = s.a;
  const int64_t world_rank = rt.communicator() ? rt.communicator()->rank() : 0;
  bool lead = world_rank == 0;
  RankProgramOptions ro;
  ro.device = a.device;
  RankProgram rp;
  if (s.pipe) {
    if (!stage) return Status::error("internal: a pipeline rank's trainer needs its stage record");
    std::vector<const GlobalProgram*> stages;
    for (int k = 0; k < s.pipe->stages; ++k) stages.push_back(&s.stage_program(k));
    OASES_ASSIGN_OR_RETURN(rp, build_stage_program(stages, *s.pipe, world_rank, ro, stage));
    if (a.memory_report && rt.rank() == 0) {
      std::fprintf(stderr, "stage %d (%s): blocks %d-%d, %d sends and %d receives a step, at most %d micro-batches in flight, arena %.1f KiB\n",
                   stage->stage, a.pipeline.c_str(), s.pipe->cuts[static_cast<size_t>(stage->stage)].first,
                   s.pipe->cuts[static_cast<size_t>(stage->stage)].last, stage->sends, stage->receives, stage->peak_in_flight,
                   static_cast<double>(rp.program.memory.arena_bytes) / 1024.0);
    }
  } else {
    OASES_ASSIGN_OR_RETURN(rp, build_rank_program(s.gp, rt.rank(), ro));
    if (a.memory_report && rt.rank() == 0) {
      std::fprintf(stderr, "rank 0: activation arena %.1f MiB at its peak (%.1f MiB without reuse), parameters %.1f MiB\n",
                   static_cast<double>(rp.program.memory.arena_bytes) / (1 << 20), static_cast<double>(rp.program.memory.total_bytes) / (1 << 20),
                   static_cast<double>(rp.param_bytes) / (1 << 20));
    }
  }
  ExecOptions eo;
  eo.threads = a.threads;
  eo.groups = rt.axis_groups();
  eo.comm = rt.communicator();
  eo.device = a.device;
  eo.order = rp.order;
  if (a.device == "cuda") {
    // one GPU per rank (the node-local rank picks it); collectives over NCCL, bootstrapped over
    // this run's communicator
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!local) local = std::getenv("SLURM_LOCALID");
    OASES_RETURN_IF_ERROR(cuda_select_device(local ? std::atoi(local) : rt.rank()));
    if (rt.distributed()) {
      OASES_ASSIGN_OR_RETURN(*nccl_groups, make_nccl_groups(rt.communicator(), rt.mesh(), rt.rank(), a.comm_timeout));
      eo.groups.clear();
      for (auto& g : *nccl_groups) eo.groups.push_back(g.get());
    }
  }
  *sched = rp.schedule;
  if (lead && rp.schedule && std::getenv("OASES_DUMP_SCHEDULE")) print_schedule(rp.train.graph, rp.order);
  if (lead && (a.memory_report || a.overlap_report) && rp.schedule) {
    std::fprintf(stderr, "schedule %s, %lld chunks: %d recomputed nodes (%d collectives); activations kept for backward per block%s:\n",
                 rp.schedule->name.c_str(), static_cast<long long>(a.chunks), rp.recompute.nodes, rp.recompute.collectives,
                 s.pipe ? " (stage 0, every micro-batch)" : "");
    for (const auto& [layer, bytes] : rp.saved_bytes) {
      std::string where = layer < 0 ? std::string("outside blocks") : fmt::format("layer {}", layer);
      std::fprintf(stderr, "  %s: %d tensors, %.1f KiB\n", where.c_str(), rp.saved_count.at(layer), static_cast<double>(bytes) / 1024.0);
    }
  }
  OASES_ASSIGN_OR_RETURN(Program compiled, compile_program(std::move(rp.program)));
  return Trainer::create(std::move(rp.train), s.oc, eo, std::move(compiled));
}

}  // namespace oases
