#include "executor/measure_cuda.h"

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "executor/device.h"
#include "executor/executor.h"
#include "planner/rank_program.h"
#include "planner/search.h"

namespace oases {

namespace {

// One node of `g` alone: its non-constant inputs become graph inputs, its constant inputs stay
// constants, its outputs the graph's.
Graph one_node_graph(const Graph& g, const Node& n) {
  Graph out;
  std::vector<ValueId> ins, outs;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    ValueId v = n.inputs[i];
    if (v == kNoId) {
      ins.push_back(kNoId);
      continue;
    }
    const Value& val = g.value(v);
    std::string name = "in" + std::to_string(i);
    ins.push_back(val.is_constant() ? out.add_initializer(name, val.constant) : out.add_input(name, val.dtype, val.shape));
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    ValueId v = n.outputs[i];
    if (v == kNoId) {
      outs.push_back(kNoId);
      continue;
    }
    outs.push_back(out.add_value("out" + std::to_string(i), g.value(v).dtype, g.value(v).shape, true));
  }
  out.add_node(n.op_type, ins, outs, n.attrs, n.name, n.domain);
  std::vector<ValueId> results;
  for (ValueId v : outs) {
    if (v != kNoId) results.push_back(v);
  }
  out.set_outputs(results);
  return out;
}

// Random floats, zero integers: valid indices, labels and masks for any op.
std::map<std::string, Tensor> feeds_for(const Graph& g, std::mt19937_64& rng) {
  std::map<std::string, Tensor> feeds;
  std::normal_distribution<double> normal(0.0, 0.5);
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    Tensor t(val.dtype, val.shape);
    if (is_floating(val.dtype)) {
      for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t.raw_mutable(), val.dtype, i, normal(rng));
    } else {
      std::fill_n(static_cast<char*>(t.raw_mutable()), t.nbytes(), 0);
    }
    feeds[val.name] = t;
  }
  return feeds;
}

// Median device time (ms) of the single instruction of `g` over `reps` runs after one warm-up.
Expected<double> time_alone(const Graph& g, int reps, std::mt19937_64& rng) {
  ExecOptions eo;
  eo.device = "cuda";
  eo.fuse = false;
  OASES_ASSIGN_OR_RETURN(auto ex, Executor::create(g, eo));
  ex->state().training = true;
  ex->set_node_timing(true);
  auto feeds = feeds_for(g, rng);
  OASES_RETURN_IF_ERROR(ex->execute(feeds));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    OASES_RETURN_IF_ERROR(ex->execute(feeds));
    double sum = 0;
    for (double x : ex->node_ms()) sum += x;
    ms.push_back(sum);
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

Expected<DeviceSpec> measure_cuda_device() {
  OASES_RETURN_IF_ERROR(cuda_usable());
  nlohmann::json rep = nlohmann::json::parse(cuda_report_json());
  DeviceSpec d;
  const auto& dev = rep["devices"];
  d.name = dev.contains("names") && !dev["names"].empty() ? dev["names"][0].get<std::string>() : "CUDA device";
  if (dev.contains("memory_gib") && !dev["memory_gib"].empty()) d.memory_gib = dev["memory_gib"][0].get<double>();
  std::mt19937_64 rng(3);
  auto product = [&](DType t, int64_t n) -> Expected<double> {  // TFLOP/s of an n x n x n product
    Graph g;
    ValueId a = g.add_input("a", t, {n, n}), b = g.add_input("b", t, {n, n});
    ValueId c = g.add_value("c", t, {n, n}, true);
    g.add_node("MatMul", {a, b}, {c}, {}, "matmul");
    g.set_outputs({c});
    OASES_ASSIGN_OR_RETURN(double ms, time_alone(g, 5, rng));
    return 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12;
  };
  OASES_ASSIGN_OR_RETURN(d.fp32_tflops, product(DType::kF32, 4096));
  OASES_ASSIGN_OR_RETURN(d.fp16_tflops, product(DType::kBF16, 8192));
  {  // streaming: a copy of 256 MiB, bytes read and written
    Graph g;
    const int64_t n = int64_t(64) << 20;
    ValueId x = g.add_input("x", DType::kF32, {n});
    ValueId y = g.add_value("y", DType::kF32, {n}, true);
    g.add_node("Neg", {x}, {y}, {}, "stream");
    g.set_outputs({y});
    OASES_ASSIGN_OR_RETURN(double ms, time_alone(g, 5, rng));
    d.memory_gbps = 2.0 * static_cast<double>(n) * 4 / (ms * 1e-3) / 1e9;
  }
  {  // one launch of a kernel with nothing to do
    Graph g;
    ValueId x = g.add_input("x", DType::kF32, {1});
    ValueId y = g.add_value("y", DType::kF32, {1}, true);
    g.add_node("Neg", {x}, {y}, {}, "launch");
    g.set_outputs({y});
    OASES_ASSIGN_OR_RETURN(double ms, time_alone(g, 20, rng));
    d.launch_us = ms * 1e3;
  }
  d.matmul_efficiency = 1.0;
  d.memory_efficiency = 1.0;
  d.source = "measured by oases-profile --backend cuda";
  return d;
}

Expected<DeviceOpsTimed> measure_model_ops_on_cuda(const Graph& forward, const std::string& model_path, const ModelAnalysis& a,
                                                   int64_t ranks, int64_t tp, int64_t chunks, const std::string& dtype, int reps,
                                                   std::map<std::string, OpSample>* acc) {
  Plan plan = Plan::from_parts(part_layouts_of(a, std::vector<Layout>(a.parts.size(), Layout{tp, false})), ranks, "plain", chunks);
  plan.dtype = dtype;
  GlobalProgramOptions go;
  go.model_path = model_path;
  OASES_ASSIGN_OR_RETURN(GlobalProgram gp, build_global_program(forward, TrainingSpec{}, plan, ranks, go));
  // the canonical nodes, unfused: what the planner's cost model and simulator price (a device
  // program's fused products cost less than their parts, so plans priced so are conservative)
  RankProgramOptions ro;
  ro.device = "cuda";
  ro.fuse = false;
  OASES_ASSIGN_OR_RETURN(RankProgram rp, build_rank_program(gp, 0, ro));
  const Graph& g = rp.program.graph;
  std::mt19937_64 rng(11);
  DeviceOpsTimed done;
  for (const ScheduledOp& op : rp.program.order) {
    if (op.kind != ScheduledOp::Kind::kCompute) continue;
    const Node& n = g.node(op.node);
    if (is_collective(n)) continue;
    OpCost c = node_cost(g, n);
    if (is_free_op(n, c)) continue;
    std::string key = node_key(g, n);
    if (acc->count(key)) continue;
    auto ms = time_alone(one_node_graph(g, n), reps, rng);
    if (!ms) {
      if (done.skipped++ == 0) done.first_error = n.describe() + ": " + ms.status().message();
      continue;
    }
    OpSample& s = (*acc)[key];
    s.op = node_op_name(n);
    s.key = key;
    s.flops = c.flops;
    s.bytes = c.bytes;
    s.us = *ms * 1e3;
    s.samples = reps;
    ++done.timed;
  }
  return done;
}

}  // namespace oases
