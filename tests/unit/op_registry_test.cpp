// The op registry is the single source of truth for an op: every registered op has every piece
// (shape rule, gradient rule or differentiable=false with examples for the gradient check,
// sharding rule or an explicit marker, cost rule, CPU kernel, CUDA kernel or a stated reason), and
// the checker that says so names what is missing.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <thread>

#include "executor/communicator.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/kernel_context.h"
#include "graph/autodiff.h"
#include "graph/op_registry.h"
#include "graph/passes/pass.h"
#include "planner/partition.h"
#include "planner/propagation.h"
#include "tests/common/tensor_compare.h"

namespace oases {
namespace {

std::set<std::string> cpu_kernel_names() {
  std::set<std::string> s;
  for (const std::string& op : program_kernels().ops()) s.insert(op);
  return s;
}

// CUDA kernels and the ops exempt from one (executor/cuda_coverage.cpp); only in CUDA builds.
std::set<std::string> cuda_kernel_names() {
  std::set<std::string> s;
  for (const std::string& op : cuda_kernel_ops()) s.insert(op);
  for (const auto& [op, why] : cuda_exempt_ops()) s.insert(op);
  return s;
}

TEST(OpRegistry, EveryOpHasEveryPiece) {
  std::set<std::string> cpu = cpu_kernel_names(), cuda = cuda_kernel_names();
  KernelCoverage k;
  k.cpu = &cpu;
  k.cuda = cuda_built() ? &cuda : nullptr;
  int ops = 0;
  for (const OpSchema* s : OpRegistry::global().all()) {
    ++ops;
    for (const std::string& m : missing_pieces(*s, k)) ADD_FAILURE() << schema_key(*s) << ": missing " << m;
  }
  EXPECT_GT(ops, 100);
  RecordProperty("ops_checked", ops);
  std::cout << "[ registry ] " << ops << " ops checked" << (k.cuda ? " (CUDA kernels included)" : " (no CUDA backend)") << "\n";
}

// The other direction: every kernel belongs to a registered op.
TEST(OpRegistry, EveryKernelHasASchema) {
  std::set<std::string> known;
  for (const OpSchema* s : OpRegistry::global().all()) known.insert(schema_key(*s));
  for (const std::string& op : cpu_kernel_names()) EXPECT_TRUE(known.count(op)) << "CPU kernel " << op << " has no schema";
  for (const std::string& op : cuda_kernel_ops()) EXPECT_TRUE(known.count(op)) << "CUDA kernel " << op << " has no schema";
}

// A half-written op in a registry of its own: the checker names each piece it lacks.
TEST(OpRegistry, CheckerNamesEveryMissingPiece) {
  OpRegistry r;
  OpSchema s;
  s.domain = "test";
  s.op_type = "HalfWritten";
  r.add(s);
  std::set<std::string> cpu{"test.Other"}, cuda{"test.Other"};
  KernelCoverage k{&cpu, &cuda};
  const OpSchema& half = *r.find("test", "HalfWritten");
  std::vector<std::string> miss = missing_pieces(half, k);
  auto names = [&](const std::string& what) {
    for (const std::string& m : miss) {
      if (m.find(what) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_EQ(miss.size(), 6u) << fmt::format("{}", fmt::join(miss, "; "));
  EXPECT_TRUE(names("shape rule"));
  EXPECT_TRUE(names("gradient rule"));
  EXPECT_TRUE(names("sharding rule"));
  EXPECT_TRUE(names("cost rule"));
  EXPECT_TRUE(names("CPU kernel"));
  EXPECT_TRUE(names("CUDA kernel"));

  // a gradient without examples for the gradient check is still incomplete
  OpSchema* w = &s;  // the same op, filled in piece by piece
  w->infer = [](InferContext&) { return Status::ok(); };
  w->grad = [](GradContext&) { return Status::ok(); };
  w->shard = [](ShardContext&) { return Status::ok(); };
  w->cost = zero_cost;
  cpu.insert("test.HalfWritten");
  cuda.insert("test.HalfWritten");
  miss = missing_pieces(*w, k);
  ASSERT_EQ(miss.size(), 1u) << fmt::format("{}", fmt::join(miss, "; "));
  EXPECT_TRUE(names("examples"));
  w->examples = [] { return std::vector<OpExample>{OpExample{"tiny", {ex_float({2})}, {}, 1}}; };
  EXPECT_TRUE(missing_pieces(*w, k).empty());

  // markers stand in for pieces, and contradictions are named
  w->grad = nullptr;
  w->differentiable = false;
  w->shard = nullptr;
  w->traits = kTraitPostPartition | kTraitNoKernel;
  miss = missing_pieces(*w, k);
  ASSERT_EQ(miss.size(), 1u) << fmt::format("{}", fmt::join(miss, "; "));
  EXPECT_TRUE(names("no-kernel trait contradicts"));
  cpu.erase("test.HalfWritten");
  cuda.erase("test.HalfWritten");
  EXPECT_TRUE(missing_pieces(*w, k).empty());
  // no CUDA backend: the CUDA piece is not asked for
  w->traits = kTraitPostPartition;
  cpu.insert("test.HalfWritten");
  EXPECT_TRUE(missing_pieces(*w, KernelCoverage{&cpu, nullptr}).empty());
  EXPECT_EQ(missing_pieces(*w, k).size(), 1u);
}

TEST(OpRegistry, TraitsAnswerForNodes) {
  Node ln, mm, ar, fused;
  ln.op_type = "LayerNormalization";
  mm.op_type = "MatMul";
  ar.op_type = "AllReduce";
  ar.domain = kOasesDomain;
  fused.op_type = "FusedMatMul";
  fused.domain = "oases.cpu";
  EXPECT_TRUE(op_has_trait(ln, kTraitNorm));
  EXPECT_FALSE(op_has_trait(mm, kTraitNorm));
  EXPECT_TRUE(op_has_trait(mm, kTraitLinear));
  EXPECT_TRUE(op_has_trait(ar, kTraitCollective));
  EXPECT_TRUE(is_collective(ar));
  EXPECT_TRUE(op_has_trait(fused, kTraitComputeBound));
  EXPECT_TRUE(op_has_trait(fused, kTraitPostPartition));
}

// The traits that replaced the op lists of graph/blocks.cpp, graph/parameters.cpp and
// planner/chunking.cpp are set on exactly the ops those lists named ("domain.Op" for others than
// ai.onnx). ConvTranspose, in the old weight list, is no registered op: check_supported stops a
// graph holding one before the classification reads it.
TEST(OpRegistry, ClassifyingTraitsSitOnTheOpsTheOldListsNamed) {
  auto ops_with = [](uint32_t trait) {
    std::set<std::string> s;
    for (const OpSchema* op : OpRegistry::global().all()) {
      if (op->traits & trait) s.insert(schema_key(*op));
    }
    return s;
  };
  using Set = std::set<std::string>;
  EXPECT_EQ(ops_with(kTraitActivation), (Set{"Gelu", "Relu", "oases.Silu", "oases.SwiGLU"}));
  EXPECT_EQ(ops_with(kTraitWeightProduct), (Set{"MatMul", "Gemm", "Conv", "Einsum"}));
  EXPECT_EQ(ops_with(kTraitRelayout), (Set{"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Cast", "Identity", "Expand"}));
  EXPECT_EQ(ops_with(kTraitShapeOnly), (Set{"Shape", "Size"}));
  EXPECT_EQ(ops_with(kTraitCombinesChunks),
            (Set{"oases.AllReduce", "oases.AllGather", "oases.ReduceScatter", "oases.ShardSlice", "oases.AllToAll", "oases.Broadcast"}));
  // what chunking and parameter classification read from traits that existed before
  EXPECT_EQ(ops_with(kTraitRandom), (Set{"Dropout", "oases.DropoutGrad"}));
  EXPECT_EQ(ops_with(kTraitNorm), (Set{"LayerNormalization", "oases.RMSNormalization"}));
  Set named_normalization;
  for (const OpSchema* op : OpRegistry::global().all()) {
    if (op->op_type.find("Normalization") != std::string::npos) named_normalization.insert(schema_key(*op));
  }
  EXPECT_EQ(named_normalization, ops_with(kTraitNorm));
}

// --- the split-state table (after ggml's test-backend-ops) ------------------------------------
// For each op example and each way of splitting one input dimension over a 2-rank mesh that the
// op's sharding rule accepts: partition the one-op graph (outputs gathered whole), run it on two
// thread ranks and compare every output with the unsplit run. A rule that accepts a split and
// computes wrongly fails here, and so does an op whose shard rule changes local shapes but which
// has no lower rule for its shape attributes (the partitioner's shape re-check names it).

struct OneOp {
  Graph g;
  std::vector<ValueId> inputs;  // kNoId for none
};

OneOp build_one_op(const OpSchema& s, const OpExample& ex) {
  OneOp o;
  o.g.opset_imports[""] = 18;
  std::mt19937 rng(99);
  for (const ExampleInput& in : ex.inputs) {
    Tensor t;
    if (in.data) {
      t = in.data->clone();
    } else {
      t = Tensor(DType::kF64, in.shape);
      std::uniform_real_distribution<double> u(in.lo, in.hi);
      for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<double>()[i] = u(rng);
    }
    o.inputs.push_back(o.g.add_initializer(o.g.unique_name("in"), t));
  }
  NodeId id = o.g.add_node_new_outputs(s.op_type, o.inputs, ex.outputs, ex.attrs, "op", s.domain);
  o.g.set_outputs(o.g.node(id).outputs);
  return o;
}

Expected<std::vector<Tensor>> run_whole(const Graph& g) {
  OASES_ASSIGN_OR_RETURN(auto ex, Executor::create(g));
  return ex->run({});
}

// Runs the partitioned graph on two thread ranks; returns rank 0's outputs and checks rank 1 agrees.
Expected<std::vector<Tensor>> run_two_ranks(const PartitionedGraph& pg) {
  auto world = make_local_world(2, 60);
  std::vector<Expected<std::vector<Tensor>>> res(2, Status::error("not run"));
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      auto comm = local_communicator(world, r);
      auto group = comm->make_group({0, 1});
      ExecOptions o;
      o.groups = {group.get()};
      auto ex = Executor::create(local_graph_for_rank(pg, r), o);
      if (!ex) {
        comm->abort(ex.status().message());
        res[r] = ex.status();
        return;
      }
      try {
        res[r] = (*ex)->run({});
      } catch (const std::exception& e) {
        comm->abort(e.what());
        res[r] = Status::error(e.what());
      }
      if (!res[r]) comm->abort(res[r].status().message());
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    if (!res[r]) return error("rank {}: {}", r, res[r].status().message());
  }
  return std::move(res[0]);
}

// One accepted split: every spec fits its value, the partitioned graph runs on two ranks and
// gives the whole op's outputs.
void check_split(const Graph& whole, const ShardingResult& sr, const Mesh& mesh, const std::vector<Tensor>& want) {
  for (size_t v = 0; v < whole.num_values() && v < sr.specs.size(); ++v) {
    const Value& val = whole.value(static_cast<ValueId>(v));
    if (!val.has_shape) continue;
    Status st = sr.specs[v].validate(val.shape, mesh);
    EXPECT_TRUE(st.is_ok()) << "value " << val.name << " " << sr.specs[v].to_string(&mesh) << ": " << st.message();
  }
  auto pg = partition_graph(whole, sr);
  ASSERT_TRUE(pg) << pg.status().message();
  auto got = run_two_ranks(*pg);
  ASSERT_TRUE(got) << got.status().message();
  ASSERT_EQ(got->size(), want.size());
  for (size_t k = 0; k < got->size(); ++k) {
    ASSERT_EQ((*got)[k].shape(), want[k].shape()) << "output " << k;
    EXPECT_LE(test::max_rel_diff((*got)[k], want[k]), 1e-9) << "output " << k;
  }
}

TEST(OpRegistry, SplitStatesComputeWhatTheWholeOpComputes) {
  const Mesh mesh{{"tp"}, {2}, {}};
  int ops = 0, accepted = 0, rejected = 0;
  std::set<std::string> ops_split;
  for (const OpSchema* s : OpRegistry::global().all()) {
    if (!s->examples || (s->traits & (kTraitPostPartition | kTraitNoKernel))) continue;
    ++ops;
    for (const OpExample& ex : s->examples()) {
      const std::string what = schema_key(*s) + " / " + ex.name;
      OneOp whole = build_one_op(*s, ex);
      InferShapesPass infer;
      auto inf = infer.run(whole.g);
      ASSERT_TRUE(inf) << what << ": " << inf.status().message();
      auto want = run_whole(whole.g);
      ASSERT_TRUE(want) << what << ": " << want.status().message();
      for (size_t i = 0; i < whole.inputs.size(); ++i) {
        const Shape& shape = whole.g.value(whole.inputs[i]).shape;
        for (size_t d = 0; d < shape.size(); ++d) {
          if (shape[d] % 2 != 0) continue;
          const std::string where = fmt::format("{}: input {} split along dim {}", what, i, d);
          SCOPED_TRACE(where);
          std::map<ValueId, ShardingSpec> seeds;
          seeds[whole.inputs[i]] = ShardingSpec::replicated(shape.size()).with_dim(d, 0);
          auto sr = propagate_sharding(whole.g, mesh, seeds, {});
          if (!sr) {
            ++rejected;  // the rule refuses this split (an error naming the op): nothing to run
            continue;
          }
          ++accepted;
          ops_split.insert(schema_key(*s));
          check_split(whole.g, *sr, mesh, *want);
        }
      }
    }
  }
  std::cout << "[ split table ] " << ops << " ops with examples; " << accepted << " splits accepted and checked on 2 ranks ("
            << ops_split.size() << " ops), " << rejected << " refused by the rules\n";
  EXPECT_GT(accepted, 100);
}

// The same table over the op's training graph: loss = Σ_k Σ y_k ∘ R_k, its gradients with respect
// to the float inputs as outputs. This runs the backward ops' sharding and lowering rules
// (SliceGrad, GatherGrad, the vocabulary-parallel loss gradient, DropoutGrad, ...) and the
// collectives the partitioner puts between them.
Expected<OneOp> build_training(const OpSchema& s, const OpExample& ex) {
  OneOp o = build_one_op(s, ex);
  std::vector<ValueId> ys = o.g.outputs(), params;
  for (size_t i = 0; i < ex.inputs.size(); ++i) {
    if (!ex.inputs[i].data) params.push_back(o.inputs[i]);
  }
  InferShapesPass infer;
  OASES_RETURN_IF_ERROR(infer.run(o.g).status());
  std::mt19937 rng(7);
  ValueId loss = kNoId;
  for (ValueId y : ys) {
    const Value yv = o.g.value(y);
    if (!is_floating(yv.dtype)) continue;
    Tensor r(yv.dtype, yv.shape);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < r.numel(); ++i) store_from_double(r.raw_mutable(), r.dtype(), i, u(rng));
    ValueId prod = o.g.node(o.g.add_node_new_outputs("Mul", {y, o.g.add_constant("r", r)}, 1)).outputs[0];
    std::vector<int64_t> all;
    for (size_t d = 0; d < yv.shape.size(); ++d) all.push_back(static_cast<int64_t>(d));
    ValueId part = o.g.node(o.g.add_node_new_outputs("ReduceSum", {prod}, 1,
                                                     AttrMap{{"axes", Attribute::of_ints(all)}, {"keepdims", Attribute::of_int(0)}}))
                       .outputs[0];
    loss = loss == kNoId ? part : o.g.node(o.g.add_node_new_outputs("Add", {loss, part}, 1)).outputs[0];
  }
  if (loss == kNoId) return error("no floating output");
  OASES_RETURN_IF_ERROR(infer.run(o.g).status());
  o.g.set_outputs({loss});
  OASES_ASSIGN_OR_RETURN(BackwardResult bw, build_backward(o.g, loss, params));
  std::vector<ValueId> outs{loss};
  for (ValueId p : params) {
    if (bw.grads.count(p)) outs.push_back(bw.grads.at(p));
  }
  o.g.set_outputs(outs);
  OASES_RETURN_IF_ERROR(infer.run(o.g).status());
  return o;
}

TEST(OpRegistry, SplitStatesOfTheTrainingGraph) {
  const Mesh mesh{{"tp"}, {2}, {}};
  int accepted = 0, rejected = 0;
  std::set<std::string> ops_split;
  for (const OpSchema* s : OpRegistry::global().all()) {
    if (!s->differentiable || !s->examples || (s->traits & (kTraitPostPartition | kTraitNoKernel))) continue;
    for (const OpExample& ex : s->examples()) {
      const std::string what = schema_key(*s) + " / " + ex.name + " (training graph)";
      auto train = build_training(*s, ex);
      ASSERT_TRUE(train) << what << ": " << train.status().message();
      auto want = run_whole(train->g);
      ASSERT_TRUE(want) << what << ": " << want.status().message();
      for (size_t i = 0; i < train->inputs.size(); ++i) {
        const Shape& shape = train->g.value(train->inputs[i]).shape;
        for (size_t d = 0; d < shape.size(); ++d) {
          if (shape[d] % 2 != 0) continue;
          SCOPED_TRACE(fmt::format("{}: input {} split along dim {}", what, i, d));
          std::map<ValueId, ShardingSpec> seeds;
          seeds[train->inputs[i]] = ShardingSpec::replicated(shape.size()).with_dim(d, 0);
          auto sr = propagate_sharding(train->g, mesh, seeds, {});
          if (!sr) {
            ++rejected;
            continue;
          }
          ++accepted;
          ops_split.insert(schema_key(*s));
          check_split(train->g, *sr, mesh, *want);
        }
      }
    }
  }
  std::cout << "[ split table, training graphs ] " << accepted << " splits accepted and checked on 2 ranks (" << ops_split.size()
            << " ops), " << rejected << " refused by the rules\n";
  EXPECT_GT(accepted, 100);
}

}  // namespace
}  // namespace oases
