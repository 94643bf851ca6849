// Collective matmuls (planner/collective_matmul.h): the sequence-parallel all-gathers before
// column-parallel products and the reduce-scatters after row-parallel ones (forward and
// backward) become ring steps, only in the parts asked for, and the schedule puts each step's
// product between the start and the wait of the next transfer. The numbers are checked end to end
// (tests/e2e/test_schedules.sh: every schedule reproduces the single-rank losses and gradients).
#include <gtest/gtest.h>

#include "graph/op_registry.h"
#include "planner/hybrid.h"
#include "planner/rank_program.h"
#include "planner/plan_report.h"
#include "planner/search.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

Graph forward_of(const std::string& model) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/" + model + "/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 4, 16);
  EXPECT_TRUE(pm) << pm.status().message();
  return std::move(pm->forward);
}

bool is_product(const Node& n) {
  return n.op_type == "MatMul" || n.op_type == "MatMulT";
}

struct Counts {
  int shifts = 0, gathers_into_products = 0, scatters_of_products = 0, assembles = 0;
  std::map<std::string, int> shifts_by_part;
};

Counts count(const Graph& g) {
  Counts c;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (n.op_type == "RingShift") {
      ++c.shifts;
      c.shifts_by_part[part_of_scope(n.scope)]++;
    }
    if (n.op_type == "RingAssemble") ++c.assembles;
    if (n.op_type == "AllGather") {
      for (const Use& u : g.uses(n.outputs[0])) c.gathers_into_products += u.slot == 0 && is_product(g.node(u.node));
    }
    if (n.op_type == "ReduceScatter") {
      NodeId p = g.producer(n.inputs[0]);
      c.scatters_of_products += p != kNoId && is_product(g.node(p));
    }
  }
  return c;
}

Expected<GlobalProgram> program(const Graph& fwd, int64_t tp, bool cm, const std::string& schedule = "") {
  Plan plan = Plan::megatron(tp, 1);
  plan.sequence_parallel = true;
  plan.collective_matmul = cm;
  plan.mesh().schedule = schedule;
  return build_global_program(fwd, TrainingSpec{}, plan, tp, GlobalProgramOptions{});
}

TEST(CollectiveMatmul, EveryGatherAndScatterBesideProductsBecomesRingSteps) {
  for (const char* model : {"gpt2_4l", "llama_4l"}) {
    Graph fwd = forward_of(model);
    for (int64_t tp : {2, 4}) {
      auto plain = program(fwd, tp, false);
      auto cm = program(fwd, tp, true);
      ASSERT_TRUE(plain && cm) << (plain ? cm.status().message() : plain.status().message());
      Counts before = count(plain->partitioned->local), after = count(cm->partitioned->local);
      ASSERT_GT(before.gathers_into_products, 0) << model;
      ASSERT_GT(before.scatters_of_products, 0) << model;
      EXPECT_EQ(before.shifts, 0);
      EXPECT_EQ(after.gathers_into_products, 0) << model << " tp " << tp;
      EXPECT_EQ(after.scatters_of_products, 0) << model << " tp " << tp;
      // n - 1 ring steps for every gather and scatter decomposed (llama's q/k/v gradients are one
      // sum of three products, scattered once)
      EXPECT_GT(after.shifts, 0);
      EXPECT_EQ(after.shifts % (tp - 1), 0);
      EXPECT_GT(after.assembles, 0);
      // the count of communicating nodes follows: each decomposed collective is n - 1 shifts
      int decomposed = after.shifts / static_cast<int>(tp - 1);
      EXPECT_EQ(cm->partitioned->collectives, plain->partitioned->collectives + after.shifts - decomposed);
    }
  }
}

TEST(CollectiveMatmul, OnlyThePartsAsked) {
  Graph fwd = forward_of("gpt2_4l");
  Plan plan = Plan::from_parts({}, 2, "", 1);
  ModelStructure ms = find_transformer_structure(fwd);
  for (const std::string& part : model_parts(ms)) {
    PartLayout l;
    l.part = part;
    l.tp = 2;
    l.sequence_parallel = true;
    l.collective_matmul = part == "layer.1.mlp";
    plan.mesh().parts.push_back(l);
  }
  auto gp = build_global_program(fwd, TrainingSpec{}, plan, 2, GlobalProgramOptions{});
  ASSERT_TRUE(gp) << gp.status().message();
  Counts c = count(gp->partitioned->local);
  ASSERT_EQ(c.shifts_by_part.size(), 1u);
  // the MLP's gather (forward) and scatter (forward), and their duals in the backward pass
  EXPECT_EQ(c.shifts_by_part["layer.1.mlp"], 4);
  EXPECT_GT(c.gathers_into_products, 0);  // the other parts keep theirs
}

TEST(CollectiveMatmul, EachStepsProductRunsWhileTheNextTransferFlies) {
  Graph fwd = forward_of("gpt2_4l");
  for (const char* schedule : {"plain", "oases"}) {
    auto gp = program(fwd, 4, true, schedule);
    ASSERT_TRUE(gp) << gp.status().message();
    auto rp = build_rank_program(*gp, 1);
    ASSERT_TRUE(rp) << rp.status().message();
    const Graph& g = rp->program.graph;
    const auto& order = rp->program.order;
    // for every shift: some product (or fused product) runs between its start and its wait
    int shifts = 0, overlapped = 0;
    std::map<NodeId, size_t> start;
    for (size_t i = 0; i < order.size(); ++i) {
      const Node& n = g.node(order[i].node);
      if (n.op_type != "RingShift") continue;
      if (order[i].kind == ScheduledOp::Kind::kCommStart) {
        start[order[i].node] = i;
        continue;
      }
      if (order[i].kind != ScheduledOp::Kind::kCommWait) continue;
      ++shifts;
      for (size_t j = start.at(order[i].node) + 1; j < i; ++j) {
        const Node& m = g.node(order[j].node);
        if (order[j].kind == ScheduledOp::Kind::kCompute && op_has_trait(m, kTraitComputeBound)) {
          ++overlapped;
          break;
        }
      }
    }
    ASSERT_GT(shifts, 0);
    EXPECT_EQ(overlapped, shifts) << "schedule '" << schedule << "': " << shifts - overlapped << " ring steps with no product beside them";
  }
}

TEST(CollectiveMatmul, PlanFileKeepsTheChoice) {
  Plan p = Plan::megatron(2, 1);
  p.sequence_parallel = true;
  p.collective_matmul = true;
  auto back = Plan::from_json(p.to_json(), "mem.json");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_TRUE(back->collective_matmul);
  EXPECT_NE(p.to_string().find("collective matmuls"), std::string::npos);
}

// The cost model: under an in-line schedule the ring steps hide behind the partial products (what
// sequence parallelism alone leaves exposed) at the price of the copies, and the embedding has
// nothing to decompose; --no-collective-matmul keeps them out of the search. (That the search
// takes them where the hidden time outweighs the copies, and not where the link is fast:
// tests/e2e/test_planner.sh, on a stack big enough for it.)
TEST(CollectiveMatmul, PricedPerPart) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/gpt2_4l/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 8, 64);
  ASSERT_TRUE(pm) << pm.status().message();
  auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, 2);
  ASSERT_TRUE(a) << a.status().message();
  // this machine's CPU behind an emulated link about as slow as its products are long
  ClusterSpec cluster = this_machine(2, nullptr, "bw=0.5,latency=10", 1);
  OpTimeModel ops = op_time_model(cluster, nullptr);
  CostModel cm(*a, cluster, ops);
  auto plain = *schedule_by_name("plain");
  int blocks = 0;
  for (int i = 0; i < cm.num_parts(); ++i) {
    bool has_cm = false;
    for (const Layout& l : cm.layouts(i, 1)) has_cm |= l.collective_matmul;
    if (a->parts[static_cast<size_t>(i)] == "embedding") {
      EXPECT_FALSE(has_cm);
      continue;
    }
    ASSERT_TRUE(has_cm) << a->parts[static_cast<size_t>(i)];
    Layout sp{2, true}, ring{2, true, true};
    PartTime ts = cm.part_time(i, sp, sp, plain, 1), tc = cm.part_time(i, ring, ring, plain, 1);
    EXPECT_NEAR(tc.comm, ts.comm, 1e-12 * ts.comm);  // the same bytes, in ring steps
    EXPECT_LT(tc.exposed, ts.exposed) << a->parts[static_cast<size_t>(i)];
    EXPECT_GE(tc.exposed, 0);
    EXPECT_GT(tc.compute, ts.compute);  // the copies that place and pick the parts
    blocks += a->parts[static_cast<size_t>(i)].rfind("layer.", 0) == 0;
  }
  EXPECT_EQ(blocks, 8);
  SearchOptions o;
  o.schedules = {"plain"};
  o.chunks = {1};
  o.degrees = {2};
  o.allow_collective_matmul = false;
  SearchResult off = search_plan(cm, o);
  ASSERT_TRUE(off.found);
  for (const Layout& l : off.best.layouts) EXPECT_FALSE(l.collective_matmul);
}

}  // namespace
}  // namespace oases
