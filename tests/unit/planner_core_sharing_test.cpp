// Ranks sharing cores (processor sharing): a host's cores are shared evenly by the threads that
// want them. The profile's op samples are work (the compute thread's own CPU time); the op-time
// model multiplies them by the slowdown of every rank's compute threads at once; the simulator
// slows computation further while the communication threads work beside it, and stretches a
// collective's work by the threads on the cores; oases-profile fits what a collective costs
// beyond that to its own runs.
#include <gtest/gtest.h>

#include "executor/measure_machine.h"
#include "planner/simulator.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

Profile cpu_profile(int cores, int64_t ranks) {
  Profile p;
  p.has_device = true;
  p.device = *find_device("CPU");
  p.ranks = ranks;
  p.machine = {{"cores", cores}};
  return p;
}

TEST(CoreSharing, EvenSharesOfTheCores) {
  ClusterSpec c;
  EXPECT_EQ(c.sharing_slowdown(64), 1.0) << "no cores given: every rank has a device of its own";
  c.cores_per_node = 2;
  c.gpus_per_node = 4;
  EXPECT_EQ(c.sharing_slowdown(1), 1.0);
  EXPECT_EQ(c.sharing_slowdown(2), 1.0);
  EXPECT_EQ(c.sharing_slowdown(3), 1.5);
  EXPECT_EQ(c.sharing_slowdown(8), 4.0);
  EXPECT_EQ(c.compute_slowdown(), 2.0) << "4 ranks x 1 thread on 2 cores";
  c.threads_per_rank = 2;
  EXPECT_EQ(c.compute_slowdown(), 4.0);
  c.ranks_sharing_cores = 8;  // emulated hosts: every rank of the machine on its cores
  EXPECT_EQ(c.compute_slowdown(), 8.0);
  c.cores_per_node = 1.5;  // a share of a loaded machine
  c.threads_per_rank = 1;
  c.ranks_sharing_cores = 0;
  EXPECT_DOUBLE_EQ(c.compute_slowdown(), 4 / 1.5);
}

TEST(CoreSharing, ClusterFilesGiveCoresPerNode) {
  nlohmann::json j = {{"format", "oases-cluster"},
                      {"version", 1},
                      {"device", "CPU"},
                      {"nodes", 2},
                      {"gpus_per_node", 8},
                      {"cores_per_node", 32},
                      {"threads_per_rank", 8},
                      {"links",
                       {{"intra_node", {{"kind", "shared-memory"}, {"bandwidth_gbps", 20}, {"latency_us", 1}}},
                        {"inter_node", {{"kind", "ethernet"}, {"bandwidth_gbps", 10}, {"latency_us", 5}}}}}};
  auto c = cluster_from_json(j, "c.json");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->cores_per_node, 32);
  EXPECT_EQ(c->compute_slowdown(), 2.0) << "8 ranks x 8 threads on 32 cores";
  auto again = cluster_from_json(c->to_json(), "again");
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->compute_slowdown(), 2.0);
  nlohmann::json bad = j;
  bad["cores_per_node"] = 0;
  EXPECT_FALSE(cluster_from_json(bad, "c.json"));
  bad = j;
  bad.erase("cores_per_node");
  auto no_cores = cluster_from_json(bad, "c.json");
  ASSERT_FALSE(no_cores) << "threads_per_rank without cores_per_node";
  EXPECT_NE(no_cores.status().message().find("cores_per_node"), std::string::npos) << no_cores.status().message();
  bad.erase("threads_per_rank");
  auto gpus = cluster_from_json(bad, "c.json");
  ASSERT_TRUE(gpus);
  EXPECT_EQ(gpus->compute_slowdown(), 1.0);
}

TEST(CoreSharing, OpTimesAreWorkTimesTheSharing) {
  Profile p = cpu_profile(2, 4);
  OpSample s;
  s.op = "MatMul";
  s.key = "MatMul test";
  s.flops = 1e6;
  s.us = 1000;
  p.ops.push_back(s);
  p.instr_us = 2;
  p.optimizer_us_per_mib = 100;
  // thread-CPU samples are work: 4 ranks on 2 cores take twice as long, 2 ranks as long
  for (auto [ranks, want] : {std::pair<int64_t, double>{4, 2.0}, {2, 1.0}, {1, 1.0}, {8, 4.0}}) {
    ClusterSpec c = this_machine(ranks, &p, "", 1);
    EXPECT_EQ(c.cores_per_node, 2) << "the profile's cores, not this machine's";
    OpTimeModel m = op_time_model(c, &p);
    EXPECT_NEAR(m.seconds("MatMul", "MatMul test", 1e6, 0), want * 1e-3, 1e-12) << ranks << " ranks";
    EXPECT_NEAR(m.instr_seconds(), want * 2e-6, 1e-15);
    EXPECT_NEAR(m.optimizer_seconds(1 << 20), want * 100e-6, 1e-12) << "every rank updates at once";
  }
  // the cores the profile found free (other work took the rest)
  p.machine["cores_available"] = 1.0;
  EXPECT_EQ(p.core_capacity(), 1.0);
  EXPECT_NEAR(op_time_model(this_machine(2, &p, "", 1), &p).seconds("MatMul", "MatMul test", 1e6, 0), 2e-3, 1e-12);
  p.machine["cores_available"] = 3.0;  // never more than the cores
  EXPECT_EQ(p.core_capacity(), 2.0);
  // a wall-clock profile (written before op_clock, or with helper threads) holds the sharing it
  // ran under: 4 ranks on 2 cores measured 1000 us for 500 us of work
  Profile w = cpu_profile(2, 4);
  w.ops = p.ops;
  w.op_clock = "wall";
  EXPECT_EQ(w.work_divisor(), 2.0);
  EXPECT_NEAR(op_time_model(this_machine(4, &w, "", 1), &w).seconds("MatMul", "MatMul test", 1e6, 0), 1e-3, 1e-12);
  EXPECT_NEAR(op_time_model(this_machine(2, &w, "", 1), &w).seconds("MatMul", "MatMul test", 1e6, 0), 0.5e-3, 1e-12);
  // a GPU cluster shares nothing
  ClusterSpec gpu;
  gpu.device = *find_device("A100-SXM-80GB");
  gpu.gpus_per_node = 8;
  EXPECT_EQ(op_time_model(gpu, &p).sharing(), 1.0);
}

TEST(CoreSharing, ProfileRecordsItsClockAndCores) {
  Profile p = cpu_profile(2, 4);
  p.machine["cores_available"] = 1.5;
  auto q = profile_from_json(p.to_json(), "p.json");
  ASSERT_TRUE(q) << q.status().message();
  EXPECT_EQ(q->op_clock, "thread_cpu");
  EXPECT_EQ(q->cores(), 2);
  EXPECT_EQ(q->core_capacity(), 1.5);
  nlohmann::json legacy = p.to_json();
  legacy.erase("op_clock");
  legacy["executor"] = {{"instr_us", 1.0}, {"core_share", 1.4}};  // a fitted factor no longer read
  auto l = profile_from_json(legacy, "old.json");
  ASSERT_TRUE(l) << l.status().message();
  EXPECT_EQ(l->op_clock, "wall");
  nlohmann::json bad = p.to_json();
  bad["op_clock"] = "sundial";
  EXPECT_FALSE(profile_from_json(bad, "p.json"));
  bad = p.to_json();
  bad["machine"]["cores_available"] = -1;
  EXPECT_FALSE(profile_from_json(bad, "p.json"));
}

struct Program2 {
  PlanningModel pm;
  RankProgram rp;
};

Program2 program(const std::string& schedule, int64_t chunks) {
  Program2 f;
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/gpt2_bytes/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 8, 16);
  EXPECT_TRUE(pm) << pm.status().message();
  f.pm = std::move(*pm);
  auto a = analyze_model(f.pm.forward, f.pm.train.graph, f.pm.train.params, 2);
  EXPECT_TRUE(a) << a.status().message();
  PlanChoice plan;
  plan.layouts.assign(a->parts.size(), Layout{2, false});
  plan.schedule = schedule;
  plan.chunks = chunks;
  auto rp = planned_rank_program(f.pm, plan_of_choice(*a, plan, 2));
  EXPECT_TRUE(rp) << rp.status().message();
  f.rp = std::move(*rp);
  return f;
}

// shared-memory collective samples of a profile measured with 2 thread ranks on 2 cores
void add_shared_memory(Profile* p, double us) {
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    for (double bytes : {1024.0, 16777216.0}) {
      CollectiveSample s;
      s.kind = k;
      s.group = 2;
      s.bytes = bytes;
      s.us = us;
      s.link = "shared-memory";
      p->collectives.push_back(s);
    }
  }
}

TEST(CoreSharing, SimulatorSharesTheCores) {
  for (const char* sched : {"plain", "oases"}) {
    Program2 f = program(sched, std::string(sched) == "plain" ? 1 : 2);
    Profile p = cpu_profile(2, 2);  // no op samples: the measured device's roofline
    ClusterSpec alone = this_machine(2, &p, "bw=1,latency=50", 1);
    ClusterSpec halved = alone;
    halved.cores_per_node = 1;  // the same 2 ranks on one core
    OpTimeModel m_alone = op_time_model(alone, &p), m_halved = op_time_model(halved, &p);
    SimOptions o;
    o.param_bytes = f.rp.param_bytes;
    o.cluster = &alone;
    o.ops = &m_alone;
    auto r1 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    o.cluster = &halved;
    o.ops = &m_halved;
    auto r2 = simulate_rank(f.rp.program.graph, f.rp.program.order, f.rp.mesh, o);
    ASSERT_TRUE(r1 && r2);
    // without the collectives' work (no shared-memory samples) computation simply takes twice as long
    EXPECT_NEAR(r2->compute_s, 2 * r1->compute_s, 1e-9 * r1->compute_s) << sched;
    EXPECT_NEAR(r2->optimizer_s, 2 * r1->optimizer_s, 1e-12) << sched;
    EXPECT_NEAR(r2->comm_s, r1->comm_s, 1e-12) << sched << ": the emulated link sleeps, it takes no core";
    EXPECT_GT(r2->step_s, r1->step_s);
  }
}

TEST(CoreSharing, CollectivesWorkOnTheSharedCores) {
  // The communication threads' work (copying and reducing through memory, the profile's
  // shared-memory samples) takes a core too. With 2 ranks on 2 cores: beside computation a
  // collective's work shares the cores with both compute threads (twice as long), and the
  // computation beside it slows down; a collective the compute thread waits for runs alone.
  const double work_us = 3000;  // longer than the emulated link, so the work shows
  Program2 plain = program("plain", 1), oases = program("oases", 2);
  for (Program2* f : {&plain, &oases}) {
    bool interleaved = f == &oases;
    Profile p = cpu_profile(2, 2);
    p.device.fp32_tflops = 1e-5;  // a slow device: computation as long as the collectives
    p.device.memory_gbps = 0.05;
    add_shared_memory(&p, work_us);
    ClusterSpec c = this_machine(2, &p, "bw=1,latency=50", 1);
    OpTimeModel m = op_time_model(c, &p);
    SimOptions o;
    o.cluster = &c;
    o.ops = &m;
    o.local_floor = &p;
    auto shared = simulate_rank(f->rp.program.graph, f->rp.program.order, f->rp.mesh, o);
    ClusterSpec gpu_like = c;
    gpu_like.cores_per_node = 0;  // nothing shared: a collective takes max(link, measured floor)
    o.cluster = &gpu_like;
    auto apart = simulate_rank(f->rp.program.graph, f->rp.program.order, f->rp.mesh, o);
    ASSERT_TRUE(shared && apart);
    ASSERT_GT(apart->collectives, 0);
    double floor = apart->collectives * work_us * 1e-6;
    EXPECT_NEAR(apart->comm_s, floor, 1e-9);
    EXPECT_GE(shared->comm_s, apart->comm_s - 1e-9) << "sharing never speeds a collective up";
    EXPECT_LE(shared->comm_s, 2 * apart->comm_s + 1e-9) << "at most 4 threads on 2 cores";
    EXPECT_GE(shared->compute_s, apart->compute_s * (1 - 1e-9));
    EXPECT_LE(shared->compute_s, 2 * apart->compute_s);
    if (interleaved) {
      EXPECT_GT(shared->comm_s, apart->comm_s * 1.05) << "collectives beside computation share the cores";
      EXPECT_GT(shared->compute_s, apart->compute_s * 1.001) << "computation beside a collective's work slows down";
      EXPECT_GT(shared->step_s, apart->step_s);
    }
    // a communication thread that takes less of a core beside computation slows it less, and
    // none of a core not at all (2 ranks on 2 cores: the compute threads alone fill them)
    p.comm_thread_share = 0.5;
    o.cluster = &c;
    auto half = simulate_rank(f->rp.program.graph, f->rp.program.order, f->rp.mesh, o);
    p.comm_thread_share = 0;
    auto none = simulate_rank(f->rp.program.graph, f->rp.program.order, f->rp.mesh, o);
    ASSERT_TRUE(half && none);
    EXPECT_LE(half->compute_s, shared->compute_s * (1 + 1e-9));
    EXPECT_LE(none->compute_s, half->compute_s * (1 + 1e-9));
    EXPECT_NEAR(none->compute_s, apart->compute_s, 1e-9 * apart->compute_s);
    if (interleaved) EXPECT_LT(half->compute_s, shared->compute_s);
  }
}

// oases-profile's fit to its own runs: the share of the cores the ranks turn into work first (a
// run a little slower than processor sharing explains), a time per collective only beyond what
// half the cores explain.
TEST(CoreSharing, CalibrationFitsTheCoresShareThenTheCollectives) {
  Program2 f = program("plain", 1);
  Profile p = cpu_profile(2, 2);
  p.op_clock = "thread_cpu";
  CalibrationRun run;
  run.graph = f.rp.program.graph;
  run.order = f.rp.program.order;
  run.mesh = f.rp.mesh;
  run.ranks = 2;
  run.schedule = "plain";
  run.tp = 2;
  std::vector<std::pair<double, double>> replayed;
  // what the simulator gives the run with nothing added
  run.wall_us = 1;
  ASSERT_TRUE(calibrate_executor({run}, "bw=1,latency=50", 1, &p, &replayed).is_ok());
  ASSERT_EQ(replayed.size(), 1u);
  EXPECT_EQ(p.comm_sync_us, 0) << "a run faster than the model: nothing is subtracted";
  EXPECT_EQ(p.core_efficiency, 1.0);
  const double model_us = replayed[0].first;
  // 10% slower: the cores' share, nothing per collective
  run.wall_us = 1.1 * model_us;
  ASSERT_TRUE(calibrate_executor({run}, "bw=1,latency=50", 1, &p, &replayed).is_ok());
  EXPECT_LT(p.core_efficiency, 0.99);
  EXPECT_GT(p.core_efficiency, 0.5);
  EXPECT_EQ(p.comm_sync_us, 0);
  EXPECT_NEAR(replayed[0].first, run.wall_us, 0.005 * run.wall_us);
  // the profile carries it into the planner's cluster
  ClusterSpec c = this_machine(2, &p, "bw=1,latency=50", 1);
  EXPECT_NEAR(c.cores_per_node, 2 * p.core_efficiency, 1e-12);
  // far slower than half the cores explain: the least share, and a time per collective on top
  run.wall_us = 5 * model_us;
  ASSERT_TRUE(calibrate_executor({run}, "bw=1,latency=50", 1, &p, &replayed).is_ok());
  EXPECT_EQ(p.core_efficiency, 0.5);
  EXPECT_GT(p.comm_sync_us, 0);
  EXPECT_NEAR(replayed[0].first, run.wall_us, 0.01 * run.wall_us);
}

// A plain and an oases run of the same model: the cores' share and the share of a core the
// communication threads take beside computation are both recovered from the runs' times (the
// plain schedule barely overlaps, the oases one overlaps a chunk's collectives with the next's
// computation, so the two times pin down both).
TEST(CoreSharing, CalibrationRecoversTheCommunicationThreadsShare) {
  Program2 plain = program("plain", 1), oases = program("oases", 2);
  Profile p = cpu_profile(2, 2);
  p.op_clock = "thread_cpu";
  p.device.fp32_tflops = 1e-5;  // a slow device: computation as long as the collectives
  p.device.memory_gbps = 0.05;
  add_shared_memory(&p, 20000);  // collectives whose work (not the link) takes most of their time
  auto make = [](const Program2& f, const char* schedule, int64_t chunks) {
    CalibrationRun r;
    r.graph = f.rp.program.graph;
    r.order = f.rp.program.order;
    r.mesh = f.rp.mesh;
    r.ranks = 2;
    r.schedule = schedule;
    r.tp = 2;
    r.chunks = chunks;
    return r;
  };
  CalibrationRun a = make(plain, "plain", 1), b = make(oases, "oases", 2);
  // the runs' "measured" times: what the simulator gives them at known terms
  auto simulated = [&](const CalibrationRun& r, double efficiency, double share) {
    Profile q = p;
    q.core_efficiency = efficiency;
    q.comm_thread_share = share;
    ClusterSpec c = this_machine(2, &q, "bw=1,latency=50", 1);
    OpTimeModel m = op_time_model(c, &q);
    SimOptions o;
    o.cluster = &c;
    o.ops = &m;
    o.local_floor = &q;
    auto res = simulate_rank(r.graph, r.order, r.mesh, o);
    EXPECT_TRUE(res) << res.status().message();
    return res ? (res->step_s - res->optimizer_s) * 1e6 : 0.0;
  };
  std::vector<std::pair<double, double>> replayed;
  a.wall_us = simulated(a, 0.85, 0.4);
  b.wall_us = simulated(b, 0.85, 0.4);
  ASSERT_GT(b.wall_us, 0);
  EXPECT_LT(b.wall_us, simulated(b, 0.85, 1.0) * 0.98) << "the oases run depends on the share";
  ASSERT_TRUE(calibrate_executor({a, b}, "bw=1,latency=50", 1, &p, &replayed).is_ok());
  ASSERT_EQ(replayed.size(), 2u);
  EXPECT_NEAR(p.comm_thread_share, 0.4, 0.05);
  EXPECT_NEAR(p.core_efficiency, 0.85, 0.02);
  EXPECT_EQ(p.comm_sync_us, 0);
  for (const auto& [model, measured] : replayed) EXPECT_NEAR(model, measured, 0.01 * measured);
  // at a whole thread's worth the share stays 1
  a.wall_us = simulated(a, 0.9, 1.0);
  b.wall_us = simulated(b, 0.9, 1.0);
  ASSERT_TRUE(calibrate_executor({a, b}, "bw=1,latency=50", 1, &p, &replayed).is_ok());
  EXPECT_NEAR(p.comm_thread_share, 1.0, 0.02);
  EXPECT_NEAR(p.core_efficiency, 0.9, 0.01);
  // one run alone cannot tell the two apart: the share is left at 1
  ASSERT_TRUE(calibrate_executor({a}, "bw=1,latency=50", 1, &p, &replayed).is_ok());
  EXPECT_EQ(p.comm_thread_share, 1.0);
  // the profile carries it
  p.comm_thread_share = 0.4;
  auto q = profile_from_json(p.to_json(), "test");
  ASSERT_TRUE(q) << q.status().message();
  EXPECT_DOUBLE_EQ(q->comm_thread_share, 0.4);
}

}  // namespace
}  // namespace oases
