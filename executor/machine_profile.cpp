#include "executor/machine_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "executor/communicator.h"
#include "executor/cpu/blas_select.h"
#include "executor/distributed.h"
#include "executor/emulated_link.h"
#include "executor/launcher.h"
#include "executor/optimizer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "planner/rank_program.h"
#include "planner/search.h"
#include "planner/simulator.h"

namespace oases {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Adds one run's collectives (their time on the communication thread and the share of it the
// compute thread spent computing) to `c`.
void add_collectives(const std::vector<TraceEvent>& ev, CalibrationRun* c) {
  std::vector<std::pair<double, double>> busy;
  for (const TraceEvent& e : ev) {
    if (e.thread == 0 && e.category == "compute") busy.emplace_back(e.start_us, e.start_us + e.dur_us);
  }
  std::sort(busy.begin(), busy.end());
  for (const TraceEvent& e : ev) {
    if (e.thread != 1 || e.dur_us <= 0) continue;
    CalibrationRun::Collective& k = c->collectives[e.node];
    k.us += e.dur_us;
    k.beside += std::min(1.0, covered_time(busy, e.start_us, e.start_us + e.dur_us) / e.dur_us);
    ++k.n;
  }
}

void add_overheads(const Program& p, const std::vector<TraceEvent>& ev, ExecutorOverheads* o) {
  std::vector<const TraceEvent*> compute;  // thread 0, in instruction order
  for (const TraceEvent& e : ev) {
    if (e.thread == 0 && e.category != "issue") compute.push_back(&e);  // (an issue marks a start, which has no instruction time)
  }
  size_t j = 0;
  int starts_between = 0;
  double plain_sum = 0, start_sum = 0;
  int64_t plain_n = 0, start_n = 0;
  for (const Instr& ins : p.instrs) {
    if (ins.kind == Instr::Kind::kCommStart) {
      ++starts_between;
      continue;
    }
    if (j >= compute.size()) break;
    if (j > 0) {
      double gap = std::max(0.0, compute[j]->start_us - (compute[j - 1]->start_us + compute[j - 1]->dur_us));
      if (starts_between == 0) {
        plain_sum += gap;
        ++plain_n;
      } else {
        start_sum += gap;
        start_n += starts_between;
      }
    }
    starts_between = 0;
    ++j;
  }
  o->accounted_us += plain_sum + start_sum;
  o->instr_gap_us += plain_sum;
  o->instr_gaps += plain_n;
  o->start_gap_us += start_sum;
  o->starts += start_n;
}

}  // namespace

nlohmann::json machine_description(int64_t ranks, int threads) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string cpu = "unknown";
  double mem_gib = 0;
  std::ifstream ci("/proc/cpuinfo");
  for (std::string line; std::getline(ci, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream mi("/proc/meminfo");
  for (std::string line; std::getline(mi, line);) {
    if (line.rfind("MemTotal:", 0) == 0) mem_gib = std::stod(line.substr(9)) / (1024.0 * 1024.0);
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"host", host},
          {"cpu", cpu},
          {"cores", static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))},
          {"memory_gib", mem_gib},
          {"ranks", ranks},
          {"threads_per_rank", threads},
          {"compiler", __VERSION__},
          {"date", date},
          {"blas", "OpenBLAS"},
          {"blas_core", blas_core_report()}};
}

// Matrix-product rate (one rank's threads) and streaming bandwidth of this machine.
DeviceSpec measure_device(int threads, double mem_gib, int64_t ranks) {
  DeviceSpec d;
  d.name = "CPU (measured by oases-profile)";
  kernels::set_num_threads(threads);
  int64_t n = 512;
  std::vector<float> a(static_cast<size_t>(n * n), 1.0f), b(a), c(a);
  kernels::gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  std::vector<double> ts;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    kernels::gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    ts.push_back(seconds_since(t0));
  }
  d.fp32_tflops = 2.0 * static_cast<double>(n * n * n) / median(ts) / 1e12;
  std::vector<float> x(size_t{1} << 24, 1.0f), y(x.size());
  ts.clear();
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(y.data(), x.data(), x.size() * sizeof(float));
    ts.push_back(seconds_since(t0));
  }
  d.memory_gbps = 2.0 * static_cast<double>(x.size() * sizeof(float)) / median(ts) / 1e9;
  d.memory_gib = mem_gib / static_cast<double>(std::max<int64_t>(1, ranks));
  d.matmul_efficiency = 1.0;
  d.memory_efficiency = 1.0;
  d.launch_us = 1;
  d.source = fmt::format("measured: {}x{}x{} sgemm and a {} MiB copy, {} thread(s)", n, n, n, x.size() * 4 >> 20, threads);
  return d;
}

// Collective times on the local communicator (threads), optionally behind an emulated link.
std::vector<CollectiveSample> measure_collectives(int64_t group, const std::vector<int64_t>& sizes, const LinkModel* link, int reps,
                                                  double comm_timeout) {
  std::vector<CollectiveSample> out;
  auto world = make_local_world(static_cast<int>(group), comm_timeout);
  std::vector<std::vector<double>> times(sizes.size() * 3);
  std::vector<std::thread> th;
  std::vector<std::string> errors(static_cast<size_t>(group));
  for (int r = 0; r < group; ++r) {
    th.emplace_back([&, r] {
      try {
        auto comm = local_communicator(world, r);
        std::vector<int> all(static_cast<size_t>(group));
        for (int i = 0; i < group; ++i) all[static_cast<size_t>(i)] = i;
        std::unique_ptr<CommGroup> g = comm->make_group(all);
        if (link) g = emulate_link(std::move(g), *link);
        for (size_t si = 0; si < sizes.size(); ++si) {
          int64_t bytes = sizes[si];
          int64_t count = std::max<int64_t>(group, bytes / 4 / group * group);
          std::vector<float> buf(static_cast<size_t>(count), 1.0f), out_buf(static_cast<size_t>(count));
          for (int kind = 0; kind < 3; ++kind) {
            for (int rep = 0; rep <= reps; ++rep) {
              g->barrier();
              auto t0 = Clock::now();
              if (kind == 0) g->all_reduce(buf.data(), count, DType::kF32, ReduceOp::kSum);
              if (kind == 1) g->all_gather(buf.data(), out_buf.data(), count / group * 4);
              if (kind == 2) g->reduce_scatter(buf.data(), out_buf.data(), count / group, DType::kF32, ReduceOp::kSum);
              double s = seconds_since(t0);
              if (r == 0 && rep > 0) times[si * 3 + static_cast<size_t>(kind)].push_back(s);
            }
          }
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : th) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) throw OasesError("collective timing: " + e);
  }
  for (size_t si = 0; si < sizes.size(); ++si) {
    int64_t count = std::max<int64_t>(group, sizes[si] / 4 / group * group);
    for (int kind = 0; kind < 3; ++kind) {
      CollectiveSample s;
      s.kind = kind == 0 ? CollectiveKind::kAllReduce : kind == 1 ? CollectiveKind::kAllGather : CollectiveKind::kReduceScatter;
      s.group = group;
      s.bytes = static_cast<double>(count * 4);  // the whole tensor (all-gather: its result)
      s.us = median(times[si * 3 + static_cast<size_t>(kind)]) * 1e6;
      s.link = link ? fmt::format("emulated bw={},latency={}", link->bandwidth_gbps, link->latency_us) : "shared-memory";
      out.push_back(s);
    }
  }
  return out;
}

double measure_optimizer(int threads) {
  kernels::set_num_threads(threads);
  OptimizerConfig oc;
  oc.kind = "adamw";
  oc.lr = 1e-3;
  Optimizer opt(oc);
  int64_t n = int64_t{4} << 20;  // 16 MiB of parameters in 4 tensors
  std::vector<Tensor> grads;
  std::vector<const float*> gp;
  for (int i = 0; i < 4; ++i) {
    Tensor p(DType::kF32, {n / 4});
    Tensor g(DType::kF32, {n / 4});
    for (int64_t k = 0; k < n / 4; ++k) {
      p.mutable_data<float>()[k] = 0.01f;
      g.mutable_data<float>()[k] = 0.001f;
    }
    opt.add(fmt::format("p{}", i), p);
    grads.push_back(g);
    gp.push_back(grads.back().data<float>());
  }
  opt.step(gp, 1.f);
  std::vector<double> ts;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    opt.step(gp, 1.f);
    ts.push_back(seconds_since(t0));
  }
  return median(ts) * 1e6 / 16.0;
}

Status measure_model_ops(const Graph& forward, const std::string& model_path, const ModelAnalysis& a, int64_t ranks, int64_t tp,
                         int64_t chunks, int threads, int reps, const LinkModel& link, std::map<std::string, OpSample>* acc,
                         ExecutorOverheads* overheads, std::vector<CalibrationRun>* calib, const std::string& schedule,
                         double comm_timeout) {
  Plan plan = Plan::from_parts(part_layouts_of(a, std::vector<Layout>(a.parts.size(), Layout{tp, false})), ranks, schedule, chunks);
  GlobalProgramOptions go;
  go.model_path = model_path;
  OASES_ASSIGN_OR_RETURN(GlobalProgram gp, build_global_program(forward, TrainingSpec{}, plan, ranks, go));
  const TrainingGraph& tg = gp.train;
  // one global batch of random tokens, each rank fed its slice
  std::mt19937_64 rng(7);
  std::map<std::string, Tensor> global;
  for (ValueId v : tg.graph.inputs()) {
    const Value& val = tg.graph.value(v);
    Tensor t(DType::kI64, val.shape);
    int64_t vocab = std::max<int64_t>(2, a.vocab);
    for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<int64_t>()[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    if (val.dtype != DType::kI64) {
      Tensor c(val.dtype, val.shape);
      for (int64_t i = 0; i < t.numel(); ++i) store_from_double(c.raw_mutable(), val.dtype, i, static_cast<double>(t.data<int64_t>()[i]));
      t = c;
    }
    global[val.name] = t;
  }
  // the ranks run as threads sharing the cores, as oases-train --local-ranks does
  Status run = run_thread_ranks(ranks, gp.mesh(), link, threads, comm_timeout, [&](RankRuntime& rt) -> Status {
    const int64_t r = rt.rank();
    OASES_ASSIGN_OR_RETURN(RankProgram rp, build_rank_program(gp, r));
    ExecOptions eo;
    eo.groups = rt.axis_groups();
    eo.order = rp.order;
    OASES_ASSIGN_OR_RETURN(Program compiled, compile_program(std::move(rp.program)));
    OASES_ASSIGN_OR_RETURN(auto ex, Executor::create(std::move(compiled), eo));
    const Graph& g = ex->graph();
    ex->state().training = true;
    std::map<std::string, Tensor> feeds;
    for (const auto& [name, t] : global) {
      ValueId v = g.find_value(name);
      if (v == kNoId) continue;
      feeds[name] = gp.partitioned ? slice_for_rank(t, gp.partitioned->specs[static_cast<size_t>(v)], gp.mesh(), r) : t;
    }
    ex->set_profiling(r == 0);
    ex->set_tracing(r == 0);
    for (int rep = 0; rep <= reps; ++rep) {
      auto t_run = Clock::now();
      OASES_RETURN_IF_ERROR(ex->execute(feeds));
      if (r != 0) continue;
      double run_us = seconds_since(t_run) * 1e6;
      std::vector<TraceEvent> ev = ex->take_events();
      if (rep == 0) continue;
      const Program& p = ex->program();
      add_overheads(p, ev, overheads);
      overheads->wall_us += run_us;
      if (calib) {
        if (rep == 1) {
          CalibrationRun c;
          c.graph = p.graph;
          c.order = program_order(p);
          c.mesh = gp.mesh();
          c.ranks = ranks;
          calib->push_back(std::move(c));
        }
        CalibrationRun& c = calib->back();
        ++c.reps;
        c.wall_us += (run_us - c.wall_us) / c.reps;  // the mean over the timed repetitions
        add_collectives(ev, &c);
      }
      // what the emulated link alone makes the collectives take (the plain schedule waits for each)
      for (const Instr& ins : p.instrs) {
        if (ins.kind == Instr::Kind::kCommWait) continue;
        const Node& n = p.graph.node(ins.node);
        if (!is_collective(n) || !link.enabled()) continue;
        int axis = static_cast<int>(n.attrs.get_int("mesh_axis", 0));
        if (axis < 0 || axis >= static_cast<int>(eo.groups.size()) || !eo.groups[static_cast<size_t>(axis)]) continue;
        int gs = eo.groups[static_cast<size_t>(axis)]->size();
        if (gs <= 1) continue;
        double bytes = 0;
        for (ValueId v : n.inputs) {
          if (v != kNoId) bytes += static_cast<double>(p.graph.value(v).nbytes());
        }
        // (the link model's n: the whole tensor; an all-gather's input is one part, a reduce-scatter's all)
        double s = n.op_type == "AllReduce"       ? link.all_reduce_s(bytes, gs)
                   : n.op_type == "RingShift"     ? link.shift_s(bytes)
                   : n.op_type == "ReduceScatter" ? link.gather_like_s(bytes, gs)
                                                  : link.gather_like_s(bytes * gs, gs);
        overheads->accounted_us += 1e6 * s;
      }
      const auto& ms = ex->node_ms();
      for (size_t i = 0; i < p.instrs.size() && i < ms.size(); ++i) {
        if (p.instrs[i].kind != Instr::Kind::kCompute) continue;
        const Node& n = p.graph.node(p.instrs[i].node);
        if (is_collective(n)) continue;
        OpCost c = node_cost(p.graph, n);
        if (is_free_op(n, c)) continue;
        std::string key = node_key(p.graph, n);
        OpSample& o = (*acc)[key];
        if (o.samples == 0 || o.key.empty()) {
          o.op = node_op_name(n);
          o.key = key;
          o.flops = c.flops;
          o.bytes = c.bytes;
          o.samples = 0;
          o.us = 0;
        }
        overheads->accounted_us += ms[i] * 1000.0;
        // a running mean over every execution of this key
        o.us = (o.us * o.samples + ms[i] * 1000.0) / (o.samples + 1);
        ++o.samples;
      }
    }
    return Status::ok();
  });
  if (!run.is_ok()) return error("tp {} x dp {}, {} chunk(s): {}", tp, ranks / tp, chunks, run.message());
  return Status::ok();
}

// Fits the profile's executor terms to its own runs, through the simulator that will use them:
//  * comm_sync_us + comm_beside_compute_us x (share of the collective's time the compute thread
//    computes): what a collective took on the communication thread beyond what the link (or the
//    shared-memory floor) makes it take (least squares over every collective of every run, both
//    terms at least 0). Peers reach a collective late, and beside computation the communication
//    threads wait for a core (ranks sharing the cores): measured 1.3 ms per all-reduce beside
//    nothing against 3-5 ms beside computation at tp 4 on 2 cores;
//  * core_share: the factor on the compute thread's times for which the simulator replays the
//    runs in the time they took (bisection; the step grows with it). Summing kernels, gaps and
//    link times instead (the first estimate) counts every collective as exposed, while the replay
//    hides those the program overlaps.
Status calibrate_executor(const std::vector<CalibrationRun>& runs, const std::string& emulate, int threads, Profile* p) {
  double wall = 0;
  for (const CalibrationRun& c : runs) wall += c.wall_us * 1e-6;
  if (runs.empty() || wall <= 0) return Status::ok();
  // the simulator's view of a run's machine, from the profile as it stands
  auto with_sim = [&](const CalibrationRun& c, auto&& fn) {
    ClusterSpec cluster = this_machine(c.ranks, p, emulate, threads);
    OpTimeModel ops = op_time_model(cluster, p, c.ranks, threads);
    SimOptions o;
    o.cluster = &cluster;
    o.ops = &ops;
    o.local_floor = p;
    return fn(o);
  };
  // the collectives' extra time: x = share beside computation, y = measured - modelled (us)
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const CalibrationRun& c : runs) {
    with_sim(c, [&](const SimOptions& o) {
      for (const auto& [id, k] : c.collectives) {
        double model = collective_node_seconds(c.graph, c.graph.node(id), c.mesh, o) * 1e6;
        if (model <= 0 || k.n == 0) continue;
        double x = k.beside / k.n, y = k.us / k.n - model;
        n += 1;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
      }
    });
  }
  p->comm_sync_us = p->comm_beside_compute_us = 0;
  if (n > 0) {
    double var = sxx - sx * sx / n;
    double b = var > 1e-12 ? (sxy - sx * sy / n) / var : 0.0;
    double a = (sy - b * sx) / n;
    if (b < 0) {
      b = 0;
      a = sy / n;
    }
    if (a < 0) {
      a = 0;
      b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
    }
    p->comm_sync_us = std::max(0.0, a);
    p->comm_beside_compute_us = b;
  }
  auto replay = [&](double share) -> Expected<double> {
    p->core_share = share;
    double total = 0;
    for (const CalibrationRun& c : runs) {
      auto r = with_sim(c, [&](const SimOptions& o) { return simulate_rank(c.graph, c.order, c.mesh, o); });
      if (!r) return r.status();
      total += r->step_s - r->optimizer_s;
    }
    return total;
  };
  double lo = 1.0, hi = 1.0;
  OASES_ASSIGN_OR_RETURN(double at_lo, replay(lo));
  if (at_lo >= wall) return Status::ok();  // core_share stays 1
  for (int i = 0; i < 8; ++i) {
    hi *= 2;
    OASES_ASSIGN_OR_RETURN(double t, replay(hi));
    if (t >= wall) break;
  }
  for (int i = 0; i < 30 && hi - lo > 1e-4; ++i) {
    double mid = 0.5 * (lo + hi);
    OASES_ASSIGN_OR_RETURN(double t, replay(mid));
    (t < wall ? lo : hi) = mid;
  }
  p->core_share = 0.5 * (lo + hi);
  return Status::ok();
}

}  // namespace oases
