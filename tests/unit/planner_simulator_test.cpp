// The simulator replays what the executor runs (the compiled program, with its fused ops) and
// charges the executor's own costs the profile measured: a dispatch time per instruction and a
// hand-off time per collective start, both on the compute thread; and the collectives' extra time
// on the communication thread (more beside computation).
#include <gtest/gtest.h>

#include "planner/simulator.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

struct Fixture {
  PlanningModel pm;
  ModelAnalysis a;
  ClusterSpec cluster;
  RankProgram rp;
};

Fixture make(const std::string& schedule, int64_t chunks) {
  Fixture f;
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/gpt2_bytes/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 8, 16);
  EXPECT_TRUE(pm) << pm.status().message();
  f.pm = std::move(*pm);
  auto a = analyze_model(f.pm.forward, f.pm.train.graph, f.pm.train.params, 2);
  EXPECT_TRUE(a) << a.status().message();
  f.a = std::move(*a);
  f.cluster = this_machine(2, nullptr, "bw=1,latency=50", 1);
  PlanChoice plan;
  plan.layouts.assign(f.a.parts.size(), Layout{2, false});
  plan.schedule = schedule;
  plan.chunks = chunks;
  auto rp = planned_rank_program(f.pm, plan_of_choice(f.a, plan, 2));
  EXPECT_TRUE(rp) << rp.status().message();
  f.rp = std::move(*rp);
  return f;
}

Profile base_profile() {
  Profile p;
  p.has_device = true;
  p.device = *find_device("CPU");
  p.ranks = 2;
  return p;
}

TEST(PlannerSimulator, ReplaysTheCompiledProgram) {
  Fixture f = make("oases", 2);
  int fused = 0, starts = 0;
  for (NodeId id : f.rp.program.graph.nodes()) fused += f.rp.program.graph.node(id).op_type == "FusedMatMul";
  for (const ScheduledOp& op : f.rp.program.order) starts += op.kind == ScheduledOp::Kind::kCommStart;
  EXPECT_GT(fused, 0) << "the executor fuses MatMul + bias; the simulator must see those nodes";
  EXPECT_GT(starts, 0);
  // a profile sample at a fused node's exact key is what the simulator charges for it
  NodeId some = kNoId;
  for (NodeId id : f.rp.program.graph.nodes()) {
    if (f.rp.program.graph.node(id).op_type == "FusedMatMul") some = id;
  }
  Profile p = base_profile();
  OpSample s;
  s.op = node_op_name(f.rp.program.graph.node(some));
  s.key = node_key(f.rp.program.graph, f.rp.program.graph.node(some));
  s.flops = 1;
  s.us = 12345;
  p.ops.push_back(s);
  OpTimeModel ops(&p, p.device, 1.0);
  EXPECT_NEAR(ops.node_seconds(f.rp.program.graph, f.rp.program.graph.node(some)), 12345e-6, 1e-12);
}

TEST(PlannerSimulator, ChargesDispatchAndHandOff) {
  for (const char* sched : {"plain", "oases"}) {
    Fixture f = make(sched, std::string(sched) == "plain" ? 1 : 2);
    int64_t starts = 0, others = 0;
    for (const ScheduledOp& op : f.rp.program.order) (op.kind == ScheduledOp::Kind::kCommStart ? starts : others)++;
    Profile p0 = base_profile();
    Profile p1 = p0;
    p1.instr_us = 7;
    p1.comm_start_us = 900;
    OpTimeModel m0(&p0, p0.device, 1.0), m1(&p1, p1.device, 1.0);
    SimOptions o;
    o.cluster = &f.cluster;
    o.param_bytes = f.rp.param_bytes;
    o.ops = &m0;
    auto r0 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    o.ops = &m1;
    auto r1 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    ASSERT_TRUE(r0 && r1);
    double charged = 7e-6 * static_cast<double>(others) + 900e-6 * static_cast<double>(starts);
    EXPECT_EQ(r0->overhead_s, 0);
    EXPECT_NEAR(r1->overhead_s, charged, 1e-9) << sched;
    EXPECT_NEAR(r1->compute_s, r0->compute_s, 1e-12);
    // the compute thread is delayed by the overheads; waits may absorb part of it, never more
    EXPECT_GT(r1->step_s, r0->step_s);
    EXPECT_LE(r1->step_s, r0->step_s + charged + 1e-9) << sched;
  }
}

// A collective's extra time on the communication thread: comm_sync_us on every one, plus
// comm_beside_compute_us scaled by the share of its time the compute thread computes.
TEST(PlannerSimulator, ChargesCollectivesBesideComputation) {
  for (const char* sched : {"plain", "oases"}) {
    Fixture f = make(sched, std::string(sched) == "plain" ? 1 : 2);
    Profile p0 = base_profile();
    Profile p1 = p0, p2 = p0;
    p1.comm_sync_us = 300;
    p2.comm_sync_us = 300;
    p2.comm_beside_compute_us = 2000;
    OpTimeModel m0(&p0, p0.device, 1.0), m1(&p1, p1.device, 1.0), m2(&p2, p2.device, 1.0);
    SimOptions o;
    o.cluster = &f.cluster;
    o.ops = &m0;
    auto r0 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    o.ops = &m1;
    auto r1 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    o.ops = &m2;
    auto r2 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    ASSERT_TRUE(r0 && r1 && r2);
    ASSERT_GT(r0->collectives, 0);
    double n = r0->collectives;
    EXPECT_NEAR(r1->comm_s, r0->comm_s + n * 300e-6, 1e-9) << sched;
    EXPECT_NEAR(r1->compute_s, r0->compute_s, 1e-12);
    EXPECT_GE(r1->step_s, r0->step_s);
    // between no collective beside computation and all of them wholly beside it
    EXPECT_GE(r2->comm_s, r1->comm_s - 1e-12) << sched;
    EXPECT_LE(r2->comm_s, r1->comm_s + n * 2000e-6 + 1e-9) << sched;
    if (std::string(sched) == "oases") {
      // the interleaved schedule runs collectives beside the other chunk's computation
      EXPECT_GT(r2->comm_s, r1->comm_s + 1e-6) << "no collective was charged as beside computation";
    }
  }
}

TEST(PlannerSimulator, ProfileKeepsExecutorOverheads) {
  Profile p = base_profile();
  p.instr_us = 3.5;
  p.comm_start_us = 1500;
  p.comm_sync_us = 250;
  p.comm_beside_compute_us = 1800;
  p.core_efficiency = 0.85;
  p.comm_thread_share = 0.4;
  auto q = profile_from_json(p.to_json(), "test");
  ASSERT_TRUE(q) << q.status().message();
  EXPECT_DOUBLE_EQ(q->instr_us, 3.5);
  EXPECT_DOUBLE_EQ(q->comm_start_us, 1500);
  EXPECT_DOUBLE_EQ(q->comm_sync_us, 250);
  EXPECT_DOUBLE_EQ(q->comm_beside_compute_us, 1800);
  EXPECT_DOUBLE_EQ(q->core_efficiency, 0.85);
  EXPECT_DOUBLE_EQ(q->comm_thread_share, 0.4);
  nlohmann::json bad = p.to_json();
  bad["executor"]["comm_start_us"] = -1;
  EXPECT_FALSE(profile_from_json(bad, "test"));
  bad = p.to_json();
  bad["executor"]["comm_beside_compute_us"] = -5;
  EXPECT_FALSE(profile_from_json(bad, "test"));
  for (double e : {0.0, -0.5, 1.5}) {
    bad = p.to_json();
    bad["executor"]["core_efficiency"] = e;
    auto r = profile_from_json(bad, "test");
    ASSERT_FALSE(r) << e;
    EXPECT_NE(r.status().message().find("core_efficiency"), std::string::npos) << r.status().message();
  }
  for (double e : {-0.1, 1.5}) {
    bad = p.to_json();
    bad["executor"]["comm_thread_share"] = e;
    auto r = profile_from_json(bad, "test");
    ASSERT_FALSE(r) << e;
    EXPECT_NE(r.status().message().find("comm_thread_share"), std::string::npos) << r.status().message();
  }
  // no profile: nothing charged
  OpTimeModel none(nullptr, p.device, 1.0);
  EXPECT_EQ(none.instr_seconds(), 0);
  EXPECT_EQ(none.comm_start_seconds(), 0);
  EXPECT_EQ(none.comm_sync_seconds(), 0);
  EXPECT_EQ(none.comm_beside_compute_seconds(), 0);
}

}  // namespace
}  // namespace oases
