// Ranks sharing devices (executor/device_local_comm.h), the logic on the host backend: every
// collective's values on 3 thread ranks (in place and not), against sums in member order; channel
// groups of rank subsets; point to point in either order and on several tags; many rounds in a
// row; the errors: a mismatched transfer, a member that never comes (an error, not a hang); and
// cross-mesh resharding (run_reshard_into, the CUDA Reshard kernel's path) giving the tiles thread
// ranks give, bit for bit, for every strategy and a partial source.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "executor/communicator.h"
#include "executor/device_local_comm.h"
#include "executor/reshard_runner.h"
#include "graph/status.h"
#include "graph/tiles.h"
#include "planner/reshard.h"
#include "tests/common/reshard_tiles.h"

namespace oases {
namespace {

// Runs `body(rank, communicator)` on n thread ranks; returns each rank's error ("" when none).
std::vector<std::string> on_ranks(int n, const std::function<void(int, Communicator&)>& body, double timeout = 20) {
  auto world = make_device_local_world(n, host_device_ops(), timeout);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = device_local_communicator(world, r);
        body(r, *comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<float> values(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>(rank + 1) + static_cast<float>(i);
  return v;
}

#define EXPECT_NO_ERRORS(errors)                                         \
  for (size_t r_ = 0; r_ < (errors).size(); ++r_) EXPECT_EQ((errors)[r_], "") << "rank " << r_

TEST(DeviceLocalComm, EveryCollectiveOnThreeRanks) {
  const int n = 3;
  const size_t k = 8;
  auto errors = on_ranks(n, [&](int r, Communicator& c) {
    auto g = c.make_group({0, 1, 2});
    // all-reduce: the sum in member order, bit for bit on every member
    std::vector<float> x = values(r, k), want(k, 0.0f);
    for (int j = 0; j < n; ++j) {
      std::vector<float> v = values(j, k);
      for (size_t i = 0; i < k; ++i) want[i] = j == 0 ? v[i] : want[i] + v[i];
    }
    g->all_reduce(x.data(), static_cast<int64_t>(k), DType::kF32, ReduceOp::kSum);
    if (x != want) throw OasesError("all-reduce sum");
    x = values(r, k);
    g->all_reduce(x.data(), static_cast<int64_t>(k), DType::kF32, ReduceOp::kMax);
    if (x != values(n - 1, k)) throw OasesError("all-reduce max");
    // all-gather, and in place (this member's part already at its place)
    std::vector<float> in = values(r, k), out(n * k, -1), all;
    for (int j = 0; j < n; ++j) {
      std::vector<float> v = values(j, k);
      all.insert(all.end(), v.begin(), v.end());
    }
    g->all_gather(in.data(), out.data(), static_cast<int64_t>(k * sizeof(float)));
    if (out != all) throw OasesError("all-gather");
    std::vector<float> inplace(n * k, -1);
    std::copy(in.begin(), in.end(), inplace.begin() + static_cast<long>(r * k));
    g->all_gather(inplace.data() + r * k, inplace.data(), static_cast<int64_t>(k * sizeof(float)));
    if (inplace != all) throw OasesError("all-gather in place");
    // reduce-scatter: chunk r of the sum; in place too
    std::vector<float> rs(k, -1), mine = all;  // every member contributes `all` scaled by its rank + 1
    for (float& v : mine) v *= static_cast<float>(r + 1);
    g->reduce_scatter(mine.data(), rs.data(), static_cast<int64_t>(k), DType::kF32, ReduceOp::kSum);
    std::vector<float> chunk(all.begin() + static_cast<long>(r * k), all.begin() + static_cast<long>((r + 1) * k)), rs_want(k);
    for (size_t i = 0; i < k; ++i) rs_want[i] = chunk[i] * 1.0f + chunk[i] * 2.0f + chunk[i] * 3.0f;
    if (rs != rs_want) throw OasesError("reduce-scatter");
    g->reduce_scatter(mine.data(), mine.data() + r * k, static_cast<int64_t>(k), DType::kF32, ReduceOp::kSum);
    if (!std::equal(rs_want.begin(), rs_want.end(), mine.begin() + static_cast<long>(r * k))) throw OasesError("reduce-scatter in place");
    // all-to-all: chunk j of member i to member j; in place too
    std::vector<float> a2a(n * k), got(n * k, -1), a2a_want(n * k);
    for (size_t i = 0; i < n * k; ++i) a2a[i] = static_cast<float>(100 * r) + static_cast<float>(i);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < k; ++i) a2a_want[j * k + i] = static_cast<float>(100 * j) + static_cast<float>(r * k + i);
    }
    g->all_to_all(a2a.data(), got.data(), static_cast<int64_t>(k * sizeof(float)));
    if (got != a2a_want) throw OasesError("all-to-all");
    g->all_to_all(a2a.data(), a2a.data(), static_cast<int64_t>(k * sizeof(float)));
    if (a2a != a2a_want) throw OasesError("all-to-all in place");
    // broadcast from member 1
    std::vector<float> b = values(r, k);
    g->broadcast(b.data(), static_cast<int64_t>(k * sizeof(float)), 1);
    if (b != values(1, k)) throw OasesError("broadcast");
    // ring shifts, in place and not, both ways
    for (int offset : {1, -1, 2}) {
      std::vector<float> s_in = values(r, k), s_out(k, -1);
      const int from = ((r - offset) % n + n) % n;
      g->shift(s_in.data(), s_out.data(), static_cast<int64_t>(k * sizeof(float)), offset);
      if (s_out != values(from, k)) throw OasesError(fmt::format("shift {}", offset));
      g->shift(s_in.data(), s_in.data(), static_cast<int64_t>(k * sizeof(float)), offset);
      if (s_in != values(from, k)) throw OasesError(fmt::format("shift {} in place", offset));
    }
    g->barrier();
  });
  EXPECT_NO_ERRORS(errors);
}

TEST(DeviceLocalComm, ChannelGroupsOfSubsetsAndManyRounds) {
  auto errors = on_ranks(4, [&](int r, Communicator& c) {
    // {0, 2} and {1, 3} on tag 5, each its own; the world's group beside them, 60 rounds
    CommGroup& pair = c.channel_group(r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}, 5);
    if (&pair != &c.channel_group(r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}, 5)) throw OasesError("not cached");
    auto world = c.make_group({0, 1, 2, 3});
    for (int round = 0; round < 60; ++round) {
      int64_t x = r + round, y = r;
      pair.all_reduce(&x, 1, DType::kI64, ReduceOp::kSum);
      const int64_t want = (r % 2 == 0 ? 0 + 2 : 1 + 3) + 2 * round;
      if (x != want) throw OasesError(fmt::format("round {}: pair sum {} want {}", round, x, want));
      world->all_reduce(&y, 1, DType::kI64, ReduceOp::kSum);
      if (y != 6) throw OasesError(fmt::format("round {}: world sum {}", round, y));
    }
    // a second object of the same group (another owner's) keeps the one order of calls
    auto again = c.make_group({0, 1, 2, 3});
    for (int round = 0; round < 10; ++round) {
      int64_t y = r * round;
      (round % 2 ? *again : *world).all_reduce(&y, 1, DType::kI64, ReduceOp::kSum);
      if (y != 6 * round) throw OasesError(fmt::format("round {}: the world's sum through two objects {}", round, y));
    }
    // not a member: refused
    bool refused = false;
    try {
      c.channel_group({(r + 1) % 4}, 6);
    } catch (const OasesError&) {
      refused = true;
    }
    if (!refused) throw OasesError("a group without this rank was made");
  });
  EXPECT_NO_ERRORS(errors);
}

TEST(DeviceLocalComm, PointToPointInEitherOrderOnTags) {
  auto errors = on_ranks(3, [&](int r, Communicator& c) {
    // a ring: send to r + 1, receive from r - 1; rank 0 receives before it sends, the others after
    const int to = (r + 1) % 3, from = (r + 2) % 3;
    std::vector<float> out = values(r, 16), in(16, -1), in2(16, -1);
    std::unique_ptr<CommRequest> s, q;
    if (r == 0) {
      q = c.irecv(in.data(), 64, from, 1);
      s = c.isend(out.data(), 64, to, 1);
    } else {
      s = c.isend(out.data(), 64, to, 1);
      q = c.irecv(in.data(), 64, from, 1);
    }
    q->wait();
    s->wait();
    if (in != values(from, 16)) throw OasesError("ring transfer");
    // two tags between the same pair, received in the opposite order to the sends
    std::vector<float> a = values(10 + r, 16), b = values(20 + r, 16);
    auto s1 = c.isend(a.data(), 64, to, 2);
    auto s2 = c.isend(b.data(), 64, to, 3);
    auto q2 = c.irecv(in2.data(), 64, from, 3);
    auto q1 = c.irecv(in.data(), 64, from, 2);
    q2->wait();
    q1->wait();
    s1->wait();
    s2->wait();
    if (in != values(10 + from, 16) || in2 != values(20 + from, 16)) throw OasesError("tags");
    // to itself
    std::vector<float> self(16, -1);
    auto ss = c.isend(out.data(), 64, r, 4);
    auto sq = c.irecv(self.data(), 64, r, 4);
    sq->wait();
    ss->wait();
    if (self != out) throw OasesError("to itself");
  });
  EXPECT_NO_ERRORS(errors);
}

TEST(DeviceLocalComm, MismatchedTransferAndAbsentMemberAreErrors) {
  auto errors = on_ranks(2, [&](int r, Communicator& c) {
    std::vector<float> buf(8, 0);
    if (r == 0) {
      auto s = c.isend(buf.data(), 32, 1, 0);
      try {
        s->wait();
      } catch (const OasesError&) {
        return;  // the receiver's mismatch, reported to this side too
      }
      throw OasesError("the send of 32 bytes into 16 completed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_THROW(c.irecv(buf.data(), 16, 0, 0), OasesError);
  });
  EXPECT_NO_ERRORS(errors);
  // member 1 never joins: member 0's all-reduce gives up with the group and the call named
  auto late = on_ranks(
      2,
      [&](int r, Communicator& c) {
        if (r == 1) return;
        auto g = c.make_group({0, 1});
        float x = 1;
        g->all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
      },
      0.3);
  EXPECT_NE(late[0].find("all-reduce"), std::string::npos) << late[0];
  EXPECT_NE(late[0].find("may have failed"), std::string::npos) << late[0];
  EXPECT_EQ(late[1], "");
}

}  // namespace

// Every rank's destination tile of one plan, run on n thread ranks of `make` communicators, from
// testutil::indexed_source_tile's tiles.
std::vector<std::vector<float>> reshard_tiles(int n, const ReshardPlan& plan, const ReshardProblem& p,
                                              const std::function<std::unique_ptr<Communicator>(int)>& make, std::vector<std::string>* errors) {
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  errors->assign(static_cast<size_t>(n), "");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = make(r);
        TileData src = testutil::indexed_source_tile(p, r);
        ReshardRunOptions o;
        o.tag = 1;
        TileData dst = run_reshard(plan, p, *comm, src, o);
        for (const TileBytes& d : dst.data) {
          const auto* f = reinterpret_cast<const float*>(d.data());
          out[static_cast<size_t>(r)].insert(out[static_cast<size_t>(r)].end(), f, f + d.size() / 4);
        }
      } catch (const std::exception& e) {
        (*errors)[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(DeviceLocalComm, ReshardingGivesThreadRanksTilesForEveryStrategy) {
  struct Case {
    std::string src_mesh, src, dst_mesh, dst;
    Shape shape;
    bool overlap;
  };
  const std::vector<Case> cases = {
      {"2x2", "S0R", "2x2", "RS1", {8, 6}, false},   {"2x2", "RS0", "1x4", "S1R", {5, 8}, false},
      {"1x2", "RR", "2x2", "S0R", {6, 4}, false},    {"2x2", "S0R:P1", "2x2", "RS1", {8, 4}, true},
      {"2", "S0R", "2x3", "RS1", {7, 9}, false},     {"2x2", "RR", "2x2", "S01R", {8, 3}, true},
  };
  for (const Case& c : cases) {
    Mesh sm = parse_mesh_shape(c.src_mesh).value(), dm = parse_mesh_shape(c.dst_mesh).value();
    ReshardProblem p;
    p.shape = c.shape;
    p.src.spec = parse_layout(c.src, c.shape.size(), &sm).value();
    p.dst.spec = parse_layout(c.dst, c.shape.size(), &dm).value();
    p.src.placed = PlacedMesh::contiguous(sm, 0);
    p.dst.placed = PlacedMesh::contiguous(dm, c.overlap ? 0 : sm.size());
    const int n = static_cast<int>(std::max(p.src.placed.ranks.back(), p.dst.placed.ranks.back()) + 1);
    ReshardCluster cluster = ReshardCluster::spread(n, 2, LinkModel{1.25, 50}, LinkModel{20, 1});
    for (auto strategy : {ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather, ReshardStrategy::kBroadcast}) {
      std::string what = fmt::format("{} {} -> {} {} ({})", c.src_mesh, c.src, c.dst_mesh, c.dst, strategy_name(strategy));
      auto plan = plan_reshard(p, cluster, {strategy});
      ASSERT_TRUE(plan) << what << ": " << plan.status().message();
      std::vector<std::string> e1, e2;
      auto local_world = make_local_world(n, 20);
      auto want = reshard_tiles(n, *plan, p, [&](int r) { return local_communicator(local_world, r); }, &e1);
      auto device_world = make_device_local_world(n, host_device_ops(), 20);
      auto got = reshard_tiles(n, *plan, p, [&](int r) { return device_local_communicator(device_world, r); }, &e2);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(e1[static_cast<size_t>(r)], "") << what << ", thread rank " << r;
        ASSERT_EQ(e2[static_cast<size_t>(r)], "") << what << ", device-local rank " << r;
        EXPECT_EQ(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << what << ", rank " << r;
      }
      int64_t dst_elements = 0;
      for (const auto& t : want) dst_elements += static_cast<int64_t>(t.size());
      EXPECT_GT(dst_elements, 0) << what;
    }
  }
}

}  // namespace oases
