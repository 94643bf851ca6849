#include <cstdio>
#include <cstdlib>

#include "executor/device.h"
#include "tools/train_setup.h"

namespace oases {

namespace {

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

// --memory-report: the largest values alive together at the arena's busiest step.
void print_live_peak(const ProgramLayout& p, const char* who) {
  std::vector<PlanStep> steps;
  for (const ScheduledOp& op : p.order)
    steps.push_back(PlanStep{op.node, op.kind != ScheduledOp::Kind::kCommWait, op.kind != ScheduledOp::Kind::kCommStart});
  const LivePeak peak = live_peak(p.graph, steps, p.memory, {});
  std::fprintf(stderr, "%s: %.1f MiB alive at step %zu of %zu (%s), the largest of %zu values:\n", who,
               static_cast<double>(peak.bytes) / (1 << 20), peak.step, steps.size(),
               peak.step < steps.size() ? p.graph.node(steps[peak.step].node).describe().c_str() : "-", peak.values.size());
  for (size_t i = 0; i < peak.values.size() && i < 8; ++i) {
    const Value& v = p.graph.value(peak.values[i].value);
    std::fprintf(stderr, "  %8.1f KiB  %s %s\n", static_cast<double>(peak.values[i].bytes) / 1024.0, v.name.c_str(), shape_str(v.shape).c_str());
  }
}

}  // namespace

// This rank's program (planner/rank_program.h) bound to the executor in a Trainer.
Expected<std::unique_ptr<Trainer>> make_trainer(const TrainSetup& s, RankRuntime& rt, DeviceComms* device_comms,
                                                std::optional<ScheduleOptions>* sched, StageProgramInfo* stage) {
  const TrainArgs& a = s.a;
  const int64_t world_rank = rt.communicator() ? rt.communicator()->rank() : 0;
  bool lead = world_rank == 0;
  RankProgramOptions ro;
  ro.device = a.device;
  RankProgram rp;
  if (s.piped()) {
    if (!stage) return Status::error("internal: a pipeline rank's trainer needs its stage record");
    OASES_ASSIGN_OR_RETURN(rp, build_rank_program(s.programs, world_rank, ro, stage));
    if (a.memory_report && rt.rank() == 0) {
      // with virtual stages a step is one model stage of a micro-batch: about 1/V of its activations here
      const int64_t V = s.plan().virtual_stages;
      const std::string held = V > 1 ? fmt::format("{} micro-batch steps of one of {} virtual stages", stage->peak_in_flight, V)
                                     : fmt::format("{} micro-batches", stage->peak_in_flight);
      std::fprintf(stderr, "stage %d (%s): blocks %s, %d sends and %d receives a step, at most %s in flight, arena %.1f KiB\n", stage->stage,
                   a.pipeline.c_str(), s.plan().stages[static_cast<size_t>(stage->stage)].blocks.c_str(), stage->sends, stage->receives,
                   held.c_str(), static_cast<double>(rp.program.memory.arena_bytes) / 1024.0);
      print_live_peak(rp.program, fmt::format("stage {}", stage->stage).c_str());
    }
  } else {
    OASES_ASSIGN_OR_RETURN(rp, build_rank_program(s.programs, rt.rank(), ro));
    if (a.memory_report && rt.rank() == 0) {
      std::fprintf(stderr, "rank 0: activation arena %.1f MiB at its peak (%.1f MiB without reuse), parameters %.1f MiB\n",
                   static_cast<double>(rp.program.memory.arena_bytes) / (1 << 20), static_cast<double>(rp.program.memory.total_bytes) / (1 << 20),
                   static_cast<double>(rp.param_bytes) / (1 << 20));
      print_live_peak(rp.program, "rank 0");
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
    if (rt.communicator() && rt.communicator()->size() > 1) {
      // the mesh's groups (a pipeline stage's: members of the world) and, for the Reshard
      // kernels' transfers between meshes, the world, on the devices
      std::string how;
      OASES_ASSIGN_OR_RETURN(*device_comms, make_device_comms(rt.communicator(), rt.axis_groups(), a.comm_timeout, &how));
      if (lead && a.verbose) std::fprintf(stderr, "note: %s\n", how.c_str());
      eo.groups.clear();
      for (auto& g : device_comms->groups) eo.groups.push_back(g.get());
      eo.device_comm = device_comms->world.get();
    }
  }
  *sched = rp.schedule;
  if (lead && rp.schedule && std::getenv("OASES_DUMP_SCHEDULE")) print_schedule(rp.train.graph, rp.order);
  if (lead && (a.memory_report || a.overlap_report) && rp.schedule) {
    std::fprintf(stderr, "schedule %s, %lld chunks: %d recomputed nodes (%d collectives); activations kept for backward per block%s:\n",
                 rp.schedule->name.c_str(), static_cast<long long>(a.chunks), rp.recompute.nodes, rp.recompute.collectives,
                 s.piped() ? " (stage 0, every micro-batch)" : "");
    for (const auto& [layer, bytes] : rp.saved_bytes) {
      std::string where = layer < 0 ? std::string("outside blocks") : fmt::format("layer {}", layer);
      std::fprintf(stderr, "  %s: %d tensors, %.1f KiB\n", where.c_str(), rp.saved_count.at(layer), static_cast<double>(bytes) / 1024.0);
    }
  }
  OASES_ASSIGN_OR_RETURN(Program compiled, compile_program(std::move(rp.program)));
  OASES_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> tr, Trainer::create(std::move(rp.train), s.oc, eo, std::move(compiled)));
  const int dp_axis = rt.mesh().axis("dp");
  if (s.plan().zero > 0 && dp_axis >= 0 && rt.distributed()) {
    // parameters replicated over dp whose gradient the program gives whole (a tied weight's, summed
    // across stages after its all-reduce): their state is shared over dp as well
    const GlobalProgram& gp = s.piped() ? s.stage_program(stage->stage) : s.gp();
    std::vector<bool> replicated;
    for (size_t i = 0; i < tr->training_graph().params.size(); ++i) {
      size_t k = s.piped() ? stage->param_index.at(i) : i;
      replicated.push_back(zero_whole_axis(gp.param_specs.at(k), rt.mesh()) == dp_axis);
    }
    tr->zero_whole_gradients(rt.axis_groups().at(static_cast<size_t>(dp_axis)), replicated);
  }
  if (a.memory_report && rt.rank() == 0) {
    const Optimizer& o = tr->optimizer();
    std::fprintf(stderr, "%s: optimizer state %.2f MiB%s\n", s.piped() ? fmt::format("stage {} rank 0", stage->stage).c_str() : "rank 0",
                 static_cast<double>(o.state_bytes()) / (1 << 20),
                 tr->zero().any() ? fmt::format(" (ZeRO-1: its pieces; whole it would be {:.2f} MiB)", static_cast<double>(o.whole_state_bytes()) / (1 << 20)).c_str()
                                  : "");
  }
  return tr;
}

}  // namespace oases
