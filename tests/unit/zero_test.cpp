// The distributed optimizer's pieces (graph/tiles.h flat_piece, oases.FlatReduceScatter,
// executor/zero.h ZeroShards, Optimizer::set_range) over thread ranks, with sizes that do not
// divide by the group (padded last pieces, a member with an empty piece).
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "executor/communicator.h"
#include "executor/distributed.h"
#include "executor/executor.h"
#include "executor/optimizer.h"
#include "executor/zero.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "graph/tiles.h"

namespace oases {
namespace {

// Runs body(rank, its dp group) on n thread ranks of a 1-axis mesh "dp".
void on_ranks(int n, const std::function<void(int, RankRuntime&)>& body) {
  auto world = make_local_world(n, 30);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      auto comm = local_communicator(world, r);
      auto rt = RankRuntime::create(comm.get(), Mesh{{"dp"}, {n}, {}});
      ASSERT_TRUE(static_cast<bool>(rt)) << rt.status().message();
      body(r, **rt);
    });
  }
  for (auto& t : ts) t.join();
}

Tensor iota(const Shape& s, float base) {
  Tensor t(DType::kF32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = base + static_cast<float>(i);
  return t;
}

TEST(Zero, PiecesCoverEveryElementOnce) {
  for (int64_t numel : {0, 1, 5, 7, 8, 1000003}) {
    for (int64_t n : {1, 2, 3, 8}) {
      int64_t covered = 0;
      for (int64_t r = 0; r < n; ++r) {
        int64_t len = flat_piece_length(numel, n, r);
        EXPECT_LE(len, flat_piece(numel, n));
        if (len > 0) {
          EXPECT_EQ(r * flat_piece(numel, n), covered) << numel << " over " << n;
        }
        covered += len;
      }
      EXPECT_EQ(covered, numel) << numel << " over " << n;
      EXPECT_GE(flat_piece(numel, n) * n, numel);
    }
  }
}

// A bucket of two gradients of 7 and 4 elements over 3 members: pieces of 3 and 2, each the sum
// of the members' slices, padded with zeros where the tensor ends.
TEST(Zero, FlatReduceScatterSumsEachMembersPieces) {
  const int n = 3;
  on_ranks(n, [&](int r, RankRuntime& rt) {
    Graph g;
    ValueId x = g.add_input("x", DType::kF32, {7});
    ValueId y = g.add_input("y", DType::kF32, {2, 2});
    ValueId px = g.add_value("px", DType::kF32, {3}, true), py = g.add_value("py", DType::kF32, {2}, true);
    AttrMap a;
    a.set_int("mesh_axis", 0);
    a.set_int("group_size", n);
    g.add_node("FlatReduceScatter", {x, y}, {px, py}, a, "zero", kOasesDomain);
    g.add_output(px);
    g.add_output(py);
    ExecOptions o;
    o.groups = rt.axis_groups();
    auto ex = Executor::create(g, o);
    ASSERT_TRUE(static_cast<bool>(ex)) << ex.status().message();
    // member m feeds (m + 1) * (0, 1, 2, ...): the sums are 6 * (0, 1, 2, ...)
    Tensor xs = iota({7}, 0.f), ys = iota({2, 2}, 0.f);
    for (int64_t e = 0; e < 7; ++e) xs.mutable_data<float>()[e] *= static_cast<float>(r + 1);
    for (int64_t e = 0; e < 4; ++e) ys.mutable_data<float>()[e] *= static_cast<float>(r + 1);
    auto out = (*ex)->run({{"x", xs}, {"y", ys}});
    ASSERT_TRUE(static_cast<bool>(out)) << out.status().message();
    const float* gx = (*out)[0].data<float>();
    const float* gy = (*out)[1].data<float>();
    for (int64_t k = 0; k < 3; ++k) {
      int64_t e = rt.rank() * 3 + k;
      EXPECT_EQ(gx[k], e < 7 ? 6.f * static_cast<float>(e) : 0.f) << "member " << rt.rank() << " x[" << e << "]";
    }
    for (int64_t k = 0; k < 2; ++k) {
      int64_t e = rt.rank() * 2 + k;
      EXPECT_EQ(gy[k], e < 4 ? 6.f * static_cast<float>(e) : 0.f) << "member " << rt.rank() << " y[" << e << "]";
    }
  });
}

// Pieces made whole (gather), cut again (slice), and the updated pieces of every member
// all-gathered into each member's whole copies; a parameter of 2 elements over 3 members leaves
// the last member an empty piece.
TEST(Zero, PiecesGatherSliceAndAllGather) {
  const int n = 3;
  on_ranks(n, [&](int r, RankRuntime& rt) {
    CommGroup* group = rt.axis_groups().at(0);
    std::vector<int64_t> numel = {7, 2, 12};
    // three parameters of a program without FlatReduceScatter: no pieces until add_whole
    ZeroShards shards;
    Graph g;
    std::vector<ValueId> params, grads;
    for (size_t i = 0; i < numel.size(); ++i) {
      params.push_back(g.add_initializer("p" + std::to_string(i), iota({numel[i]}, 0.f)));
      grads.push_back(g.add_value("g" + std::to_string(i), DType::kF32, {numel[i]}, true));
    }
    auto found = ZeroShards::find(g, params, grads, rt.axis_groups());
    ASSERT_TRUE(static_cast<bool>(found)) << found.status().message();
    shards = *found;
    EXPECT_FALSE(shards.any());
    for (size_t i = 0; i < numel.size(); ++i) shards.add_whole(i, group, numel[i]);
    ASSERT_TRUE(shards.any());
    EXPECT_EQ(shards.piece(1)->length, r < 2 ? 1 : 0);
    std::vector<Tensor> whole;
    std::vector<Tensor*> ptrs;
    for (size_t i = 0; i < numel.size(); ++i) {
      // each member's copy is right only on its own piece, garbage elsewhere
      Tensor t(DType::kF32, {numel[i]});
      const ZeroPiece& p = *shards.piece(i);
      for (int64_t e = 0; e < numel[i]; ++e) {
        bool mine = e >= p.offset && e < p.offset + p.length;
        t.mutable_data<float>()[e] = mine ? 10.f * static_cast<float>(i) + static_cast<float>(e) : -1.f - static_cast<float>(r);
      }
      whole.push_back(t);
    }
    for (Tensor& t : whole) ptrs.push_back(&t);
    shards.all_gather(ptrs);
    for (size_t i = 0; i < numel.size(); ++i) {
      for (int64_t e = 0; e < numel[i]; ++e) EXPECT_EQ(whole[i].data<float>()[e], 10.f * static_cast<float>(i) + static_cast<float>(e));
      Tensor piece = shards.slice(i, whole[i]);
      EXPECT_EQ(piece.shape(), Shape{shards.piece(i)->length});
      std::vector<float> padded(static_cast<size_t>(shards.piece(i)->piece), 0.f);
      for (int64_t e = 0; e < piece.numel(); ++e) padded[static_cast<size_t>(e)] = piece.data<float>()[e];
      Tensor back = shards.gather(i, padded.data(), {numel[i]});
      for (int64_t e = 0; e < numel[i]; ++e) EXPECT_EQ(back.data<float>()[e], whole[i].data<float>()[e]);
    }
    // Σ g² of the pieces summed over the group is the whole gradient's
    std::vector<double> ss = {static_cast<double>(r + 1), 0.0, 1.0};
    shards.sum_over_groups(&ss);
    EXPECT_EQ(ss[0], 6.0);
    EXPECT_EQ(ss[2], 3.0);
  });
}

// The all-gathers left to the next run (Trainer::hand_gathers_to_next_run): the buckets cover every
// sharded parameter once, and a run given them as deferred writes reads the gathered parameter.
TEST(Zero, DeferredGathersFinishBeforeTheirReaders) {
  on_ranks(2, [&](int r, RankRuntime& rt) {
    const int64_t numel = 9;
    Graph g;
    g.opset_imports[""] = 17;
    ValueId p = g.add_initializer("p", iota({numel}, 0.f));
    ValueId x = g.add_input("x", DType::kF32, {numel});
    NodeId add = g.add_node_new_outputs("Add", {x, p}, 1, {}, "add");
    ASSERT_TRUE(infer_node(g, add).is_ok());
    g.add_output(g.node(add).outputs[0]);
    auto ex = Executor::create(g);
    ASSERT_TRUE(static_cast<bool>(ex)) << ex.status().message();
    auto found = ZeroShards::find(g, {p}, {x}, rt.axis_groups());
    ASSERT_TRUE(static_cast<bool>(found)) << found.status().message();
    ZeroShards shards = *found;
    shards.add_whole(0, rt.axis_groups().at(0), numel);
    // this member's piece is right, the rest stale
    Tensor& w = (*ex)->constant_storage(p);
    const ZeroPiece& z = *shards.piece(0);
    for (int64_t e = 0; e < numel; ++e) {
      if (e < z.offset || e >= z.offset + z.length) w.mutable_data<float>()[e] = -100.f - static_cast<float>(r);
    }
    auto buckets = shards.gather_buckets({&w});
    ASSERT_EQ(buckets.size(), 1u);
    EXPECT_EQ(buckets[0].params, std::vector<size_t>{0});
    std::vector<Executor::ConstantWrite> writes{{{p}, buckets[0].run}};
    (*ex)->defer_constant_writes(std::move(writes));
    EXPECT_TRUE((*ex)->has_deferred_writes());
    auto y = (*ex)->run({{"x", iota({numel}, 0.f)}});
    ASSERT_TRUE(static_cast<bool>(y)) << y.status().message();
    EXPECT_FALSE((*ex)->has_deferred_writes());
    for (int64_t e = 0; e < numel; ++e) EXPECT_EQ((*y)[0].data<float>()[e], 2.f * static_cast<float>(e)) << e;
  });
}

// An update over a range gives the bits of the whole update on that range.
TEST(Zero, OptimizerRangeUpdatesItsPieceAsTheWholeUpdateDoes) {
  OptimizerConfig c;
  c.kind = "adamw";
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  Tensor whole = iota({2, 5}, 0.5f), piece_run = whole.clone();
  Tensor grad = iota({2, 5}, -3.f);
  Optimizer a(c), b(c);
  a.add("w", whole);
  b.add("w", piece_run);
  b.set_range(0, 4, 3);
  EXPECT_EQ(b.updated_elements(0), 3);
  EXPECT_EQ(b.state_bytes(), 3u * 4 * 2);
  EXPECT_EQ(b.whole_state_bytes(), 10u * 4 * 2);
  for (int s = 0; s < 3; ++s) {
    a.step_with_norm({grad.data<float>()}, 1.f, 1.0);
    b.step_with_norm({grad.data<float>() + 4}, 1.f, 1.0);
  }
  for (int64_t e = 0; e < 10; ++e) {
    if (e >= 4 && e < 7) {
      EXPECT_EQ(piece_run.data<float>()[e], whole.data<float>()[e]) << e;
    } else {
      EXPECT_EQ(piece_run.data<float>()[e], 0.5f + static_cast<float>(e)) << e;  // outside the range: untouched
    }
  }
  auto st = b.state();
  EXPECT_EQ(st.at("w.m").shape(), Shape{3});
  // a state of the whole shape is refused by name for a ranged parameter
  std::map<std::string, Tensor> wrong = {{"w.m", Tensor(DType::kF32, {2, 5})}, {"w.v", Tensor(DType::kF32, {2, 5})}};
  Status s = b.set_state(wrong, 3);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("w.m"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace oases
