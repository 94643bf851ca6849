#include "tools/train_setup.h"

#include <nlohmann/json.hpp>

#include "executor/distributed.h"
#include "graph/atomic_file.h"
#include "planner/pipeline.h"
#include "planner/plan.h"
#include "tools/train_inputs.h"

namespace oases {

namespace {

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
  plan.mesh().tp = a.tp;
  plan.mesh().dp = a.dp;
  if (plan.mesh().ranks <= 0) plan.mesh().ranks = world;
  plan.mesh().schedule = a.schedule;
  plan.mesh().chunks = a.chunks;
  plan.sequence_parallel = plan.sequence_parallel || a.sequence_parallel;
  plan.collective_matmul = plan.collective_matmul || a.collective_matmul;
  bool cm = plan.collective_matmul;
  for (const PartLayout& l : plan.mesh().parts) cm = cm || l.collective_matmul;
  if (cm) {
    bool sp = plan.sequence_parallel;
    for (const PartLayout& l : plan.mesh().parts) sp = sp || l.sequence_parallel;
    if (!sp) return Status::error("--collective-matmul decomposes the gathers and scatters of sequence parallelism: add --sequence-parallel");
  }
  plan.dp_bucket_bytes = static_cast<int64_t>(a.dp_bucket_mb * (1 << 20));
  if (a.zero >= 0) plan.zero = a.zero;
  if (plan.zero > 0 && a.device == "cuda") {
    return Status::error(kZeroNotOnGpu);
  }
  // the compute type: --dtype, else the plan file's (what oases-plan planned for), else fp32
  if (a.dtype.empty()) a.dtype = a.plan.empty() ? "fp32" : plan.dtype;
  plan.dtype = a.dtype;
  return plan;
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


// --pp: the plan file's stages where the command line names none, and the pipeline flags checked;
// `meshes` receives each stage's mesh (--stage-meshes, or the plan file's stages, `*from_plan` then
// true: they run as the file has them). Returns the ranks of the first stage's mesh (without
// stages: the world's).
Expected<int64_t> resolve_stages(TrainArgs& a, int64_t world, std::vector<MeshPlan>* meshes, bool* from_plan) {
  *from_plan = false;
  // pipeline stages: the world is pp meshes of tp x dp ranks; a plan of several stages names them
  if (!a.plan.empty()) {
    OASES_ASSIGN_OR_RETURN(Plan from_file, Plan::read(a.plan));
    const int64_t S = from_file.num_stages();
    if (S > 1 && a.pp <= 1) {
      a.pp = S;
      if (a.micro_batches <= 0) a.micro_batches = from_file.micro_batches;
      a.pipeline = from_file.pipeline;
      if (a.virtual_stages <= 1) a.virtual_stages = from_file.virtual_stages;
      if (a.stages.empty() && a.stage_meshes.empty()) {
        if (from_file.world() != world)
          return error("{}: the plan's {} stages need {} ranks, this run has {} (run it with --local-ranks {} or mpirun -np {})", a.plan, S,
                       from_file.world(), world, from_file.world(), from_file.world());
        *from_plan = true;
        *meshes = from_file.stages;
      } else {
        // the command line recuts the stages or puts them on other meshes: the rest from the file
        if (a.stages.empty()) a.stages = from_file.cuts();
        const MeshPlan& m0 = from_file.mesh();
        bool own = std::any_of(from_file.stages.begin(), from_file.stages.end(),
                               [&](const MeshPlan& m) { return m.tp != m0.tp || m.dp != m0.dp || m.schedule != m0.schedule; });
        if (a.stage_meshes.empty() && own) a.stage_meshes = stage_meshes_string(from_file.stages);
      }
    } else if (S > 1 && a.pp != S) {
      return error("{}: the plan has {} pipeline stages, --pp says {}", a.plan, S, a.pp);
    }
  }
  const bool piped = a.pp > 1;
  if (!piped && (a.micro_batches > 0 || !a.stages.empty() || !a.stage_meshes.empty() || a.virtual_stages > 1))
    return Status::error("--micro-batches, --stages, --stage-meshes and --virtual-stages need --pp 2 or more");
  // --stage-meshes: each stage its own tp x dp (and schedule); the world is the sum of the meshes
  if (piped && !a.stage_meshes.empty()) {
    OASES_ASSIGN_OR_RETURN(*meshes, parse_stage_meshes(a.stage_meshes, a.pp));
    if (a.tp > 0 || a.dp > 0) return Status::error("give --tp/--dp (every stage) or --stage-meshes (each stage), not both");
    int64_t sum = 0;
    for (const auto& m : *meshes) sum += m.tp * m.dp;
    if (sum != world) return error("--stage-meshes {} needs {} ranks, the run has {}", a.stage_meshes, sum, world);
    a.tp = (*meshes)[0].tp;
    a.dp = (*meshes)[0].dp;
    if (!(*meshes)[0].schedule.empty()) a.schedule = (*meshes)[0].schedule;
  }
  if (piped) {
    if (meshes->empty() && world % a.pp != 0)
      return error("--pp {} does not divide the {} ranks of this run (world size must equal pp x tp x dp)", a.pp, world);
    if (a.grad_accum > 1) return Status::error("--grad-accum with --pp: the pipeline's --micro-batches accumulate the gradients");
    if (a.micro_batches <= 0) a.micro_batches = a.pp;
    OASES_ASSIGN_OR_RETURN(PipelineSchedule sched, parse_pipeline(a.pipeline));
    OASES_RETURN_IF_ERROR(check_virtual_stages(sched, static_cast<int>(a.pp), static_cast<int>(std::min<int64_t>(a.micro_batches, 1 << 30)),
                                               static_cast<int>(std::min<int64_t>(a.virtual_stages, 1 << 30))));
  }
  if (!piped) return world;
  if (meshes->empty()) return world / a.pp;
  const MeshPlan& m0 = meshes->front();
  return m0.ranks > 0 ? m0.ranks : std::max<int64_t>(m0.tp, 1) * std::max<int64_t>(m0.dp, 1);
}

// The training graph and its layout: one program, or one per pipeline stage mesh with the layout
// of the stages (on --hosts: the emulated hosts and their link).
Status build_programs(TrainSetup& s, Graph forward, const Plan& plan, int64_t stage_world, const std::vector<MeshPlan>& meshes,
                      bool from_plan) {
  const TrainArgs& a = s.a;
  TrainingSpec spec;
  spec.loss = a.loss;
  spec.ignore_index = a.ignore_index;
  spec.freeze = a.freeze;
  spec.train = a.train;
  GlobalProgramOptions go;
  go.model_path = a.model;
  go.plan_path = a.plan;
  go.partition = !a.export_plan.empty();
  Plan run = plan;
  if (a.pp > 1 && from_plan) {
    // the plan file's stages as they are (their first mesh as the run adopted it)
    run.micro_batches = a.micro_batches;
    run.pipeline = a.pipeline;
    run.virtual_stages = a.virtual_stages;
  } else if (a.pp > 1) {
    OASES_ASSIGN_OR_RETURN(run, with_stages(plan, a.pp, a.micro_batches, a.pipeline, a.stages, meshes, a.virtual_stages));
  }
  OASES_ASSIGN_OR_RETURN(s.programs, build_plan_programs(std::move(forward), spec, run, stage_world, go));
  if (!s.host_of.empty()) {
    LinkModel inter;
    if (!a.emulate_link.empty()) {
      OASES_ASSIGN_OR_RETURN(inter, parse_link_model(a.emulate_link));
    }
    s.programs.machine = reshard_cluster(s.plan().world(), s.host_of, inter, LinkModel{});
  }
  return Status::ok();
}

// --export-plan: the first stage's layout and, under --pp, the stages (their blocks as cut), so
// oases-train --plan runs it again.
Status export_plan(const TrainSetup& s) {
  const TrainArgs& a = s.a;
  nlohmann::json j = plan_to_json(s.gp().train.graph, *s.gp().partitioned, s.gp().sharding, s.gp().strategy, a.model);
  if (s.plan().zero > 0) j["zero"] = s.plan().zero;
  if (s.piped()) {
    j["version"] = kPlanVersionStages;
    j["pipeline"] = s.plan().pipeline_json();
  }
  return write_file_atomically(a.export_plan, j.dump(2) + "\n");
}

OptimizerConfig optimizer_config(const TrainArgs& a) {
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
  return oc;
}

}  // namespace

std::string TrainSetup::meshes_text() const {
  const MeshPlan& m0 = plan().mesh();
  const bool own = std::any_of(plan().stages.begin(), plan().stages.end(), [&](const MeshPlan& m) { return !same_stage_layout(m, m0); });
  return own ? "meshes " + stage_meshes_string(plan().stages) : fmt::format("tp {} x dp {}", a.tp, a.dp);
}

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
  std::vector<MeshPlan> meshes;
  bool from_plan = false;
  OASES_ASSIGN_OR_RETURN(int64_t stage_world, resolve_stages(a, world, &meshes, &from_plan));
  if (a.hosts > 0 && world % a.hosts != 0) return error("--hosts {} does not divide the {} ranks of this run", a.hosts, world);
  if (a.hosts > 1) {
    for (int64_t r = 0; r < world; ++r) s.host_of.push_back(static_cast<int>(r / (world / a.hosts)));
  }
  // a plan fixes the layout, the shapes and the schedule where the command line does not
  OASES_ASSIGN_OR_RETURN(Plan plan, run_plan(a, stage_world));
  ImportOptions opts;
  OASES_RETURN_IF_ERROR(a.bind.apply(&opts));
  if (!a.inputs_dir.empty()) {
    OASES_RETURN_IF_ERROR(read_input_files(a, &opts, &s));
  } else {
    OASES_RETURN_IF_ERROR(bind_token_shapes(a, &opts, &s.batch, &s.seq));
  }
  plan.batch = s.batch;
  plan.seq = s.seq;
  if (a.pp > 1) OASES_RETURN_IF_ERROR(check_pipeline_batch(s.batch, a.dp, a.micro_batches, a.chunks));
  for (const auto& m : meshes) {
    if (m.dp > 0) OASES_RETURN_IF_ERROR(check_pipeline_batch(s.batch, m.dp, a.micro_batches, a.chunks));
  }
  OASES_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(a.model, opts));
  OASES_RETURN_IF_ERROR(build_programs(s, std::move(loaded.graph), plan, stage_world, meshes, from_plan));
  const TrainingGraph& train = s.gp().train;
  s.vocab = train.vocab;
  OASES_RETURN_IF_ERROR(prepare_data(s));
  if (!a.export_plan.empty()) OASES_RETURN_IF_ERROR(export_plan(s));
  s.oc = optimizer_config(a);
  for (size_t i = 0; i < train.params.size(); ++i) {
    const Value& v = train.graph.value(train.params[i]);
    s.fingerprint += fmt::format("{}:{}{};", v.name, dtype_name(v.dtype), shape_str(v.shape));
  }
  s.model_hash = fnv1a(s.fingerprint +
                           fmt::format("nodes={};tp={};dp={};pp={};stages={};meshes={};", train.graph.num_nodes(), a.tp, a.dp, a.pp,
                                       s.piped() ? s.plan().cuts() : "", s.meshes_text()) +
                       binary_identity());
  return s;
}

}  // namespace oases
