// --overlap-report's accounting (executor/run_report.h) on hand-made events: what hid, what could
// have, and why the rest did not.
#include <gtest/gtest.h>

#include "executor/run_report.h"
#include "graph/op_registry.h"

namespace oases {
namespace {

struct Two {
  Graph g;
  NodeId a, b;
  Two() {
    ValueId x = g.add_value("x", DType::kF32, {4}, true);
    a = g.add_node_new_outputs("AllReduce", {x}, 1, {}, "ar_a");
    b = g.add_node_new_outputs("AllReduce", {x}, 1, {}, "ar_b");
    g.node(a).scope = "layer.0.attn";
    g.node(b).scope = "layer.0.mlp";
  }
};

TraceEvent ev(NodeId n, int thread, const char* cat, double start, double dur) {
  TraceEvent e;
  e.node = n;
  e.thread = thread;
  e.category = cat;
  e.start_us = start;
  e.dur_us = dur;
  return e;
}

// Two collectives handed over together before 10 us of compute: the channel moves `a` beside the
// compute, then `b`, whose wait is exposed. The compute between b's issue and wait already hid a,
// so b could not hide (the channel was busy), rather than "did not".
TEST(OverlapReport, ComputeThatHidTheCollectiveAheadIsNoRoomForTheNextOnTheChannel) {
  Two t;
  NodeId c = t.a;  // compute events need a live node; which one does not matter to the accounting
  std::vector<TraceEvent> e = {ev(t.a, 0, "issue", 0, 0),  ev(t.b, 0, "issue", 0, 0),   ev(c, 0, "compute", 0, 10),
                               ev(t.a, 1, "comm", 0, 10),  ev(t.b, 1, "comm", 10, 10),  ev(t.a, 0, "wait", 10, 0),
                               ev(t.b, 0, "wait", 10, 10)};
  OverlapStats s;
  s.add(t.g, e, 20.0 / 1000, true);
  const auto& ga = s.groups.at("layer 0 attn forward");
  const auto& gb = s.groups.at("layer 0 mlp forward");
  EXPECT_DOUBLE_EQ(ga.comm, 10);
  EXPECT_DOUBLE_EQ(ga.exposed, 0);
  EXPECT_DOUBLE_EQ(ga.could, 10);
  EXPECT_DOUBLE_EQ(ga.queued, 0);
  EXPECT_DOUBLE_EQ(gb.comm, 10);
  EXPECT_DOUBLE_EQ(gb.exposed, 10);
  EXPECT_DOUBLE_EQ(gb.could, 0);   // all of its room went to a
  EXPECT_DOUBLE_EQ(gb.queued, 10);
  EXPECT_DOUBLE_EQ(gb.late, 10);
}

// The same order with the channel idle while b waits to start (its peers late): the compute was
// there and the channel free, so b could have hidden and did not.
TEST(OverlapReport, ACollectiveStartingLateOnAFreeChannelDidNotHide) {
  Two t;
  std::vector<TraceEvent> e = {ev(t.b, 0, "issue", 0, 0), ev(t.a, 0, "compute", 0, 10), ev(t.b, 1, "comm", 10, 10),
                               ev(t.b, 0, "wait", 10, 10)};
  OverlapStats s;
  s.add(t.g, e, 20.0 / 1000, true);
  const auto& gb = s.groups.at("layer 0 mlp forward");
  EXPECT_DOUBLE_EQ(gb.exposed, 10);
  EXPECT_DOUBLE_EQ(gb.could, 10);
  EXPECT_DOUBLE_EQ(gb.queued, 0);
}

// A collective on another channel (the transfers between meshes) takes no room from this one.
TEST(OverlapReport, AnotherChannelsTransferTakesNoRoom) {
  Two t;
  std::vector<TraceEvent> e = {ev(t.a, 0, "issue", 0, 0), ev(t.b, 0, "issue", 0, 0), ev(t.a, 0, "compute", 0, 10),
                               ev(t.a, 2, "comm", 0, 10), ev(t.b, 1, "comm", 0, 10), ev(t.a, 0, "wait", 10, 0),
                               ev(t.b, 0, "wait", 10, 0)};
  OverlapStats s;
  s.add(t.g, e, 10.0 / 1000, true);
  EXPECT_DOUBLE_EQ(s.groups.at("layer 0 mlp forward").could, 10);
  EXPECT_DOUBLE_EQ(s.groups.at("layer 0 mlp forward").exposed, 0);
  EXPECT_DOUBLE_EQ(s.groups.at("layer 0 attn forward").could, 10);
}

// A device run (executor.h device_trace_events): kernels on the compute stream at [0, 6) and
// [8, 12) us, a collective on the communication stream at [2, 10) and one run in line on the
// compute stream at [12, 14). The first ran beside 6 us of compute (it hid 6 of its 8), the compute
// stream sat idle for 2 (exposed); the second is all exposed. The report reads them as it reads
// the CPU executor's events.
TEST(OverlapReport, DeviceSpansReadAsTheCpuExecutorsEvents) {
  Two t;
  ValueId x = t.g.add_value("y", DType::kF32, {4}, true);
  NodeId mm = t.g.add_node_new_outputs("Relu", {x}, 1, {}, "relu");
  t.g.node(mm).scope = "layer.0.attn";
  t.g.node(t.a).domain = kOasesDomain;  // collectives as the partitioner makes them
  t.g.node(t.b).domain = kOasesDomain;
  std::vector<ScheduledOp> instrs = {{ScheduledOp::Kind::kCompute, mm},
                                     {ScheduledOp::Kind::kCompute, mm},
                                     {ScheduledOp::Kind::kCommStart, t.a},
                                     {ScheduledOp::Kind::kCompute, t.b}};
  std::vector<DeviceSpan> spans = {{0, 0, 0, 6}, {1, 0, 8, 4}, {2, 1, 2, 8}, {3, 0, 12, 2}};
  std::vector<TraceEvent> e = device_trace_events(t.g, instrs, spans, 100);
  int waits = 0;
  for (const TraceEvent& x : e) {
    EXPECT_GE(x.start_us, 100);
    if (x.category == "wait") {
      ++waits;
      EXPECT_EQ(x.node, t.a);
      EXPECT_DOUBLE_EQ(x.dur_us, 2);
      EXPECT_DOUBLE_EQ(x.start_us, 110);  // after the last compute beside it ([8, 12) clipped at its end)
    }
  }
  EXPECT_EQ(waits, 1);
  OverlapStats s;
  s.add(t.g, e, 14.0 / 1000, true);
  const auto& ga = s.groups.at("layer 0 attn forward");
  EXPECT_DOUBLE_EQ(ga.comm, 8);
  EXPECT_DOUBLE_EQ(ga.exposed, 2);
  EXPECT_DOUBLE_EQ(ga.could, 6);  // the compute beside it: all its room, taken
  const auto& gb = s.groups.at("layer 0 mlp forward");
  EXPECT_DOUBLE_EQ(gb.comm, 2);
  EXPECT_DOUBLE_EQ(gb.exposed, 2);  // in line on the compute stream
  EXPECT_DOUBLE_EQ(s.total.comm, 10);
  EXPECT_DOUBLE_EQ(s.total.exposed, 4);
}

}  // namespace
}  // namespace oases
