// One rank program for every tool (planner/rank_program.h): the two phases agree with the one-call
// form, every rank of a split gets its own shards, the plan's schedule, recomputation and dtype
// shape the program, and the executor runs the program as built.
#include <cstring>

#include <gtest/gtest.h>

#include "executor/executor.h"
#include "graph/blocks.h"
#include "graph/op_registry.h"
#include "planner/rank_program.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

Graph gpt2_forward() {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/gpt2_bytes/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, 8, 16);
  EXPECT_TRUE(pm) << pm.status().message();
  return std::move(pm->forward);
}

int count_kind(const std::vector<ScheduledOp>& order, ScheduledOp::Kind k) {
  int n = 0;
  for (const ScheduledOp& op : order) n += op.kind == k;
  return n;
}

TEST(RankProgram, TwoPhasesMatchTheOneCall) {
  Graph fwd = gpt2_forward();
  Plan plan = Plan::megatron(2, 1);
  plan.mesh().schedule = "oases";
  plan.mesh().chunks = 2;
  auto gp = build_global_program(fwd, TrainingSpec{}, plan, 2, GlobalProgramOptions{});
  ASSERT_TRUE(gp) << gp.status().message();
  ASSERT_TRUE(gp->partitioned.has_value());
  auto r0 = build_rank_program(*gp, 0);
  auto r1 = build_rank_program(*gp, 1);
  auto one = build_rank_program(fwd, plan, 1);
  ASSERT_TRUE(r0 && r1 && one);
  EXPECT_EQ(r1->program.order.size(), one->program.order.size());
  EXPECT_EQ(r0->program.order.size(), r1->program.order.size());  // every rank derives the same order
  EXPECT_GT(count_kind(r0->program.order, ScheduledOp::Kind::kCommStart), 0);
  EXPECT_GT(r0->recompute.nodes, 0);  // oases recomputes the blocks
  EXPECT_GT(r0->program.memory.arena_bytes, 0u);
  // the constants are sliced for each rank: a column-split weight differs between the ranks
  int differing = 0;
  for (size_t i = 0; i < gp->train.params.size(); ++i) {
    if (gp->param_specs[i].is_replicated()) continue;
    ValueId p = gp->train.params[i];
    const Tensor& a = r0->train.graph.value(p).constant;
    const Tensor& b = r1->train.graph.value(p).constant;
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_NE(a.shape(), gp->param_shapes[i]);
    differing += std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0;
  }
  EXPECT_GT(differing, 0);
}

// Data parallelism with micro-batch chunks: each rank computes its own rows of every chunk (a
// chunk's contiguous slice of a batch already split over dp used to gather the batch first, so
// every rank computed every row; the gradients agreed, the work was dp times too much).
TEST(RankProgram, DataParallelChunksComputeTheirRanksRowsOnly) {
  Graph fwd = gpt2_forward();  // batch 8
  Plan plan = Plan::megatron(1, 2);
  plan.mesh().schedule = "oases";
  plan.mesh().chunks = 2;
  for (int64_t rank : {0, 1}) {
    auto r = build_rank_program(fwd, plan, rank);
    ASSERT_TRUE(r) << r.status().message();
    const Graph& g = r->train.graph;
    int slices = 0;
    for (NodeId id : g.nodes()) {
      const Node& n = g.node(id);
      if (n.op_type != "Slice" || !g.value(n.inputs[0]).is_input) continue;
      ++slices;
      EXPECT_EQ(g.value(n.inputs[0]).shape[0], 8) << "the input stays whole: " << n.name;
      // the chunk's slice, then this rank's half of it (on the partition's ShardSlice)
      int64_t rows = g.value(n.outputs[0]).shape[0];
      for (const Use& u : g.uses(n.outputs[0])) {
        const Node& c = g.node(u.node);
        if (c.op_type == "ShardSlice") rows = g.value(c.outputs[0]).shape[0];
      }
      EXPECT_EQ(rows, 2) << n.name;
    }
    EXPECT_EQ(slices, 4) << "tokens and targets, two chunks each";
    for (NodeId id : g.nodes()) {
      const Node& n = g.node(id);
      if (n.phase != Node::Phase::kForward || n.op_type != "MatMul") continue;
      const Shape& x = g.value(n.inputs[0]).shape;
      if (x.size() == 3) {
        EXPECT_EQ(x[0], 2) << n.name << " computes " << x[0] << " rows";
      }
    }
  }
}

// A parameter's gradient over K chunks is summed in the order the chunks' backward passes run
// (chunk 0 first), so each chunk's contribution is added as soon as it exists: more chunks do not
// keep more copies of the weight gradients (summed in the reverse pass's order, K = 8 once held
// all eight at the peak: an arena three times K = 1's).
TEST(RankProgram, ChunkGradientsAreSummedAsTheChunksRun) {
  Graph fwd = gpt2_forward();  // batch 8
  size_t arena1 = 0;
  for (int64_t k : {1, 8}) {
    Plan plan = Plan::megatron(1, 1);
    plan.mesh().schedule = "default_checkpoint";
    plan.mesh().chunks = k;
    auto r = build_rank_program(fwd, plan, 0);
    ASSERT_TRUE(r) << r.status().message();
    if (k == 1) {
      arena1 = r->program.memory.arena_bytes;
      continue;
    }
    EXPECT_LT(r->program.memory.arena_bytes, arena1 + arena1 / 4) << "K = 8: " << r->program.memory.arena_bytes << " bytes, K = 1: " << arena1;
    // every accumulation adds the next chunk's contribution to the sum of the earlier ones
    const Graph& g = r->train.graph;
    int checked = 0;
    for (NodeId id : g.nodes()) {
      const Node& n = g.node(id);
      if (n.name.find("/grad/accumulate") == std::string::npos || n.op_type != "Add") continue;
      auto chunk_of = [&](ValueId v) {
        NodeId p = g.value(v).producer;
        return p == kNoId ? -1 : g.node(p).chunk;
      };
      const NodeId first = g.value(n.inputs[0]).producer;
      if (first == kNoId || g.node(first).name.find("/grad/accumulate") == std::string::npos) {
        EXPECT_LE(chunk_of(n.inputs[0]), chunk_of(n.inputs[1])) << n.name;
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
  }
}

// A mixed-precision training graph reads its parameters through Casts: the structure found on it
// (plan files' and pages' blocks) still names every block's projections and their fp32 weights.
TEST(RankProgram, StructureOfABf16TrainingGraphNamesItsProjections) {
  Graph fwd = gpt2_forward();
  ModelStructure want = find_transformer_structure(fwd);
  ASSERT_FALSE(want.blocks.empty());
  Plan plan = Plan::megatron(2, 1);
  plan.dtype = "bf16";
  auto gp = build_global_program(fwd, TrainingSpec{}, plan, 2, GlobalProgramOptions{});
  ASSERT_TRUE(gp) << gp.status().message();
  ModelStructure got = find_transformer_structure(gp->train.graph);
  ASSERT_EQ(got.blocks.size(), want.blocks.size());
  for (size_t b = 0; b < want.blocks.size(); ++b) {
    ASSERT_EQ(got.blocks[b].attn.qkv.size(), want.blocks[b].attn.qkv.size()) << "block " << b;
    for (size_t i = 0; i < want.blocks[b].attn.qkv.size(); ++i) EXPECT_EQ(got.blocks[b].attn.qkv[i].weight, want.blocks[b].attn.qkv[i].weight);
    EXPECT_EQ(got.blocks[b].attn.out.weight, want.blocks[b].attn.out.weight);
    ASSERT_EQ(got.blocks[b].mlp.up.size(), want.blocks[b].mlp.up.size()) << "block " << b;
    EXPECT_EQ(got.blocks[b].mlp.down.weight, want.blocks[b].mlp.down.weight);
    EXPECT_EQ(got.blocks[b].attn.out.bias, want.blocks[b].attn.out.bias);
  }
}

// The vocabulary-parallel loss communicates once a chunk: the ranks' row statistics gathered side
// by side (it was a max all-reduce and then a sum all-reduce); its gradient adds none.
TEST(RankProgram, VocabularyParallelLossGathersOnceAChunk) {
  Graph fwd = gpt2_forward();
  Plan plan = Plan::megatron(2, 1);
  plan.mesh().schedule = "oases";
  plan.mesh().chunks = 2;
  auto r = build_rank_program(fwd, plan, 0);
  ASSERT_TRUE(r) << r.status().message();
  const Graph& g = r->train.graph;
  std::vector<std::string> loss_collectives;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (n.name.find("/vocab_parallel/") == std::string::npos || !op_has_trait(n, kTraitCollective)) continue;
    loss_collectives.push_back(n.op_type);
    EXPECT_EQ(n.op_type, "AllGather") << n.name;
    EXPECT_NE(n.phase, Node::Phase::kBackward) << n.name;
  }
  EXPECT_EQ(loss_collectives.size(), 2u) << "one per chunk";
}

TEST(RankProgram, PlanFieldsShapeTheProgram) {
  Graph fwd = gpt2_forward();
  Plan plain = Plan::megatron(1, 1);
  auto base = build_rank_program(fwd, plain, 0);
  ASSERT_TRUE(base) << base.status().message();
  EXPECT_FALSE(base->schedule.has_value());
  EXPECT_TRUE(base->order.empty());
  // recomputation as a field: the comm-optimised schedule without any recomputation
  Plan no_recompute = plain;
  no_recompute.mesh().schedule = "oases";
  no_recompute.mesh().recompute = CheckpointMode::kNone;
  auto nr = build_rank_program(fwd, no_recompute, 0);
  ASSERT_TRUE(nr) << nr.status().message();
  EXPECT_EQ(nr->recompute.nodes, 0);
  // the compute dtype applies to every tool's program, not only the trainer's
  Plan bf16 = plain;
  bf16.dtype = "bf16";
  auto mp = build_rank_program(fwd, bf16, 0);
  ASSERT_TRUE(mp) << mp.status().message();
  int casts = 0;
  for (NodeId n : mp->train.graph.nodes()) casts += mp->train.graph.node(n).op_type == "Cast";
  int base_casts = 0;
  for (NodeId n : base->train.graph.nodes()) base_casts += base->train.graph.node(n).op_type == "Cast";
  EXPECT_GT(casts, base_casts);
}

TEST(RankProgram, TheExecutorRunsTheProgramAsBuilt) {
  Graph fwd = gpt2_forward();
  Plan plan = Plan::megatron(1, 1);
  plan.mesh().schedule = "optim_comm_checkpoint";
  auto rp = build_rank_program(fwd, plan, 0);
  ASSERT_TRUE(rp) << rp.status().message();
  size_t instrs = rp->program.order.size();
  size_t arena = rp->program.memory.arena_bytes;
  auto prog = compile_program(std::move(rp->program));
  ASSERT_TRUE(prog) << prog.status().message();
  EXPECT_EQ(prog->instrs.size(), instrs);
  EXPECT_EQ(prog->memory.arena_bytes, arena);
  EXPECT_EQ(prog->kernels.size(), instrs);
}

}  // namespace
}  // namespace oases
