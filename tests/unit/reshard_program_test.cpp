// The Reshard op in programs: per-rank graphs holding an oases.Reshard node run on thread ranks
// through the executor (start/wait on the second channel), each destination tile checked against
// arange; the backward Reshard; and the channel checker catching crossed orders.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "executor/communicator.h"
#include "executor/executor.h"
#include "executor/reshard_runner.h"
#include "graph/autodiff.h"
#include "graph/op_registry.h"
#include "planner/reshard.h"
#include "planner/reshard_nodes.h"
#include "planner/schedule.h"

namespace oases {
namespace {

AttrMap reshard_attrs(const Shape& shape, const std::vector<int64_t>& sm, const std::vector<int64_t>& sr, const std::string& sl,
                      const std::vector<int64_t>& dm, const std::vector<int64_t>& dr, const std::string& dl, int64_t me) {
  AttrMap a;
  a.set_ints("shape", shape);
  a.set_ints("src_mesh", sm);
  a.set_ints("src_ranks", sr);
  a.set_string("src_layout", sl);
  a.set_ints("dst_mesh", dm);
  a.set_ints("dst_ranks", dr);
  a.set_string("dst_layout", dl);
  a.set_int("world_rank", me);
  a.set_int("channel", 1);
  return a;
}

// 2 source ranks (S0R over [6, 4]) → 4 destination ranks (R S1 over a 2x2 mesh, uneven: 4 / 2),
// run as 6 thread ranks; each program is a graph input → Reshard → a scaled copy (so the compute
// thread waits on the channel's result) → output.
TEST(ReshardProgram, MovesTilesBetweenMeshesOnTheSecondChannel) {
  const Shape shape{6, 4};
  const int world = 6;
  auto lw = make_local_world(world, 30);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      auto fail = [&](const std::string& m) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(fmt::format("rank {}: {}", r, m));
      };
      auto comm = local_communicator(lw, r);
      Graph g;
      g.opset_imports[""] = 17;
      g.opset_imports[kOasesDomain] = 1;
      std::vector<ValueId> ins;
      if (r < 2) ins.push_back(g.add_input("x", DType::kF32, {3, 4}));
      NodeId n = g.add_node_new_outputs("Reshard", ins, 1, reshard_attrs(shape, {2}, {0, 1}, "S0R", {2, 2}, {2, 3, 4, 5}, "RS1", r), "move",
                                        kOasesDomain);
      if (Status st = infer_node(g, n); !st) return fail(st.message());
      ValueId y = g.node(n).outputs[0];
      ValueId two = g.add_constant("two", Tensor::scalar_f32(2.f));
      NodeId m = g.add_node_new_outputs("Mul", {y, two}, 1, {}, "scale");
      if (Status st = infer_node(g, m); !st) return fail(st.message());
      g.add_output(g.node(m).outputs[0]);
      auto order = schedule_program(g, ScheduleOptions{});
      if (!order) return fail(order.status().message());
      int starts = 0;
      for (const ScheduledOp& op : *order) starts += op.kind == ScheduledOp::Kind::kCommStart;
      if (starts != 1) return fail("the Reshard is not scheduled as a start and a wait");
      ExecOptions eo;
      eo.order = *order;
      eo.comm = comm.get();
      // planned as a builder plans it: once, for the machine (hosts 0, 0, 1, 1, 1, 1)
      auto plans = plan_reshards(g, reshard_cluster(world, {0, 0, 1, 1, 1, 1}, LinkModel{1.25, 50}, LinkModel{10, 2}));
      if (!plans) return fail(plans.status().message());
      if (plans->size() != 1 || plans->begin()->second->cluster.host_of[2] != 1) return fail("the Reshard's plan is not for the machine given");
      eo.reshards = *plans;
      auto ex = Executor::create(std::move(g), eo);
      if (!ex) return fail(ex.status().message());
      std::map<std::string, Tensor> feed;
      if (r < 2) {
        Tensor x(DType::kF32, {3, 4});
        for (int i = 0; i < 12; ++i) x.mutable_data<float>()[i] = static_cast<float>(r * 12 + i);
        feed["x"] = x;
      }
      auto out = (*ex)->run(feed);
      if (!out) return fail(out.status().message());
      const Tensor& t = out->at(0);
      if (r < 2) {
        if (t.numel() != 0) fail(fmt::format("a source-only rank holds {} elements", t.numel()));
        return;
      }
      int col0 = ((r - 2) % 2) * 2;  // R S1 on a 2x2 mesh: columns [0,2) or [2,4)
      if (t.shape() != Shape{6, 2}) return fail("destination tile " + shape_str(t.shape()));
      for (int i = 0; i < 6; ++i) {
        for (int j = 0; j < 2; ++j) {
          float want = 2.f * static_cast<float>(i * 4 + col0 + j);
          if (t.data<float>()[i * 2 + j] != want)
            return fail(fmt::format("element ({}, {}) = {}, want {}", i, j, t.data<float>()[i * 2 + j], want));
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(ReshardProgram, ShapeRuleAndBackwardSwapTheMeshes) {
  Graph g;
  g.opset_imports[""] = 17;
  g.opset_imports[kOasesDomain] = 1;
  ValueId x = g.add_input("x", DType::kF32, {3, 4});
  NodeId n =
      g.add_node_new_outputs("Reshard", {x}, 1, reshard_attrs({6, 4}, {2}, {0, 1}, "S0R", {2}, {1, 2}, "RS0", 1), "move", kOasesDomain);
  ASSERT_TRUE(infer_node(g, n).is_ok());
  EXPECT_EQ(g.value(g.node(n).outputs[0]).shape, (Shape{6, 2}));  // rank 1 is in both meshes
  // the gradient of x is a Reshard back: destination → source
  NodeId sum = g.add_node_new_outputs("ReduceSum", {g.node(n).outputs[0]}, 1, AttrMap{{"keepdims", Attribute::of_int(0)}}, "loss");
  ASSERT_TRUE(infer_node(g, sum).is_ok());
  auto bw = build_backward(g, g.node(sum).outputs[0], {x});
  ASSERT_TRUE(bw) << bw.status().message();
  int back = 0;
  for (NodeId id : g.nodes()) {
    const Node& b = g.node(id);
    if (b.op_type != "Reshard" || id == n) continue;
    ++back;
    EXPECT_EQ(b.attrs.get_string("src_layout", ""), "RS0");
    EXPECT_EQ(b.attrs.get_string("dst_layout", ""), "S0R");
    EXPECT_EQ(b.attrs.get_ints("src_ranks"), (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(b.attrs.get_ints("dst_ranks"), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(g.value(b.outputs[0]).shape, (Shape{3, 4}));
  }
  EXPECT_EQ(back, 1);
  // a wrong input tile, a rank in neither mesh: one-line errors naming the node
  Graph h;
  ValueId bad = h.add_input("x", DType::kF32, {4, 4});
  NodeId m =
      h.add_node_new_outputs("Reshard", {bad}, 1, reshard_attrs({6, 4}, {2}, {0, 1}, "S0R", {2}, {2, 3}, "RS0", 0), "move", kOasesDomain);
  Status st = infer_node(h, m);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("source tile [3, 4]"), std::string::npos) << st.message();
  NodeId k =
      h.add_node_new_outputs("Reshard", {}, 1, reshard_attrs({6, 4}, {2}, {0, 1}, "S0R", {2}, {2, 3}, "RS0", 5), "nobody", kOasesDomain);
  st = infer_node(h, k);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("neither mesh"), std::string::npos) << st.message();
}

// The kernel never plans: a program whose Reshard has no transfer plan is refused when it is
// compiled, naming the node; the plan a builder made is the one the program keeps.
TEST(ReshardProgram, TransferPlansAreMadeAtBuildTimeNotByTheKernel) {
  Graph g;
  g.opset_imports[""] = 17;
  g.opset_imports[kOasesDomain] = 1;
  ValueId x = g.add_input("x", DType::kF32, {4, 6});
  NodeId n = g.add_node_new_outputs("Reshard", {x}, 1, reshard_attrs({4, 6}, {1}, {0}, "S0R", {1}, {0}, "RS0", 0), "move", kOasesDomain);
  ASSERT_TRUE(infer_node(g, n).is_ok());
  g.add_output(g.node(n).outputs[0]);
  auto unplanned = compile_program(g);
  ASSERT_FALSE(unplanned);
  EXPECT_NE(unplanned.status().message().find("node 'move'"), std::string::npos) << unplanned.status().message();
  EXPECT_NE(unplanned.status().message().find("no transfer plan"), std::string::npos) << unplanned.status().message();
  ExecOptions eo;
  auto plans = plan_reshards(g, reshard_cluster(1, {}, LinkModel{}, LinkModel{}));
  ASSERT_TRUE(plans) << plans.status().message();
  eo.reshards = *plans;
  auto ex = Executor::create(g, eo);
  ASSERT_TRUE(ex) << ex.status().message();
  Tensor in(DType::kF32, {4, 6});
  for (int i = 0; i < 24; ++i) in.mutable_data<float>()[i] = static_cast<float>(i);
  auto out = (*ex)->run({{"x", in}});
  ASSERT_TRUE(out) << out.status().message();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(out->at(0).data<float>()[i], static_cast<float>(i));
  // one problem, one plan: two nodes moving the same layout share it
  NodeId m = g.add_node_new_outputs("Reshard", {x}, 1, reshard_attrs({4, 6}, {1}, {0}, "S0R", {1}, {0}, "RS0", 0), "again", kOasesDomain);
  ASSERT_TRUE(infer_node(g, m).is_ok());
  auto both = plan_reshards(g, reshard_cluster(1, {}, LinkModel{}, LinkModel{}));
  ASSERT_TRUE(both) << both.status().message();
  EXPECT_EQ(both->at("move").get(), both->at("again").get());
  // an unset link is the machine at hand's shared memory as the planner prices it, never zero
  EXPECT_TRUE(both->at("move")->cluster.intra.enabled());
}

TEST(ChannelChecker, ConsistentOrdersPassCrossedOrdersDeadlock) {
  // ops 0 and 1 both between ranks 0 and 1 on channel 1; op 2 a tp collective on channel 0
  auto all = [](int) { return std::vector<int64_t>{0, 1}; };
  using I = ChannelInstr;
  std::vector<std::vector<I>> same = {{{true, 0, 1}, {true, 1, 1}, {true, 2, 0}, {false, 2, 0}, {false, 0, 1}, {false, 1, 1}},
                                      {{true, 0, 1}, {true, 2, 0}, {true, 1, 1}, {false, 1, 1}, {false, 0, 1}, {false, 2, 0}}};
  EXPECT_TRUE(check_channel_programs(same, all).is_ok());
  std::vector<std::vector<I>> crossed = {{{true, 0, 1}, {true, 1, 1}, {false, 0, 1}, {false, 1, 1}},
                                         {{true, 1, 1}, {true, 0, 1}, {false, 1, 1}, {false, 0, 1}}};
  Status st = check_channel_programs(crossed, all);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("deadlock"), std::string::npos) << st.message();
  // a wait on one channel in front of a start the peer needs first
  std::vector<std::vector<I>> blocked = {{{true, 0, 1}, {false, 0, 1}, {true, 2, 0}, {false, 2, 0}},
                                         {{true, 2, 0}, {false, 2, 0}, {true, 0, 1}, {false, 0, 1}}};
  EXPECT_FALSE(check_channel_programs(blocked, all).is_ok());
  // the same two ops on two channels: neither queues behind the other
  std::vector<std::vector<I>> two = {{{true, 0, 1}, {true, 2, 0}, {false, 2, 0}, {false, 0, 1}},
                                     {{true, 2, 0}, {true, 0, 1}, {false, 0, 1}, {false, 2, 0}}};
  EXPECT_TRUE(check_channel_programs(two, all).is_ok());
}

TEST(ChannelChecker, ParticipantsOfAPlan) {
  ReshardProblem p;
  p.shape = {4, 4};
  Mesh a = parse_mesh_shape("2").value(), b = parse_mesh_shape("2").value();
  p.src = {PlacedMesh::contiguous(a, 0), parse_layout("S0R", 2, &a).value()};
  p.dst = {PlacedMesh::contiguous(b, 2), parse_layout("RR", 2, &b).value()};
  auto plan = plan_reshard(p, ReshardCluster::spread(4, 2, LinkModel{1, 1}, LinkModel{10, 1}), {ReshardStrategy::kBroadcast}).value();
  EXPECT_EQ(reshard_participants(plan), (std::vector<int64_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace oases

namespace oases {
namespace {

// Two transfers crossing the same card cannot overlap: together they take at least twice the
// modelled time (a lower bound, so load on the machine cannot make it fail).
// A box is sent from / received into a tile without packing exactly when it is one contiguous run
// there: the trailing dims whole, at most one partial dim, single elements before it.
TEST(TileData, ContiguousBoxesAreAddressedInPlaceOthersArePacked) {
  TileData t;
  t.element_bytes = 4;
  t.boxes = {Box{{2, 0, 0}, {4, 3, 5}}};  // rows 2..5 of a [*, 3, 5] tensor
  t.data.emplace_back(static_cast<size_t>(t.boxes[0].numel() * 4));
  auto* v = reinterpret_cast<int32_t*>(t.data[0].data());
  for (int64_t i = 0; i < t.boxes[0].numel(); ++i) v[i] = static_cast<int32_t>(i);
  auto at = [&](const Box& b) -> int64_t {
    const char* p = t.contiguous(b);
    return p ? (p - t.data[0].data()) / 4 : -1;
  };
  EXPECT_EQ(at(Box{{2, 0, 0}, {4, 3, 5}}), 0);   // the whole box
  EXPECT_EQ(at(Box{{3, 0, 0}, {2, 3, 5}}), 15);  // whole rows: a slab
  EXPECT_EQ(at(Box{{4, 1, 0}, {1, 2, 5}}), 35);  // one row, whole last dim, partial middle dim
  EXPECT_EQ(at(Box{{5, 2, 1}, {1, 1, 3}}), 56);  // a run inside one line
  EXPECT_EQ(at(Box{{3, 1, 0}, {2, 2, 5}}), -1);  // two rows, partial middle dim: strided
  EXPECT_EQ(at(Box{{2, 0, 1}, {1, 3, 2}}), -1);  // partial last dim over several lines
  EXPECT_EQ(at(Box{{1, 0, 0}, {2, 3, 5}}), -1);  // outside the tile
  // packing the strided box and unpacking it into a zeroed copy moves exactly its elements
  Box strided{{3, 1, 0}, {2, 2, 5}};
  TileBytes packed = t.pack(strided);
  ASSERT_EQ(static_cast<int64_t>(packed.size()), strided.numel() * 4);
  EXPECT_EQ(reinterpret_cast<const int32_t*>(packed.data())[0], 15 + 5);
  EXPECT_EQ(reinterpret_cast<const int32_t*>(packed.data())[10], 30 + 5);
  TileData u = t;
  std::fill(u.data[0].begin(), u.data[0].end(), 0);
  u.copy_from(t, strided);
  const auto* w = reinterpret_cast<const int32_t*>(u.data[0].data());
  int64_t moved = 0;
  for (int64_t i = 0; i < t.boxes[0].numel(); ++i) {
    int64_t r = 2 + i / 15, c = (i / 5) % 3;
    bool inside = r >= 3 && r < 5 && c >= 1 && c < 3;
    EXPECT_EQ(w[i], inside ? v[i] : 0) << i;
    moved += inside;
  }
  EXPECT_EQ(moved, strided.numel());
}

TEST(HostCards, ASharedCardSerialisesTransfers) {
  char tmpl[] = "/tmp/oases_cards_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  HostCards cards(tmpl);
  auto t0 = std::chrono::steady_clock::now();
  std::thread a([&] { cards.hold({0, 1}, 0.05, [] {}); });
  std::thread b([&] { cards.hold({1, 2}, 0.05, [] {}); });
  a.join();
  b.join();
  double both = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(both, 0.1);
  // inside one host no card is held: only the time passes
  t0 = std::chrono::steady_clock::now();
  cards.hold({3}, 0.01, [] {});
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.01);
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace oases
