// The schedules' structure on GPT-2 (planner/schedule.h), tp 2 with 2 chunks: the oases order
// starts a chunk's collective before another chunk's compute and waits for it only right before
// its result is read; communication-optimized checkpointing recomputes no collective while block
// checkpointing does. Structure only: timings belong in bench/.
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "graph/op_registry.h"
#include "planner/rank_program.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

using Kind = ScheduledOp::Kind;

Expected<RankProgram> gpt2_rank0(const std::string& schedule, int chunks) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/gpt2_bytes/model.onnx";
  OASES_ASSIGN_OR_RETURN(PlanningModel pm, load_planning_model(path, ImportOptions{}, 8, 16));
  Plan plan = Plan::megatron(2, 1);
  plan.mesh().schedule = schedule;
  plan.mesh().chunks = chunks;
  return build_rank_program(pm.forward, plan, 0);
}

struct Interval {
  size_t start = 0, wait = 0;
  bool started = false, waited = false;
};

TEST(PlannerSchedule, OasesStartsEachCollectiveBeforeAnotherChunksComputeAndWaitsAtTheReader) {
  auto rp = gpt2_rank0("oases", 2);
  ASSERT_TRUE(rp) << rp.status().message();
  const Graph& g = rp->train.graph;
  const std::vector<ScheduledOp>& order = rp->order;
  ASSERT_FALSE(order.empty());
  std::map<NodeId, Interval> coll;
  std::map<NodeId, size_t> reader_step;  // compute or start instruction of each node
  for (size_t i = 0; i < order.size(); ++i) {
    const ScheduledOp& op = order[i];
    if (op.kind == Kind::kCommStart) {
      ASSERT_FALSE(coll[op.node].started) << g.node(op.node).name << " started twice";
      coll[op.node].start = i, coll[op.node].started = true;
    } else if (op.kind == Kind::kCommWait) {
      ASSERT_TRUE(coll[op.node].started) << g.node(op.node).name << " awaited before its start";
      ASSERT_FALSE(coll[op.node].waited) << g.node(op.node).name << " awaited twice";
      coll[op.node].wait = i, coll[op.node].waited = true;
    }
    if (op.kind != Kind::kCommWait) reader_step.emplace(op.node, i);
  }
  ASSERT_GT(coll.size(), 0u);
  int overlapped = 0, forward = 0, forward_overlapped = 0;
  for (const auto& [n, iv] : coll) {
    const Node& node = g.node(n);
    ASSERT_TRUE(iv.waited) << node.name << " never awaited";
    // the first instruction reading a result of the collective comes after its wait, and only
    // other waits stand between the two: the wait is not hoisted away from the reader
    size_t first_reader = order.size();
    for (ValueId out : node.outputs) {
      if (out == kNoId) continue;
      for (const Use& u : g.value(out).uses) {
        auto it = reader_step.find(u.node);
        if (it != reader_step.end()) first_reader = std::min(first_reader, it->second);
      }
    }
    if (first_reader < order.size()) {
      ASSERT_GT(first_reader, iv.wait) << node.name << " is read before its wait";
      for (size_t i = iv.wait + 1; i < first_reader; ++i) {
        EXPECT_EQ(order[i].kind, Kind::kCommWait)
            << node.name << ": instruction " << i << " (" << g.node(order[i].node).name << ") runs between its wait and its first reader";
      }
    }
    bool other_chunk_computes = false;
    for (size_t i = iv.start + 1; i < iv.wait; ++i) {
      other_chunk_computes |= order[i].kind == Kind::kCompute && g.node(order[i].node).chunk != node.chunk;
    }
    overlapped += other_chunk_computes;
    if (node.phase == Node::Phase::kForward) {
      ++forward;
      forward_overlapped += other_chunk_computes;
    }
  }
  // interleaved per sub-layer: every forward collective flies while the other chunk computes
  EXPECT_GT(forward, 0);
  EXPECT_EQ(forward_overlapped, forward);
  EXPECT_GT(overlapped, forward);  // backward collectives are hidden too
}

// The last block's recomputation runs while the head's backward all-reduce flies: the final
// norm's gradient, alone in the step after it, has nothing else to compute before its wait.
TEST(PlannerSchedule, OasesRecomputesTheLastBlockBesideTheFirstBackwardCollective) {
  auto rp = gpt2_rank0("oases", 2);
  ASSERT_TRUE(rp) << rp.status().message();
  const Graph& g = rp->train.graph;
  const std::vector<ScheduledOp>& order = rp->order;
  size_t start = order.size(), wait = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& n = g.node(order[i].node);
    if (start == order.size() && order[i].kind == Kind::kCommStart && n.phase == Node::Phase::kBackward) start = i;
    if (start < order.size() && order[i].kind == Kind::kCommWait && order[i].node == order[start].node) {
      wait = i;
      break;
    }
  }
  ASSERT_LT(wait, order.size()) << "no backward collective started and awaited";
  int recomputed = 0;
  for (size_t i = start + 1; i < wait; ++i) {
    recomputed += order[i].kind == Kind::kCompute && g.node(order[i].node).phase == Node::Phase::kRecompute;
  }
  EXPECT_GT(recomputed, 0) << g.node(order[start].node).name << " (" << g.node(order[start].node).scope
                           << ") has no recomputation beside it";
}

TEST(PlannerSchedule, DefaultCheckpointRunsChunksOneAfterAnother) {
  auto rp = gpt2_rank0("default_checkpoint", 2);
  ASSERT_TRUE(rp) << rp.status().message();
  const Graph& g = rp->train.graph;
  // not interleaved: the forward compute of chunk 1 begins only after chunk 0's forward compute ended
  size_t last_fwd0 = 0, first_fwd1 = rp->order.size();
  for (size_t i = 0; i < rp->order.size(); ++i) {
    const Node& n = g.node(rp->order[i].node);
    if (rp->order[i].kind != Kind::kCompute || n.phase != Node::Phase::kForward) continue;
    if (n.chunk == 0) last_fwd0 = i;
    if (n.chunk == 1) first_fwd1 = std::min(first_fwd1, i);
  }
  ASSERT_LT(first_fwd1, rp->order.size());
  EXPECT_LT(last_fwd0, first_fwd1);
}

int recomputed_collectives(const Graph& g) {
  int n = 0;
  for (NodeId id : g.nodes()) {
    const Node& node = g.node(id);
    n += node.phase == Node::Phase::kRecompute && is_collective(node);
  }
  return n;
}

TEST(PlannerSchedule, CommOptimizedCheckpointRecomputesNoCollective) {
  auto opt = gpt2_rank0("optim_comm_checkpoint", 1);
  ASSERT_TRUE(opt) << opt.status().message();
  EXPECT_GT(opt->recompute.nodes, 0);
  EXPECT_EQ(opt->recompute.collectives, 0);
  EXPECT_EQ(recomputed_collectives(opt->train.graph), 0);
  // block checkpointing repeats the forward collectives: the report and the graph agree
  auto block = gpt2_rank0("default_checkpoint", 1);
  ASSERT_TRUE(block) << block.status().message();
  EXPECT_GT(block->recompute.collectives, 0);
  EXPECT_EQ(recomputed_collectives(block->train.graph), block->recompute.collectives);
}

}  // namespace
}  // namespace oases
