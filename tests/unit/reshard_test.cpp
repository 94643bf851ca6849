// Tiles as boxes (graph/tiles) and the cross-mesh resharding planner (planner/reshard): boxes and
// replica groups per layout, uneven and segmented tiles, layout parsing, the unit tasks'
// properties over random layouts, an arange oracle replaying each plan's transfers, and the
// sender/order search against brute force.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>

#include "graph/tiles.h"
#include "planner/reshard.h"

namespace oases {
namespace {

Mesh mesh_of(const std::string& s) {
  return parse_mesh_shape(s).value();
}

ShardingSpec layout(const std::string& text, size_t rank, Mesh* m) {
  return parse_layout(text, rank, m).value();
}

TEST(Tiles, BoxesAndReplicaGroupsOfS0RR) {
  Mesh m = mesh_of("2x4");
  auto t = tile_boxes(layout("S0RR", 3, &m), {8, 4, 2}, m).value();
  ASSERT_EQ(t.boxes.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    ASSERT_EQ(t.boxes[r].size(), 1u);
    EXPECT_EQ(t.boxes[r][0].offset, (std::vector<int64_t>{4 * (r / 4), 0, 0}));
    EXPECT_EQ(t.boxes[r][0].extent, (std::vector<int64_t>{4, 4, 2}));
  }
  EXPECT_EQ(t.replica_groups, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_TRUE(t.partial_groups.empty());
}

TEST(Tiles, UnevenLastTileShorterOrEmpty) {
  Mesh m = mesh_of("4");
  auto t = tile_boxes(layout("S0", 1, &m), {5}, m).value();
  EXPECT_EQ(t.boxes[0][0].to_string(), "[0:2]");
  EXPECT_EQ(t.boxes[1][0].to_string(), "[2:4]");
  EXPECT_EQ(t.boxes[2][0].to_string(), "[4:5]");
  EXPECT_TRUE(t.boxes[3].empty());
}

TEST(Tiles, BothAxesMajorFirstAndTheOtherOrder) {
  Mesh m = mesh_of("2x4");
  auto t = tile_boxes(layout("S01R", 2, &m), {8, 3}, m).value();
  for (int r = 0; r < 8; ++r) EXPECT_EQ(t.boxes[r][0].offset[0], r) << r;
  Mesh m2 = mesh_of("2x4");
  auto t2 = tile_boxes(layout("S10R", 2, &m2), {8, 3}, m2).value();
  // axis 1 major: rank (i, j) holds row j * 2 + i
  for (int r = 0; r < 8; ++r) EXPECT_EQ(t2.boxes[r][0].offset[0], (r % 4) * 2 + r / 4) << r;
  EXPECT_EQ(layout_string(layout("S01R", 2, &m), m), "[S(m01), R]");
}

// Layouts are written in the one spec notation and read in either: what layout_string writes
// (segments and partial sums included) reads back on a mesh rebuilt from the base sizes, and the
// compact form reads to the same spec.
TEST(Tiles, LayoutsReadInEitherNotationAndWriteInOne) {
  Mesh m = mesh_of("2x4");
  ShardingSpec s01 = layout("S01R", 2, &m), s10 = layout("S10R", 2, &m), p = layout("S0R:P1", 2, &m);
  ShardingSpec seg = ShardingSpec::replicated(2).with_dim(1, 1, 3);
  for (const ShardingSpec& s : {s01, s10, p, seg}) {
    std::string text = layout_string(s, m);
    Mesh fresh = mesh_of("2x4");
    auto back = parse_layout(text, 2, &fresh);
    ASSERT_TRUE(back) << text << ": " << back.status().message();
    EXPECT_EQ(layout_string(*back, fresh), text);
    EXPECT_EQ(back->to_string(&fresh), text);
  }
  EXPECT_EQ(layout_string(p, m), "[S(m0), R] P(m1)");
  EXPECT_EQ(layout_string(seg, m), "[R, S(m1)/3]");
  Mesh a = mesh_of("2x4"), b = mesh_of("2x4");
  EXPECT_EQ(layout_string(layout("RS01", 2, &a), a), layout_string(layout("[R, S(m01)]", 2, &b), b));
  auto off = parse_layout("[S(m2), R]", 2, &b);
  ASSERT_FALSE(off);
  EXPECT_NE(off.status().message().find("mesh axis 'm2' does not exist"), std::string::npos) << off.status().message();
  EXPECT_FALSE(parse_layout("[S(m0)]", 2, &b));  // one dimension for two
}

TEST(Tiles, SegmentsGiveOneBoxEach) {
  Mesh m = mesh_of("2");
  ShardingSpec s = ShardingSpec::replicated(2).with_dim(1, 0, 3);
  auto t = tile_boxes(s, {4, 12}, m).value();
  ASSERT_EQ(t.boxes[1].size(), 3u);
  EXPECT_EQ(t.boxes[1][0].to_string(), "[0:4, 2:4]");
  EXPECT_EQ(t.boxes[1][1].to_string(), "[0:4, 6:8]");
  EXPECT_EQ(t.boxes[1][2].to_string(), "[0:4, 10:12]");
}

TEST(Tiles, PartialGroups) {
  Mesh m = mesh_of("2x2");
  auto t = tile_boxes(layout("S0R:P1", 2, &m), {4, 4}, m).value();
  EXPECT_EQ(t.replica_groups.size(), 4u);  // every rank's part differs
  EXPECT_EQ(t.partial_groups, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}}));
}

TEST(Tiles, BadLayoutsAreRefusedWithTheText) {
  Mesh m = mesh_of("2x4");
  auto e = parse_layout("S2RR", 3, &m);
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("S2RR"), std::string::npos);
  EXPECT_FALSE(parse_layout("QRR", 3, &m));
  EXPECT_FALSE(parse_layout("S0R", 3, &m));  // two tokens for three dimensions
  EXPECT_FALSE(parse_layout("S0R:X1", 2, &m));
  Mesh m2 = mesh_of("2x4");
  ShardingSpec twice = layout("S0S0", 2, &m2);
  EXPECT_FALSE(tile_boxes(twice, {4, 4}, m2));
  EXPECT_FALSE(parse_mesh_shape("2x"));
  EXPECT_FALSE(parse_mesh_shape("0x4"));
  EXPECT_FALSE(parse_mesh_shape("-2"));
  PlacedMesh p = PlacedMesh::contiguous(mesh_of("2x2"), 6);
  EXPECT_FALSE(p.validate(8));  // ranks 6..9 of a world of 8
  EXPECT_TRUE(p.validate(10));
}

// Meshes are bounded as a plan's are (kMaxMeshRanks = 2^20 ranks, in all and per axis), checked
// before any per-rank table is built: oases-reshard --src-mesh 1000000x1000000 once ran for minutes.
TEST(Tiles, MeshesPastTwoToTheTwentyRanksAreRefused) {
  EXPECT_TRUE(parse_mesh_shape("1048576"));
  EXPECT_TRUE(parse_mesh_shape("1024x1024"));
  EXPECT_TRUE(parse_mesh_shape("2x2x2x2x2x2x2x2"));
  for (const char* text : {"1000000x1000000", "1024x1025", "1024x1024x2", "1048577", "99999999", "99999999999999999999999"}) {
    auto m = parse_mesh_shape(text);
    ASSERT_FALSE(m) << text;
    EXPECT_NE(m.status().message().find(std::string("mesh '") + text + "'"), std::string::npos) << m.status().message();
  }
  EXPECT_EQ(parse_mesh_shape("1000000x1000000").status().message(), "mesh '1000000x1000000': more than 1048576 ranks in all");
  // the one check, with the plan's wording
  Mesh big{{"dp", "tp"}, {1 << 20, 2}, {}};
  EXPECT_EQ(check_mesh_ranks(big, "mesh.sizes").message(), "mesh.sizes: more than 1048576 ranks in all");
  Mesh zero{{"dp", "tp"}, {2, 0}, {}};
  EXPECT_EQ(check_mesh_ranks(zero, "mesh.sizes").message(), "mesh.sizes[1]: 0 is not a size from 1 to 1048576");
  // eight axes of 2^20: the product stops before it overflows
  Mesh eight{{"a", "b", "c", "d", "e", "f", "g", "h"}, std::vector<int64_t>(8, 1 << 20), {}};
  EXPECT_FALSE(check_mesh_ranks(eight, "m"));
  EXPECT_TRUE(check_mesh_ranks(mesh_of("1024x1024"), "m"));
  // a Reshard node's meshes (its attributes) alike
  auto node = placed_layout({1000000, 1000000}, {0, 1}, "S0R", 2);
  ASSERT_FALSE(node);
  EXPECT_NE(node.status().message().find("more than 1048576 ranks"), std::string::npos) << node.status().message();
  EXPECT_TRUE(placed_layout({2, 2}, {0, 1, 2, 3}, "S0R", 2));
}

struct Case {
  std::string src_mesh, src, dst_mesh, dst;
  Shape shape;
};

ReshardProblem problem(const Case& c, bool overlap = false) {
  ReshardProblem p;
  p.shape = c.shape;
  Mesh sm = mesh_of(c.src_mesh), dm = mesh_of(c.dst_mesh);
  p.src.spec = layout(c.src, c.shape.size(), &sm);
  p.dst.spec = layout(c.dst, c.shape.size(), &dm);
  p.src.placed = PlacedMesh::contiguous(sm, 0);
  p.dst.placed = PlacedMesh::contiguous(dm, overlap ? 0 : sm.size());
  return p;
}

ReshardCluster cluster(int64_t world, int hosts) {
  return ReshardCluster::spread(world, hosts, LinkModel{1.25, 50}, LinkModel{20, 1});
}

// Replays a plan on arange data: every rank's destination tile must equal the expected slice.
void check_arange(const ReshardProblem& p, const ReshardPlan& plan, const ReshardCluster& c, const std::string& what) {
  std::vector<int64_t> strides(p.shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(p.shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * p.shape[d + 1];
  auto for_each = [&](const Box& b, const std::function<void(int64_t)>& f) {
    if (b.empty()) return;
    std::vector<int64_t> i(b.offset.size(), 0);
    while (true) {
      int64_t flat = 0;
      for (size_t d = 0; d < i.size(); ++d) flat += (b.offset[d] + i[d]) * strides[d];
      f(flat);
      size_t d = i.size();
      while (d > 0 && ++i[d - 1] == b.extent[d - 1]) i[--d] = 0;
      if (d == 0) break;
    }
  };
  // What each world rank holds after the pre-reductions: element index → value (= the index).
  std::map<int64_t, std::map<int64_t, int64_t>> held, got;
  auto src_tiles = tile_boxes(plan.effective_src, p.shape, plan.effective_src_mesh).value();
  for (int64_t r = 0; r < p.src.placed.size(); ++r) {
    for (const Box& b : src_tiles.boxes[r]) for_each(b, [&](int64_t f) { held[p.src.placed.ranks[r]][f] = f; });
  }
  for (const UnitTask& t : plan.tasks) {
    for (int64_t r : t.local) for_each(t.box, [&](int64_t f) { got[r][f] = held[r].at(f); });
  }
  for (const Transfer& x : plan.order) {
    if (x.kind == TransferKind::kAllGather) {
      for (int64_t r : x.receivers) {
        for (size_t k = 0; k < x.slices.size(); ++k) for_each(x.slices[k], [&](int64_t f) { got[r][f] = got[x.receivers[k]].at(f); });
      }
      continue;
    }
    for (int64_t r : x.receivers) {
      for_each(x.box, [&](int64_t f) {
        ASSERT_TRUE(held[x.sender].count(f)) << what << ": rank " << x.sender << " sends element " << f << " it does not hold";
        got[r][f] = held[x.sender][f];
      });
    }
  }
  auto dst_tiles = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh).value();
  for (int64_t r = 0; r < p.dst.placed.size(); ++r) {
    int64_t w = p.dst.placed.ranks[r];
    int64_t want = 0;
    for (const Box& b : dst_tiles.boxes[r]) {
      want += b.numel();
      for_each(b, [&](int64_t f) {
        auto it = got[w].find(f);
        ASSERT_TRUE(it != got[w].end()) << what << ": rank " << w << " misses element " << f;
        EXPECT_EQ(it->second, f) << what;
      });
    }
    // nothing outside its tile arrives (a send of more than needed would be waste)
    EXPECT_EQ(static_cast<int64_t>(got[w].size()), want) << what << ": rank " << w;
  }
}

std::vector<Case> paper_cases() {
  // The paper's microbenchmark layouts, scaled down (and one uneven shape each).
  std::vector<Case> cs;
  for (Shape s : {Shape{16, 8, 4}, Shape{7, 5, 3}}) {
    cs.push_back({"2x4", "S0RR", "2x4", "S0RR", s});
    cs.push_back({"2x4", "RRR", "2x4", "S0RR", s});
    cs.push_back({"2x4", "RS0R", "2x4", "S0RR", s});
    cs.push_back({"2x4", "RS01R", "2x4", "S01RR", s});
    cs.push_back({"2x4", "S1RR", "2x4", "S0RR", s});
    cs.push_back({"2x4", "RS0R", "2x4", "RRS0", s});
    cs.push_back({"2x4", "S0RR", "3x4", "S0RR", s});
    cs.push_back({"1x4", "RRR", "2x4", "RRR", s});
    cs.push_back({"1", "RRR", "4x2", "RRR", s});
    cs.push_back({"2x2", "S0R:P1", "2x2", "RS1", {s[0], s[1]}});
  }
  return cs;
}

TEST(Reshard, ArangeOracleOverThePapersLayoutsEveryStrategy) {
  for (const Case& cs : paper_cases()) {
    for (bool overlap : {false, true}) {
      ReshardProblem p = problem(cs, overlap);
      int64_t world = std::max(p.src.placed.ranks.back(), p.dst.placed.ranks.back()) + 1;
      ReshardCluster c = cluster(world, 2);
      for (auto s : {ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather, ReshardStrategy::kBroadcast, ReshardStrategy::kAuto}) {
        auto plan = plan_reshard(p, c, {s});
        std::string what = fmt::format("{} {} → {} {} {} {}{}", cs.src_mesh, cs.src, cs.dst_mesh, cs.dst, shape_str(cs.shape),
                                       strategy_name(s), overlap ? " overlapping" : "");
        ASSERT_TRUE(plan) << what << ": " << plan.status().message();
        check_arange(p, *plan, c, what);
      }
    }
  }
}

TEST(Reshard, RandomLayoutsTileEachDestinationOnceFromReplicas) {
  std::mt19937 rng(7);
  const char* meshes[] = {"1", "2", "4", "2x2", "2x4", "3x2"};
  int checked = 0;
  for (int it = 0; it < 300; ++it) {
    Case cs;
    cs.src_mesh = meshes[rng() % 6];
    cs.dst_mesh = meshes[rng() % 6];
    size_t rank = 1 + rng() % 3;
    for (size_t d = 0; d < rank; ++d) cs.shape.push_back(1 + static_cast<int64_t>(rng() % 9));
    auto random_layout = [&](const std::string& mesh_text) {
      int axes = static_cast<int>(mesh_of(mesh_text).num_axes());
      std::vector<std::string> opts = {"R"};
      for (int a = 0; a < axes; ++a) opts.push_back("S" + std::to_string(a));
      if (axes == 2) opts.insert(opts.end(), {"S01", "S10"});
      while (true) {
        std::string l;
        std::set<char> used;
        bool ok = true;
        for (size_t d = 0; d < rank; ++d) {
          std::string tok = opts[rng() % opts.size()];
          for (char ch : tok.substr(1)) ok = ok && used.insert(ch).second;
          l += tok;
        }
        if (ok) return l;
      }
    };
    cs.src = random_layout(cs.src_mesh);
    cs.dst = random_layout(cs.dst_mesh);
    ReshardProblem p = problem(cs, rng() % 2 == 0);
    int64_t world = std::max(p.src.placed.ranks.back(), p.dst.placed.ranks.back()) + 1;
    ReshardCluster c = cluster(world, 1 + static_cast<int>(rng() % 3));
    auto plan = plan_reshard(p, c, {ReshardStrategy::kBroadcast});
    std::string what = fmt::format("{} {} → {} {} {}", cs.src_mesh, cs.src, cs.dst_mesh, cs.dst, shape_str(cs.shape));
    ASSERT_TRUE(plan) << what << ": " << plan.status().message();
    auto src = tile_boxes(p.src.spec, p.shape, p.src.placed.mesh).value();
    for (const UnitTask& t : plan->tasks) {
      // the senders are one replica group of the source, and each holds the whole task box
      std::vector<int64_t> group;
      for (int64_t s : t.senders) group.push_back(p.src.placed.mesh_rank(s));
      EXPECT_TRUE(std::find(src.replica_groups.begin(), src.replica_groups.end(), group) != src.replica_groups.end()) << what;
      for (int64_t s : group) {
        bool inside = false;
        for (const Box& b : src.boxes[s]) inside = inside || b.contains(t.box);
        EXPECT_TRUE(inside) << what << ": task " << t.box.to_string() << " outside sender " << s;
      }
    }
    check_arange(p, *plan, c, what);
    ++checked;
  }
  EXPECT_EQ(checked, 300);
}

TEST(Reshard, SearchEqualsBruteForceOnSmallProblems) {
  std::mt19937 rng(11);
  int improved = 0;
  for (int it = 0; it < 200; ++it) {
    int64_t world = 8;
    ReshardCluster c = cluster(world, 2 + static_cast<int>(rng() % 3));
    std::vector<UnitTask> tasks(2 + rng() % 5);
    for (UnitTask& t : tasks) {
      std::set<int64_t> s, r;
      while (s.size() < 1 + rng() % 3) s.insert(static_cast<int64_t>(rng() % world));
      while (r.size() < 1 + rng() % 3) {
        int64_t x = static_cast<int64_t>(rng() % world);
        if (!s.count(x)) r.insert(x);
      }
      t.senders.assign(s.begin(), s.end());
      t.receivers.assign(r.begin(), r.end());
      t.bytes = int64_t{100000} * (1 + static_cast<int64_t>(rng() % 50));
      t.box = Box{{0}, {t.bytes / 4}};
    }
    double brute = brute_force_broadcast_makespan(tasks, c);
    ReshardPlan plan;
    plan.tasks = tasks;
    order_broadcasts(plan, c, ReshardOptions{ReshardStrategy::kBroadcast, 12, 10000000});
    ASSERT_TRUE(plan.search_complete) << "case " << it;
    double searched = simulate_reshard(plan, c);
    ReshardPlan greedy;
    greedy.tasks = tasks;
    order_broadcasts(greedy, c, ReshardOptions{ReshardStrategy::kBroadcast, 0, 0});
    improved += simulate_reshard(greedy, c) > searched + 1e-12;
    EXPECT_NEAR(searched, brute, 1e-12) << "case " << it;
  }
  // the greedy alone is not optimal on every case: the search is what makes it so
  EXPECT_GT(improved, 0);
}

TEST(Reshard, BroadcastBeatsSendRecvWhenReceiversReplicate) {
  // RRR → RRR from one host's mesh to a mesh on two other hosts: send/recv pushes every tile
  // once per receiver through the sender's card, a broadcast once.
  Case cs{"1x4", "RRR", "2x4", "RRR", {64, 64, 64}};
  ReshardProblem p = problem(cs);
  ReshardCluster c = ReshardCluster::spread(12, 3, LinkModel{1.25, 50}, LinkModel{20, 1});
  auto b = plan_reshard(p, c, {ReshardStrategy::kBroadcast}).value();
  auto s = plan_reshard(p, c, {ReshardStrategy::kSendRecv}).value();
  auto a = plan_reshard(p, c, {ReshardStrategy::kAuto}).value();
  EXPECT_GT(s.predicted_s, 3 * b.predicted_s);
  EXPECT_LE(a.predicted_s, b.predicted_s);
  EXPECT_LE(b.predicted_s, 1.3 * b.lower_bound_s + 1e-3);
  EXPECT_GT(b.lower_bound_s, 0);
}

TEST(Reshard, BadProblemsAreOneLineErrors) {
  Case cs{"2x4", "S0RR", "2x4", "S0RR", {8, 4, 4}};
  ReshardProblem p = problem(cs);
  auto e = plan_reshard(p, cluster(12, 2));  // the destination needs ranks 8..15
  ASSERT_FALSE(e);
  EXPECT_NE(e.status().message().find("destination mesh"), std::string::npos) << e.status().message();
  ReshardProblem q = problem({"2", "S0", "2", "S0", {4}});
  q.dst.spec = q.dst.spec.with_partial(0);
  q.dst.spec.dims[0].axis = -1;
  EXPECT_FALSE(plan_reshard(q, cluster(4, 1)));
  EXPECT_FALSE(parse_reshard_strategy("fastest"));
}

}  // namespace
}  // namespace oases
