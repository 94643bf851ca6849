#include "executor/measure_machine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "executor/communicator.h"
#include "executor/cpu/blas_select.h"
#include "executor/distributed.h"
#include "executor/emulated_link.h"
#include "executor/launcher.h"
#include "executor/optimizer.h"
#include "graph/autodiff.h"
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

// The executor's own time on the compute thread between instructions, from rank 0's run:
// `spans` gives each instruction's {start, end} on the clock the profile keeps (the thread's CPU
// clock, or the wall clock of its trace), zero for instructions without one (collective starts).
void add_overheads(const Program& p, const std::vector<std::pair<double, double>>& spans, ExecutorOverheads* o) {
  int starts_between = 0;
  double plain_sum = 0, start_sum = 0;
  int64_t plain_n = 0, start_n = 0;
  double prev_end = -1;
  for (size_t i = 0; i < p.instrs.size() && i < spans.size(); ++i) {
    if (p.instrs[i].kind == Instr::Kind::kCommStart) {
      ++starts_between;
      continue;
    }
    if (prev_end >= 0) {
      double gap = std::max(0.0, spans[i].first - prev_end);
      if (starts_between == 0) {
        plain_sum += gap;
        ++plain_n;
      } else {
        start_sum += gap;
        start_n += starts_between;
      }
    }
    prev_end = spans[i].second;
    starts_between = 0;
  }
  o->instr_gap_us += plain_sum;
  o->instr_gaps += plain_n;
  o->start_gap_us += start_sum;
  o->starts += start_n;
}

// {start, end} per instruction from rank 0's trace (thread 0 in instruction order; an "issue"
// event marks a collective start, which has no instruction time).
std::vector<std::pair<double, double>> wall_spans(const Program& p, const std::vector<TraceEvent>& ev) {
  std::vector<std::pair<double, double>> spans(p.instrs.size(), {0.0, 0.0});
  std::vector<const TraceEvent*> compute;
  for (const TraceEvent& e : ev) {
    if (e.thread == 0 && e.category != "issue") compute.push_back(&e);
  }
  size_t j = 0;
  for (size_t i = 0; i < p.instrs.size() && j < compute.size(); ++i) {
    if (p.instrs[i].kind == Instr::Kind::kCommStart) continue;
    spans[i] = {compute[j]->start_us, compute[j]->start_us + compute[j]->dur_us};
    ++j;
  }
  return spans;
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

double measure_available_cores(int threads, double seconds) {
  threads = std::max(1, threads);
  std::vector<double> cpu(static_cast<size_t>(threads), 0.0);
  std::vector<std::thread> th;
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    th.emplace_back([&, t] {
      // arithmetic on registers only: what a core gives, not what memory does
      timespec c0{}, c1{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      volatile float sink = 0;
      float x = 1.0f + 1e-7f * static_cast<float>(t), y = 0.5f;
      while (seconds_since(t0) < seconds) {
        for (int i = 0; i < 20000; ++i) y = y * x + 1e-9f;
        sink = y;
      }
      (void)sink;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      cpu[static_cast<size_t>(t)] = static_cast<double>(c1.tv_sec - c0.tv_sec) + 1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec);
    });
  }
  for (auto& t : th) t.join();
  double wall = seconds_since(t0);
  double got = 0;
  for (double c : cpu) got += c;
  return wall > 0 ? got / wall : static_cast<double>(threads);
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

namespace {

// The rows of the smallest table an integer input indexes (a Gather reading it as indices, directly
// or through a Cast); 0 when it indexes none.
int64_t rows_indexed(const Graph& g, ValueId v) {
  int64_t rows = 0;
  auto from = [&](ValueId x, auto& self, int depth) -> void {
    for (const Use& u : g.uses(x)) {
      const Node& n = g.node(u.node);
      if (!is_default_domain(n.domain)) continue;
      if (n.op_type == "Cast" && depth == 0) {
        for (ValueId o : n.outputs) {
          if (o != kNoId) self(o, self, depth + 1);
        }
      }
      if (n.op_type != "Gather" || u.slot != 1) continue;
      const Shape& table = g.value(n.inputs[0]).shape;
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += static_cast<int64_t>(table.size());
      if (axis < 0 || axis >= static_cast<int64_t>(table.size()) || table[static_cast<size_t>(axis)] <= 0) continue;
      int64_t r = table[static_cast<size_t>(axis)];
      rows = rows == 0 ? r : std::min(rows, r);
    }
  };
  from(v, from, 0);
  return rows;
}

}  // namespace

std::string profile_op_clock(int threads) {
  return threads == 1 ? "thread_cpu" : "wall";
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
    // integers that index tables (tokens, positions, token types) random among the rows of the
    // smallest; others (attention masks, labels) ones: valid for every model
    int64_t rows = is_integer(val.dtype) ? rows_indexed(tg.graph, v) : std::max<int64_t>(2, a.vocab);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.mutable_data<int64_t>()[i] = rows > 0 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(rows)) : 1;
    if (val.dtype != DType::kI64) {
      Tensor c(val.dtype, val.shape);
      for (int64_t i = 0; i < t.numel(); ++i) store_from_double(c.raw_mutable(), val.dtype, i, static_cast<double>(t.data<int64_t>()[i]));
      t = c;
    }
    global[val.name] = t;
  }
  // the ranks run as threads sharing the cores, as oases-train --local-ranks does; with one
  // kernel thread per rank its kernels are timed on its own CPU clock (their work, however the
  // cores were shared meanwhile), with more on the wall clock (the helpers' time is not the
  // caller's)
  const bool cpu_clock = profile_op_clock(threads) == "thread_cpu";
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
    ex->set_node_timing(r == 0);
    ex->set_tracing(r == 0 && !cpu_clock);  // the wall clock's spans come from the trace
    for (int rep = 0; rep <= reps; ++rep) {
      auto t_run = Clock::now();
      OASES_RETURN_IF_ERROR(ex->execute(feeds));
      if (r != 0) continue;
      double run_us = seconds_since(t_run) * 1e6;
      std::vector<TraceEvent> ev = ex->take_events();
      if (rep == 0) continue;
      const Program& p = ex->program();
      add_overheads(p, cpu_clock ? ex->node_cpu_us() : wall_spans(p, ev), overheads);
      if (calib) {
        if (rep == 1) {
          CalibrationRun c;
          c.graph = p.graph;
          c.order = program_order(p);
          c.mesh = gp.mesh();
          c.ranks = ranks;
          c.schedule = schedule;
          c.tp = tp;
          c.chunks = chunks;
          calib->push_back(std::move(c));
        }
        calib->back().runs_us.push_back(run_us);
      }
      const auto& ms = ex->node_ms();
      const auto& cpu = ex->node_cpu_us();
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
        double us = cpu_clock && i < cpu.size() ? cpu[i].second - cpu[i].first : ms[i] * 1000.0;
        // a running mean over every execution of this key
        o.us = (o.us * o.samples + us) / (o.samples + 1);
        ++o.samples;
      }
    }
    return Status::ok();
  });
  if (!run.is_ok()) return error("tp {} x dp {}, {} chunk(s): {}", tp, ranks / tp, chunks, run.message());
  if (calib && !calib->empty()) calib->back().wall_us = median(calib->back().runs_us);
  return Status::ok();
}

namespace {

// Node `n` of `train` alone at the local shapes of `s`: its inputs graph inputs (constants kept
// where the shape is the local one), its shape attributes set as the partition's lowering sets
// them (graph/ops/shape_ops.cpp and grad_ops.cpp: a reshape or expand target, the split sizes, a
// slice's lengths, a gradient's data shape take the local shapes), its outputs inferred and
// checked against the sample's.
Expected<Graph> priced_op_graph(const Graph& train, const PricedSample& s) {
  const Node& n = train.node(s.op.node);
  auto fail = [&](const std::string& why) {
    return error("{} ({}): cannot time it alone at {}: {}", n.describe(), s.where(), s.op.key, why);
  };
  Graph g;
  std::vector<ValueId> ins, outs;
  size_t k = 0;  // the sample lists the present inputs and outputs only
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    ValueId v = n.inputs[i];
    if (v == kNoId) {
      ins.push_back(kNoId);
      continue;
    }
    if (k >= s.op.inputs.size()) return fail("more inputs than the planner priced");
    const auto& [dt, shape] = s.op.inputs[k++];
    const Value& val = train.value(v);
    std::string name = "in" + std::to_string(i);
    ins.push_back(val.is_constant() && val.dtype == dt && val.shape == shape ? g.add_initializer(name, val.constant)
                                                                             : g.add_input(name, dt, shape));
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) outs.push_back(n.outputs[i] == kNoId ? kNoId : g.add_value("out" + std::to_string(i)));
  if (s.op.outputs.empty()) return fail("no outputs priced");
  AttrMap attrs = n.attrs;
  const Shape& out0 = s.op.outputs[0].second;
  if ((n.op_type == "Reshape" || n.op_type == "Expand" || n.op_type == "ConstantOfShape") && attrs.has("shape"))
    attrs.set_ints("shape", out0);
  if (n.op_type == "Split" && attrs.has("split")) {
    const int64_t axis = attrs.get_int("axis", 0);
    std::vector<int64_t> sizes;
    for (const auto& o : s.op.outputs) sizes.push_back(o.second.at(static_cast<size_t>(axis)));
    attrs.set_ints("split", sizes);
  }
  if (attrs.has("data_shape")) attrs.set_ints("data_shape", out0);
  if (attrs.has("input_shape")) attrs.set_ints("input_shape", out0);
  if (attrs.has("lengths") && attrs.has("axes")) {
    // a slice (of input 0) or its gradient (into output 0) over a dim the layout splits: a length
    // that took the whole dim takes the local one
    const bool grad = n.domain == kOasesDomain;
    const ValueId whole = grad ? n.outputs[0] : n.inputs[0];
    const Shape& global = train.value(whole).shape;
    const Shape& local = grad ? out0 : s.op.inputs.at(0).second;
    std::vector<int64_t> axes = attrs.get_ints("axes"), lens = attrs.get_ints("lengths");
    for (size_t i = 0; i < axes.size() && i < lens.size(); ++i) {
      size_t a = static_cast<size_t>(axes[i]);
      if (a < global.size() && a < local.size() && local[a] != global[a] && lens[i] == global[a]) lens[i] = local[a];
    }
    attrs.set_ints("lengths", lens);
  }
  NodeId id = g.add_node(n.op_type, ins, outs, attrs, n.name, n.domain);
  g.node(id).opset = n.opset;
  g.node(id).phase = n.phase;
  if (Status st = infer_node(g, id); !st.is_ok()) return fail(st.message());
  std::vector<ValueId> results;
  k = 0;
  for (ValueId o : outs) {
    if (o == kNoId) continue;
    const Value& val = g.value(o);
    if (k >= s.op.outputs.size() || val.dtype != s.op.outputs[k].first || val.shape != s.op.outputs[k].second) {
      return fail(fmt::format("its output {} would be {}[{}]", k, dtype_name(val.dtype), fmt::join(val.shape, "x")));
    }
    ++k;
    results.push_back(o);
  }
  g.set_outputs(results);
  return g;
}

}  // namespace

Expected<int> measure_priced_ops(const Graph& train, const std::vector<PricedSample>& priced, int threads, int reps, double wall_scale,
                                 std::map<std::string, OpSample>* acc) {
  const bool cpu_clock = profile_op_clock(threads) == "thread_cpu";
  std::mt19937_64 rng(13);
  std::normal_distribution<double> normal(0.0, 0.5);
  int timed = 0;
  for (const PricedSample& s : priced) {
    if (acc->count(s.op.key)) continue;
    OASES_ASSIGN_OR_RETURN(Graph g, priced_op_graph(train, s));
    // float inputs random, integers zero: valid indices, labels and masks for any op
    std::map<std::string, Tensor> feeds;
    for (ValueId v : g.inputs()) {
      const Value& val = g.value(v);
      Tensor t(val.dtype, val.shape);
      if (is_floating(val.dtype)) {
        for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t.raw_mutable(), val.dtype, i, normal(rng));
      }
      feeds[val.name] = t;
    }
    const Node& n = g.node(g.nodes().front());
    OpCost c = node_cost(g, n);
    ExecOptions eo;
    eo.fuse = false;
    eo.threads = threads;
    auto ex = Executor::create(std::move(g), eo);
    if (!ex) return error("{} ({}): cannot time it alone: {}", s.op.key, s.where(), ex.status().message());
    (*ex)->state().training = true;
    (*ex)->set_node_timing(true);
    std::vector<double> us;
    for (int rep = 0; rep <= reps; ++rep) {
      if (Status st = (*ex)->execute(feeds); !st.is_ok()) return error("{} ({}): running it alone: {}", s.op.key, s.where(), st.message());
      if (rep == 0) continue;  // warm-up
      const Program& p = (*ex)->program();
      double t = 0;
      for (size_t i = 0; i < p.instrs.size(); ++i) {
        if (p.instrs[i].kind != Instr::Kind::kCompute) continue;
        t += cpu_clock ? (*ex)->node_cpu_us()[i].second - (*ex)->node_cpu_us()[i].first : (*ex)->node_ms()[i] * 1e3 * wall_scale;
      }
      us.push_back(t);
    }
    OpSample& o = (*acc)[s.op.key];
    o.op = s.op.op;
    o.key = s.op.key;
    o.flops = c.flops;
    o.bytes = c.bytes;
    o.us = median(us);
    o.samples = static_cast<int>(us.size());
    ++timed;
  }
  return timed;
}

// Fits the profile's executor terms to its own runs, through the simulator that will use them,
// so that it replays the runs in the time they took (bisection: the replay grows as each term
// grows). First core_efficiency, the share of the cores the ranks turn into work (ranks
// time-sliced on shared cores that meet at a collective every few milliseconds leave cores idle
// that processor sharing counts as busy: the last one to arrive computes alone, threads hand over
// through wake-ups), so that the runs together take what they took; with it comm_thread_share,
// the share of a core a communication thread takes from the computation beside it (1: a whole
// thread's worth, processor sharing's assumption; with it the BERT stack's oases runs at 4 ranks on
// 2 cores replayed 1..7% slow where its plain runs replayed -4..0%, bench/README.md): the share,
// on a grid refined around its best point, whose fitted core_efficiency leaves the smallest sum
// of the runs' squared relative errors (1 where no other does better: a single run, or runs that
// overlap nothing, leave it there). Only if the runs took longer than even half the cores
// explain, comm_sync_us, a time per collective on top (the share left at 1). Fitted to the runs'
// wall time, not to each collective's own duration: a rank that reaches a collective early waits
// there for its peers' computation, which the shared compute already counts. One factor on the
// cores, not a term per collective: on the validation model the plain schedule took the same time
// at 1 and 2 chunks (twice the collectives), and with the factor every schedule's prediction
// moved the same way (docs/PLANNER.md). Never faster than measured: when the simulator already
// gives the runs more than they took, nothing is subtracted (the check printed after says by how
// much).
Status calibrate_executor(const std::vector<CalibrationRun>& runs, const std::string& emulate, int threads, Profile* p,
                          std::vector<std::pair<double, double>>* replayed) {
  if (replayed) replayed->clear();
  p->comm_sync_us = p->comm_beside_compute_us = 0;
  p->core_efficiency = p->comm_thread_share = 1.0;
  if (runs.empty()) return Status::ok();
  // the simulator's time for the runs together (without the optimizer, which execute() does not run)
  auto replay = [&](std::vector<double>* each) -> Expected<double> {
    double t = 0;
    for (const CalibrationRun& c : runs) {
      ClusterSpec cluster = this_machine(c.ranks, p, emulate, threads);
      OpTimeModel ops = op_time_model(cluster, p);
      SimOptions o;
      o.cluster = &cluster;
      o.ops = &ops;
      o.local_floor = p;
      OASES_ASSIGN_OR_RETURN(SimResult r, simulate_rank(c.graph, c.order, c.mesh, o));
      double us = (r.step_s - r.optimizer_s) * 1e6;
      if (each) each->push_back(us);
      t += us;
    }
    return t;
  };
  double wall = 0;
  for (const CalibrationRun& c : runs) wall += c.wall_us;
  // bisection of *term in [lo, hi] (the replay grows with it when `grows`, else shrinks) to `wall`
  auto fit = [&](double* term, double lo, double hi, bool grows, double tol) -> Status {
    for (int i = 0; i < 40 && hi - lo > tol; ++i) {
      *term = 0.5 * (lo + hi);
      OASES_ASSIGN_OR_RETURN(double t, replay(nullptr));
      ((t < wall) == grows ? lo : hi) = *term;
    }
    *term = 0.5 * (lo + hi);
    return Status::ok();
  };
  constexpr double kLeastEfficiency = 0.5;
  OASES_ASSIGN_OR_RETURN(double at_full, replay(nullptr));
  if (at_full < wall) {
    p->core_efficiency = kLeastEfficiency;
    OASES_ASSIGN_OR_RETURN(double at_least, replay(nullptr));
    if (at_least <= wall) {  // half the cores do not explain it: a time per collective on top
      double hi = 1000;
      for (int i = 0; i < 12; ++i) {
        p->comm_sync_us = hi;
        OASES_ASSIGN_OR_RETURN(double t, replay(nullptr));
        if (t >= wall) break;
        hi *= 2;
      }
      OASES_RETURN_IF_ERROR(fit(&p->comm_sync_us, 0, hi, true, 1));
    } else {
      // the cores' share fitted at a communication-thread share: the runs' squared relative errors
      // (a share at which even half the cores give the runs too little: not a candidate)
      auto error_at = [&](double share, double* efficiency) -> Expected<double> {
        p->comm_thread_share = share;
        p->core_efficiency = kLeastEfficiency;
        OASES_ASSIGN_OR_RETURN(double least, replay(nullptr));
        if (least < wall) return std::numeric_limits<double>::infinity();
        OASES_RETURN_IF_ERROR(fit(&p->core_efficiency, kLeastEfficiency, 1.0, false, 1e-4));
        *efficiency = p->core_efficiency;
        std::vector<double> each;
        OASES_RETURN_IF_ERROR(replay(&each).status());
        double e = 0;
        for (size_t i = 0; i < runs.size(); ++i) e += std::pow(each[i] / runs[i].wall_us - 1, 2);
        return e;
      };
      double best_share = 1.0, best_eff = 1.0;
      OASES_ASSIGN_OR_RETURN(double best, error_at(1.0, &best_eff));
      auto consider = [&](double share) -> Status {
        double eff = 1.0;
        OASES_ASSIGN_OR_RETURN(double e, error_at(share, &eff));
        // better by more than the bisection's rounding (a squared 0.1%): runs that fit at any
        // share (one run, or runs that overlap nothing) keep the whole thread's worth
        if (e < best - 1e-6) best = e, best_share = share, best_eff = eff;
        return Status::ok();
      };
      for (int i = 9; i >= 0; --i) OASES_RETURN_IF_ERROR(consider(0.1 * i));
      for (double step : {0.05, 0.025, 0.0125}) {  // refined around the best point
        const double around = best_share;
        for (double share : {around - step, around + step}) {
          if (share >= 0 && share <= 1) OASES_RETURN_IF_ERROR(consider(share));
        }
      }
      p->comm_thread_share = best_share;
      p->core_efficiency = best_eff;
    }
  }
  if (replayed) {
    std::vector<double> r;
    OASES_RETURN_IF_ERROR(replay(&r).status());
    for (size_t i = 0; i < runs.size(); ++i) replayed->emplace_back(r[i], runs[i].wall_us);
  }
  return Status::ok();
}

}  // namespace oases
