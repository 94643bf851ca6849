// The planner core on hand-built graphs: sharding propagation through a Megatron MLP pair
// (column split then row split gives a partial sum that one all-reduce resolves), the partitioner's
// local shapes and per-rank constant slices, and the static memory plan's reuse and views.
#include <algorithm>

#include <gtest/gtest.h>

#include "graph/graph.h"
#include "graph/op_registry.h"
#include "planner/memory_plan.h"
#include "planner/partition.h"
#include "planner/propagation.h"

namespace oases {
namespace {

// x [4, 8] · w1 [8, 16] = h [4, 16]; h · w2 [16, 8] = y [4, 8], the graph output.
struct MlpPair {
  Graph g;
  ValueId x, w1, w2, h, y;
};

std::vector<float> iota_f32(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return v;
}

MlpPair mlp_pair() {
  MlpPair m;
  m.x = m.g.add_input("x", DType::kF32, {4, 8});
  m.w1 = m.g.add_initializer("w1", Tensor::from_f32(iota_f32(8 * 16), {8, 16}));
  m.w2 = m.g.add_initializer("w2", Tensor::from_f32(iota_f32(16 * 8), {16, 8}));
  m.h = m.g.add_value("h", DType::kF32, {4, 16}, true);
  m.y = m.g.add_value("y", DType::kF32, {4, 8}, true);
  m.g.add_node("MatMul", {m.x, m.w1}, {m.h}, {}, "mm_column");
  m.g.add_node("MatMul", {m.h, m.w2}, {m.y}, {}, "mm_row");
  m.g.add_output(m.y);
  return m;
}

const Mesh kTp2{{"tp"}, {2}, {}};

// w1 split on its columns, w2 on its rows, over mesh axis 0 (tp); x replicated.
Expected<ShardingResult> megatron_specs(const MlpPair& m) {
  std::map<ValueId, ShardingSpec> seeds{{m.x, ShardingSpec::replicated(2)},
                                        {m.w1, ShardingSpec::replicated(2).with_dim(1, 0)},
                                        {m.w2, ShardingSpec::replicated(2).with_dim(0, 0)}};
  return propagate_sharding(m.g, kTp2, seeds, {});
}

TEST(PlannerPropagation, ColumnThenRowSplitGivesAPartialSumResolvedByAnAllReduce) {
  MlpPair m = mlp_pair();
  auto sr = megatron_specs(m);
  ASSERT_TRUE(sr) << sr.status().message();
  const auto& specs = sr->specs;
  // h = x · w1[:, cols of this rank]: split on its last dim, nothing partial
  EXPECT_EQ(specs[m.h], ShardingSpec::replicated(2).with_dim(1, 0)) << specs[m.h].to_string(&kTp2);
  // y = h[:, part] · w2[part, :]: full shape on each rank, a partial sum over tp
  EXPECT_EQ(specs[m.y], ShardingSpec::replicated(2).with_partial(0)) << specs[m.y].to_string(&kTp2);
  // the graph output must be replicated: exactly one conversion, of y, from the partial sum
  ASSERT_EQ(sr->conversions.size(), 1u);
  const Conversion& c = sr->conversions[0];
  EXPECT_EQ(c.value, m.y);
  EXPECT_TRUE(c.from.is_partial(0));
  EXPECT_TRUE(c.to.is_replicated());
}

TEST(PlannerPropagation, ReplicatedWeightsNeedNoCollective) {
  MlpPair m = mlp_pair();
  std::map<ValueId, ShardingSpec> seeds{
      {m.x, ShardingSpec::replicated(2)}, {m.w1, ShardingSpec::replicated(2)}, {m.w2, ShardingSpec::replicated(2)}};
  auto sr = propagate_sharding(m.g, kTp2, seeds, {});
  ASSERT_TRUE(sr) << sr.status().message();
  EXPECT_TRUE(sr->specs[m.h].is_replicated());
  EXPECT_TRUE(sr->specs[m.y].is_replicated());
  EXPECT_TRUE(sr->conversions.empty());
}

TEST(PlannerPartition, ColumnSplitWeightIsHalvedAndOneAllReduceIsInserted) {
  MlpPair m = mlp_pair();
  auto sr = megatron_specs(m);
  ASSERT_TRUE(sr) << sr.status().message();
  auto pg = partition_graph(m.g, *sr);
  ASSERT_TRUE(pg) << pg.status().message();
  EXPECT_EQ(pg->collectives, 1);
  const Graph& l = pg->local;
  EXPECT_EQ(l.value(l.find_value("w1")).shape, (Shape{8, 8}));
  EXPECT_EQ(l.value(l.find_value("w2")).shape, (Shape{8, 8}));
  EXPECT_EQ(l.value(l.find_value("h")).shape, (Shape{4, 8}));
  EXPECT_EQ(l.value(l.find_value("x")).shape, (Shape{4, 8}));
  int all_reduces = 0;
  for (NodeId n : l.nodes()) {
    const Node& node = l.node(n);
    if (node.domain == kOasesDomain && node.op_type == "AllReduce") {
      ++all_reduces;
      // it reduces the row-parallel product, and its result is what the graph returns
      ASSERT_EQ(node.inputs.size(), 1u);
      EXPECT_EQ(node.inputs[0], l.find_value("y"));
      EXPECT_TRUE(l.is_output(node.outputs[0]));
      EXPECT_EQ(l.value(node.outputs[0]).shape, (Shape{4, 8}));
    }
  }
  EXPECT_EQ(all_reduces, 1);
}

TEST(PlannerPartition, LocalGraphForRankSlicesConstantsPerRank) {
  MlpPair m = mlp_pair();
  auto sr = megatron_specs(m);
  ASSERT_TRUE(sr) << sr.status().message();
  auto pg = partition_graph(m.g, *sr);
  ASSERT_TRUE(pg) << pg.status().message();
  for (int64_t rank = 0; rank < 2; ++rank) {
    Graph r = local_graph_for_rank(*pg, rank);
    // w1 [8, 16] row-major holds i*16 + j: rank r keeps columns [8r, 8r + 8)
    const Tensor& w1 = r.value(r.find_value("w1")).constant;
    ASSERT_EQ(w1.shape(), (Shape{8, 8}));
    for (int64_t i = 0; i < 8; ++i) {
      for (int64_t j = 0; j < 8; ++j) {
        ASSERT_EQ(w1.data<float>()[i * 8 + j], static_cast<float>(i * 16 + rank * 8 + j))
            << "rank " << rank << " w1[" << i << "," << j << "]";
      }
    }
    // w2 [16, 8]: rank r keeps rows [8r, 8r + 8), a contiguous block
    const Tensor& w2 = r.value(r.find_value("w2")).constant;
    ASSERT_EQ(w2.shape(), (Shape{8, 8}));
    for (int64_t k = 0; k < 64; ++k) ASSERT_EQ(w2.data<float>()[k], static_cast<float>(rank * 64 + k)) << "rank " << rank << " w2 at " << k;
  }
}

// A chain x -> a -> b -> c (Relu, Relu, Relu) with v = Reshape(b) read by the last node.
struct Chain {
  Graph g;
  ValueId x, a, b, v, c;
  std::vector<NodeId> order;
};

Chain relu_chain() {
  Chain ch;
  ch.x = ch.g.add_input("x", DType::kF32, {16, 16});
  ch.a = ch.g.add_value("a", DType::kF32, {16, 16}, true);
  ch.b = ch.g.add_value("b", DType::kF32, {16, 16}, true);
  ch.v = ch.g.add_value("v", DType::kF32, {256}, true);
  ch.c = ch.g.add_value("c", DType::kF32, {256}, true);
  ValueId shape = ch.g.add_constant("flat", Tensor::from_int64({256}, {1}));
  ch.order.push_back(ch.g.add_node("Relu", {ch.x}, {ch.a}, {}, "r1"));
  ch.order.push_back(ch.g.add_node("Relu", {ch.a}, {ch.b}, {}, "r2"));
  ch.order.push_back(ch.g.add_node("Reshape", {ch.b, shape}, {ch.v}, {}, "flatten"));
  ch.order.push_back(ch.g.add_node("Relu", {ch.v}, {ch.c}, {}, "r3"));
  ch.g.add_output(ch.c);
  return ch;
}

bool overlap(const ValueSlot& p, const ValueSlot& q) {
  return p.offset < q.offset + static_cast<int64_t>(q.bytes) && q.offset < p.offset + static_cast<int64_t>(p.bytes);
}

TEST(PlannerMemoryPlan, DisjointLifetimesShareSpaceAndLiveOnesDoNot) {
  Chain ch = relu_chain();
  MemoryPlan mp = MemoryPlan::build(ch.g, ch.order, {ch.c});
  const ValueSlot& a = mp.slots[ch.a];
  const ValueSlot& b = mp.slots[ch.b];
  const ValueSlot& c = mp.slots[ch.c];
  ASSERT_EQ(a.kind, ValueSlot::Kind::kArena);
  ASSERT_EQ(b.kind, ValueSlot::Kind::kArena);
  ASSERT_EQ(c.kind, ValueSlot::Kind::kArena);
  EXPECT_EQ(a.bytes, 16u * 16u * 4u);
  // b is defined while a is read (r2): they must not overlap; c reads b's view: nor may those
  EXPECT_FALSE(overlap(a, b));
  EXPECT_FALSE(overlap(b, c));
  // a's last reader (r2) ran before c is defined: c reuses a's space
  EXPECT_TRUE(overlap(a, c));
  EXPECT_EQ(mp.arena_bytes, 2u * 1024u);
  EXPECT_EQ(mp.total_bytes, 3u * 1024u);
  // the input stays outside the arena
  EXPECT_EQ(mp.slots[ch.x].kind, ValueSlot::Kind::kInput);
}

// Placing values as the program runs leaves holes a later, larger value cannot use: here a (1 KiB)
// dies after b (2 KiB) is placed above it, so c (2 KiB, alive beside b) and then d (beside both)
// go on top: 7 KiB. Knowing every lifetime in advance, the largest values go first and a into the
// space c and d do not need while a lives: 6 KiB, the most ever alive at once (b, c and d).
TEST(PlannerMemoryPlan, LifetimesKnownInAdvancePackToTheMostAliveAtOnce) {
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {256});
  auto val = [&](const char* name, int64_t n) { return g.add_value(name, DType::kF32, {n}, true); };
  ValueId a = val("a", 256), b = val("b", 512), c = val("c", 512), d = val("d", 512);
  AttrMap axis0{{"axis", Attribute::of_int(0)}};
  std::vector<NodeId> order{g.add_node("Relu", {x}, {a}, {}, "a"), g.add_node("Concat", {a, a}, {b}, axis0, "b"),
                            g.add_node("Concat", {x, x}, {c}, axis0, "c"), g.add_node("Add", {b, c}, {d}, {}, "d")};
  g.add_output(d);
  MemoryPlan mp = MemoryPlan::build(g, order, {d});
  EXPECT_EQ(mp.arena_bytes, 6u * 1024u);
  // values alive at the same step never share bytes
  EXPECT_FALSE(overlap(mp.slots[a], mp.slots[b]));
  EXPECT_FALSE(overlap(mp.slots[b], mp.slots[c]));
  EXPECT_FALSE(overlap(mp.slots[b], mp.slots[d]));
  EXPECT_FALSE(overlap(mp.slots[c], mp.slots[d]));
  for (ValueId v : {a, b, c, d}) EXPECT_LE(mp.slots[v].offset + static_cast<int64_t>(mp.slots[v].bytes), static_cast<int64_t>(mp.arena_bytes));
}

TEST(PlannerMemoryPlan, ViewsShareTheirRoot) {
  Chain ch = relu_chain();
  MemoryPlan mp = MemoryPlan::build(ch.g, ch.order, {ch.c});
  const ValueSlot& v = mp.slots[ch.v];
  ASSERT_EQ(v.kind, ValueSlot::Kind::kView);
  EXPECT_EQ(v.root, ch.b);
}

TEST(PlannerMemoryPlan, KeptValuesAreNeverReused) {
  Chain ch = relu_chain();
  // keeping a alive to the end: nothing defined later may overlap it
  MemoryPlan mp = MemoryPlan::build(ch.g, ch.order, {ch.a, ch.c});
  EXPECT_FALSE(overlap(mp.slots[ch.a], mp.slots[ch.b]));
  EXPECT_FALSE(overlap(mp.slots[ch.a], mp.slots[ch.c]));
  EXPECT_EQ(mp.arena_bytes, 3u * 1024u);
}

TEST(PlannerMemoryPlan, ACollectivesInputStaysLiveUntilItsWait) {
  // a = Relu(x); r = AllReduce(a) started; b = Relu(x) while it flies; wait; c = Relu(r)
  Graph g;
  ValueId x = g.add_input("x", DType::kF32, {16, 16});
  ValueId a = g.add_value("a", DType::kF32, {16, 16}, true);
  ValueId r = g.add_value("r", DType::kF32, {16, 16}, true);
  ValueId b = g.add_value("b", DType::kF32, {16, 16}, true);
  ValueId c = g.add_value("c", DType::kF32, {16, 16}, true);
  NodeId n1 = g.add_node("Relu", {x}, {a}, {}, "r1");
  NodeId ar = g.add_node("AllReduce", {a}, {r}, {}, "all_reduce", kOasesDomain);
  NodeId n2 = g.add_node("Relu", {x}, {b}, {}, "r2");
  NodeId n3 = g.add_node("Relu", {r}, {c}, {}, "r3");
  g.add_output(b);
  g.add_output(c);
  std::vector<PlanStep> steps{{n1, true, true}, {ar, true, false}, {n2, true, true}, {ar, false, true}, {n3, true, true}};
  MemoryPlan mp = MemoryPlan::build(g, steps, {b, c});
  // a is read by the collective until its wait, after b is defined: no sharing
  EXPECT_FALSE(overlap(mp.slots[a], mp.slots[b]));
  EXPECT_FALSE(overlap(mp.slots[a], mp.slots[r]));
  EXPECT_FALSE(overlap(mp.slots[b], mp.slots[r]));
  // after the wait a is dead: c reuses its space
  EXPECT_TRUE(overlap(mp.slots[a], mp.slots[c]));
}

TEST(PlannerMemoryPlan, AnAllReduceWritesOverInputsNobodyReadsWhileItFlies) {
  // a = Relu(x), d = Relu(x); r, q = AllReduce(a, d) (a bucket) started; b = Relu(x or a) while
  // it flies; wait; c = r + q. With the CPU kernels' in-place pairs each output takes its input's
  // storage, unless a step between the start and the wait reads that input.
  for (bool read_between : {false, true}) {
    Graph g;
    ValueId x = g.add_input("x", DType::kF32, {16, 16});
    ValueId a = g.add_value("a", DType::kF32, {16, 16}, true);
    ValueId d = g.add_value("d", DType::kF32, {16, 16}, true);
    ValueId r = g.add_value("r", DType::kF32, {16, 16}, true);
    ValueId q = g.add_value("q", DType::kF32, {16, 16}, true);
    ValueId b = g.add_value("b", DType::kF32, {16, 16}, true);
    ValueId c = g.add_value("c", DType::kF32, {16, 16}, true);
    NodeId n1 = g.add_node("Relu", {x}, {a}, {}, "r1");
    NodeId n0 = g.add_node("Relu", {x}, {d}, {}, "r0");
    NodeId ar = g.add_node("AllReduce", {a, d}, {r, q}, {}, "bucket", kOasesDomain);
    NodeId n2 = g.add_node("Relu", {read_between ? a : x}, {b}, {}, "r2");
    NodeId n3 = g.add_node("Add", {r, q}, {c}, {}, "sum");
    g.add_output(b);
    g.add_output(c);
    std::vector<PlanStep> steps{{n1, true, true}, {n0, true, true}, {ar, true, false}, {n2, true, true}, {ar, false, true}, {n3, true, true}};
    MemoryPlan mp = MemoryPlan::build(g, steps, {b, c}, inplace_outputs);
    EXPECT_EQ(mp.slots[q].kind, ValueSlot::Kind::kView) << "read between: " << read_between;
    EXPECT_EQ(mp.slots[q].root, d);
    if (read_between) {
      // r2 reads a while the collective would write r over it
      EXPECT_EQ(mp.slots[r].kind, ValueSlot::Kind::kArena);
      EXPECT_FALSE(overlap(mp.slots[a], mp.slots[r]));
      EXPECT_EQ(mp.inplace, 2);  // q over d, and the sum over r
    } else {
      EXPECT_EQ(mp.slots[r].kind, ValueSlot::Kind::kView);
      EXPECT_EQ(mp.slots[r].root, a);
      EXPECT_EQ(mp.inplace, 3);  // r over a, q over d, the sum over r
    }
    // b is made while the collective flies: never in its buffers
    EXPECT_FALSE(overlap(mp.slots[a], mp.slots[b]));
    EXPECT_FALSE(overlap(mp.slots[d], mp.slots[b]));
  }
}

}  // namespace
}  // namespace oases
