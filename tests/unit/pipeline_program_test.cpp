// Pipeline stage programs (planner/pipeline_program.h) and the pipeline search
// (planner/pipeline_search.h): where nodes go, that every rank's transfers pair up in one order and
// replay without deadlock under each schedule, the micro-batches in flight per stage, the planner's
// choice on a small cluster and plan files of version 3.
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "graph/blocks.h"
#include "graph/op_registry.h"
#include "planner/cluster_spec.h"
#include "planner/pipeline_program.h"
#include "planner/pipeline_replay.h"
#include "planner/pipeline_search.h"
#include "planner/profile.h"
#include "planner/reshard.h"
#include "tools/plan_driver.h"

namespace oases {
namespace {

// models/train/`name` at batch x 16 tokens
PlanningModel train_model(const std::string& name, int64_t batch) {
  std::string path = std::string(OASES_SOURCE_DIR) + "/models/train/" + name + "/model.onnx";
  auto pm = load_planning_model(path, ImportOptions{}, batch, 16);
  EXPECT_TRUE(pm) << pm.status().message();
  return std::move(*pm);
}

PlanningModel tied_model(int64_t batch = 8) { return train_model("gpt2_4l", batch); }

// `plan` as the first of S stages (M micro-batches, `schedule`), cut at `cuts` ("": evenly), the
// others on `meshes` ("2x1,1x1:oases"; "": the first's), as oases-train makes them.
Plan staged(const Plan& plan, int64_t S, int64_t M, const std::string& schedule, const std::string& cuts = "",
            const std::string& meshes = "") {
  std::vector<MeshPlan> own;
  if (!meshes.empty()) own = parse_stage_meshes(meshes, S).value();
  return with_stages(plan, S, M, schedule, cuts, own).value();
}

struct Built {
  GlobalProgram gp;  // stage 0's
  Plan plan;         // the pipeline, its stages resolved (blocks, ranks, micro-batches)
  std::vector<StageCut> cuts;
  ReshardCluster machine;                                // one machine
  std::vector<std::shared_ptr<GlobalProgram>> stage_gp;  // per stage (with stage meshes)
  std::vector<const GlobalProgram*> stages() const {
    std::vector<const GlobalProgram*> out;
    for (int64_t s = 0; s < plan.num_stages(); ++s) out.push_back(stage_gp.empty() ? &gp : stage_gp[static_cast<size_t>(s)].get());
    return out;
  }
  // world rank `rank`'s program, shapes only (the weights unread)
  Expected<RankProgram> shapes_program(int64_t rank, StageProgramInfo* info) const {
    RankProgramOptions ro;
    ro.slice_constants = false;
    return build_stage_program(stages(), plan, machine, rank, ro, info);
  }
  void set_stage_ranks(int64_t s, int64_t ranks) {
    plan.stages[static_cast<size_t>(s)].ranks = ranks;
    machine = reshard_cluster(plan.world(), {}, {}, {});
  }
};

// A stage's program as oases-train builds it: the values crossing `cuts` marked whole.
Expected<GlobalProgram> program_on(const PlanningModel& pm, int64_t tp, int64_t dp, int chunks, const std::string& schedule,
                                   const std::vector<StageCut>& cuts) {
  Plan plan = Plan::megatron(tp, dp);
  plan.mesh().schedule = schedule;
  plan.mesh().chunks = chunks;
  GlobalProgramOptions opts;
  opts.pipeline = true;
  opts.stage_cuts = cuts;
  return build_global_program(pm.forward, TrainingSpec{}, plan, tp * dp, opts);
}

Built build(int S, int64_t tp, int M, int K, PipelineSchedule sched, const std::string& schedule = "") {
  PlanningModel pm = tied_model();
  auto cuts = cut_stages(count_blocks(pm.forward), S);
  EXPECT_TRUE(cuts) << cuts.status().message();
  auto gp = program_on(pm, tp, 1, M * K, schedule, *cuts);
  EXPECT_TRUE(gp) << gp.status().message();
  Plan first = Plan::megatron(tp, 1);
  first.mesh().schedule = schedule;
  first.mesh().chunks = K;
  Built b{std::move(*gp), staged(first, S, M, pipeline_name(sched), stages_string(*cuts)), *cuts, {}, {}};
  b.plan.micro_batches = M;
  b.machine = reshard_cluster(b.plan.world(), {}, {}, {});
  return b;
}

// Each stage on its own tp x dp mesh.
Built build_meshes(const std::vector<std::pair<int64_t, int64_t>>& meshes, int M, PipelineSchedule sched) {
  const int S = static_cast<int>(meshes.size());
  Built b = build(S, 1, M, 1, sched);  // the layout and cuts; the stages get their own programs below
  PlanningModel pm = tied_model();
  for (int s = 0; s < S; ++s) {
    auto gp = program_on(pm, meshes[static_cast<size_t>(s)].first, meshes[static_cast<size_t>(s)].second, M, "", b.cuts);
    EXPECT_TRUE(gp) << gp.status().message();
    b.stage_gp.push_back(std::make_shared<GlobalProgram>(std::move(*gp)));
    b.set_stage_ranks(s, meshes[static_cast<size_t>(s)].first * meshes[static_cast<size_t>(s)].second);
  }
  return b;
}

TEST(PipelineProgram, NodesGoToTheirBlocksStageAndTheTiedWeightToBoth) {
  Built b = build(2, 1, 2, 1, PipelineSchedule::k1F1B);
  const Graph& g = b.gp.train.graph;
  auto sa = assign_stages(g, b.gp.train.params, b.cuts, 2);
  ASSERT_TRUE(sa) << sa.status().message();
  EXPECT_EQ(sa->blocks, 4);
  int tied_holders = 0;
  for (size_t i = 0; i < b.gp.train.params.size(); ++i) {
    const std::string& name = g.value(b.gp.train.params[i]).name;
    const auto& h = sa->param_holders[i];
    ASSERT_FALSE(h.empty()) << name;
    if (h.size() == 2) {
      ++tied_holders;
      EXPECT_NE(name.find("wte"), std::string::npos) << name << " is held by two stages";
    }
    if (name.find("h.0.") != std::string::npos) {
      EXPECT_EQ(h, std::vector<int>{0}) << name;
    }
    if (name.find("h.3.") != std::string::npos) {
      EXPECT_EQ(h, std::vector<int>{1}) << name;
    }
  }
  EXPECT_EQ(tied_holders, 1);
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    ASSERT_FALSE(sa->stages[static_cast<size_t>(id)].empty()) << n.describe();
    int blk = block_of_scope(n.scope);
    if (n.phase == Node::Phase::kForward && blk >= 0) {
      EXPECT_EQ(sa->stages[static_cast<size_t>(id)], std::vector<int>{blk / 2}) << n.describe();
    }
    if (n.phase == Node::Phase::kLoss) {
      EXPECT_EQ(sa->stages[static_cast<size_t>(id)], std::vector<int>{1}) << n.describe();
    }
  }
}

// Every rank's program: its transfers (oases.Reshard) in start order, and their starts and waits as
// the channel checker sees them.
struct RankTransfers {
  std::vector<std::string> order;  // "value from>to"
  std::vector<ChannelInstr> channel;
};

void check_built_programs(const Built& b, int K, PipelineSchedule sched) {
  const int S = static_cast<int>(b.plan.num_stages()), M = static_cast<int>(b.plan.micro_batches);
  const int64_t world = b.plan.world();
  auto stage_of = [&](int64_t r) { return b.plan.stage_of_rank(r); };
  std::vector<std::vector<std::string>> listed(static_cast<size_t>(world));
  std::vector<int> stage_of_rank;
  std::map<std::string, int> ids;  // transfer -> op id shared by its participants
  std::vector<RankTransfers> ranks(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    RankProgramOptions ro;
    ro.slice_constants = false;
    StageProgramInfo info;
    auto rp = build_stage_program(b.stages(), b.plan, b.machine, r, ro, &info);
    ASSERT_TRUE(rp) << rp.status().message();
    const int s = info.stage;
    EXPECT_EQ(s, stage_of(r));
    listed[static_cast<size_t>(r)] = info.transfers;
    stage_of_rank.push_back(s);
    EXPECT_EQ(info.peak_in_flight, peak_in_flight(stage_steps(sched, s, S, M)));
    if (sched == PipelineSchedule::k1F1B) {
      EXPECT_EQ(info.peak_in_flight, std::min(M, S - s));
    }
    if (sched == PipelineSchedule::kEager1F1B) {
      EXPECT_EQ(info.peak_in_flight, std::min(M, 2 * (S - s)));
    }
    if (sched == PipelineSchedule::kZBH1) {
      EXPECT_LE(info.peak_in_flight, std::min(M, S));  // held to its W: 1F1B's first-stage peak
    }
    EXPECT_GT(info.sends + info.receives, 0);
    const Graph& g = rp->program.graph;
    // the blocks' work runs in the schedule's steps: forward and backward of each micro-batch in turn
    std::vector<PipeStep> seen;
    for (const ScheduledOp& op : rp->program.order) {
      const Node& n = g.node(op.node);
      if (op.kind != ScheduledOp::Kind::kCompute || n.chunk < 0 || block_of_scope(n.scope) < 0) continue;
      PipeStep st{n.phase == Node::Phase::kForward, n.chunk / K};
      if (seen.empty() || !(seen.back() == st)) seen.push_back(st);
    }
    // (by phase a W step is a backward of its micro-batch; a B step with nothing to send, the first
    // stage's, has no work: with W steps the blocks' steps are a subsequence of the schedule's)
    std::vector<PipeStep> expected;
    for (const PipeStep& st : info.steps) {
      PipeStep byphase{st.forward, st.micro};
      if (expected.empty() || !(expected.back() == byphase)) expected.push_back(byphase);
    }
    if (splits_backward(sched)) {
      size_t at = 0;
      for (const PipeStep& st : seen) {
        while (at < expected.size() && !(expected[at] == st)) ++at;
        EXPECT_LT(at, expected.size()) << "stage " << s << ": " << (st.forward ? "F" : "B") << st.micro << " out of the schedule's order";
        if (at < expected.size()) ++at;
      }
    } else {
      EXPECT_EQ(seen.size(), expected.size());
      for (size_t i = 0; i < seen.size() && i < expected.size(); ++i) {
        EXPECT_TRUE(seen[i] == expected[i]) << "stage " << s << " step " << i << ": ran " << (seen[i].forward ? "F" : "B") << seen[i].micro
                                            << ", the schedule says " << (expected[i].forward ? "F" : "B") << expected[i].micro;
      }
    }
    if (splits_backward(sched) && s > 0) {
      // zb-h1: each micro-batch's gradient leaves before its weight gradients are made (its W
      // follows the send), and the W step has work (the weight products)
      std::map<int, size_t> sent, last_backward, products_after;
      for (size_t i = 0; i < rp->program.order.size(); ++i) {
        const ScheduledOp& op = rp->program.order[i];
        const Node& n = g.node(op.node);
        // a gradient sent (the transfer's node names no micro-batch: the value's producer does)
        if (n.op_type == "Reshard" && op.kind == ScheduledOp::Kind::kCommStart && n.phase == Node::Phase::kBackward && n.has_input(0)) {
          NodeId made = g.producer(n.inputs[0]);
          if (made != kNoId && g.node(made).chunk >= 0 && !sent.count(g.node(made).chunk / K)) sent[g.node(made).chunk / K] = i;
        }
        if (n.chunk < 0 || n.phase != Node::Phase::kBackward) continue;
        const int m = n.chunk / K;
        (void)m;
        if (op.kind == ScheduledOp::Kind::kCompute && block_of_scope(n.scope) >= 0) last_backward[m] = i;
      }
      for (size_t i = 0; i < rp->program.order.size(); ++i) {
        const Node& n = g.node(rp->program.order[i].node);
        if (n.chunk < 0 || n.phase != Node::Phase::kBackward || block_of_scope(n.scope) < 0) continue;
        const int m = n.chunk / K;
        if (sent.count(m) && i > sent[m] && n.op_type.find("MatMul") != std::string::npos) ++products_after[m];
      }
      for (int m = 0; m < M; ++m) {
        ASSERT_TRUE(sent.count(m)) << "stage " << s << " sends no gradient of micro-batch " << m;
        EXPECT_LT(sent[m], last_backward[m]) << "stage " << s << " micro-batch " << m << ": no weight gradient after the send";
        EXPECT_GT(products_after[m], 0u) << "stage " << s << " micro-batch " << m << ": no weight product after the send";
      }
    }
    for (const ScheduledOp& op : rp->program.order) {
      const Node& n = g.node(op.node);
      if (!(n.domain == kOasesDomain && n.op_type == "Reshard")) continue;
      auto src = n.attrs.get_ints("src_ranks"), dst = n.attrs.get_ints("dst_ranks");
      std::string key = fmt::format("{} {}>{}", n.has_input(0) ? g.value(n.inputs[0]).name : g.value(n.outputs[0]).name,
                                    stage_of(src.front()), stage_of(dst.front()));
      int id = ids.emplace(key, static_cast<int>(ids.size())).first->second;
      if (op.kind == ScheduledOp::Kind::kCommStart) ranks[static_cast<size_t>(r)].order.push_back(key);
      ranks[static_cast<size_t>(r)].channel.push_back({op.kind == ScheduledOp::Kind::kCommStart, id, 1});
    }
  }
  // the transfers between two stages come in the same order on both sides
  for (int64_t a = 0; a < world; ++a) {
    for (int64_t c = 0; c < world; ++c) {
      int sa = stage_of(a), sc = stage_of(c);
      if (sa == sc) continue;
      auto between = [&](int64_t r) {
        std::vector<std::string> out;
        for (const std::string& k : ranks[static_cast<size_t>(r)].order) {
          if (k.find(fmt::format(" {}>{}", sa, sc)) != std::string::npos || k.find(fmt::format(" {}>{}", sc, sa)) != std::string::npos)
            out.push_back(k);
        }
        return out;
      };
      EXPECT_EQ(between(a), between(c)) << "ranks " << a << " and " << c;
    }
  }
  // replayed with every rank of both stages taking part in each transfer: nobody waits forever
  std::map<int, std::vector<int64_t>> who;
  for (const auto& [key, id] : ids) {
    int from = std::stoi(key.substr(key.rfind(' ') + 1)), to = std::stoi(key.substr(key.rfind('>') + 1));
    for (int s : {from, to}) {
      for (int64_t i = 0; i < b.plan.stage_ranks(s); ++i) who[id].push_back(b.plan.first_rank(s) + i);
    }
  }
  std::vector<std::vector<ChannelInstr>> programs;
  for (const auto& r : ranks) programs.push_back(r.channel);
  Status st = check_channel_programs(programs, [&](int op) { return who.at(op); });
  EXPECT_TRUE(st.is_ok()) << st.message();
  // what the ranks list of their transfers agrees, and a rank whose list differs is named
  Status agree = check_stage_transfers(stage_of_rank, listed);
  EXPECT_TRUE(agree.is_ok()) << agree.message();
  if (world > 2 && !listed.back().empty()) {
    listed.back().pop_back();
    Status off = check_stage_transfers(stage_of_rank, listed);
    ASSERT_FALSE(off.is_ok());
    EXPECT_NE(off.message().find("disagree on their transfers"), std::string::npos) << off.message();
  }
}

void check_pipeline_programs(int S, int64_t tp, int M, int K, PipelineSchedule sched, const std::string& schedule) {
  SCOPED_TRACE(fmt::format("pp {} tp {} M {} K {} {} {}", S, tp, M, K, pipeline_name(sched), schedule));
  check_built_programs(build(S, tp, M, K, sched, schedule), K, sched);
}

TEST(PipelineProgram, TransfersPairUpAndReplayWithoutDeadlock) {
  for (PipelineSchedule sched :
       {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kEager1F1B, PipelineSchedule::kZBH1}) {
    check_pipeline_programs(2, 1, 4, 1, sched, "");
    check_pipeline_programs(4, 1, 4, 1, sched, "");
    check_pipeline_programs(2, 2, 2, 2, sched, "oases");
  }
}

// zb-h1 with recomputation: a recomputed value only a W reads (the MLP's activation, for the second
// projection's weight gradient) is made in the B that reads the values it is made from, so W
// holds that one value, not its inputs, until the bubble.
TEST(PipelineProgram, ZeroBubbleRecomputesWhatOnlyWReadsInTheB) {
  Built b = build(2, 1, 2, 1, PipelineSchedule::kZBH1, "default_checkpoint");
  StageProgramInfo info;
  auto rp = b.shapes_program(1, &info);
  ASSERT_TRUE(rp) << rp.status().message();
  const Graph& g = rp->train.graph;
  std::set<ValueId> read_in_b;
  int recomputed = 0, weight = 0;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (n.phase == Node::Phase::kForward || n.phase == Node::Phase::kLoss || info.weight_nodes.count(n.name)) continue;
    for (ValueId v : n.inputs) read_in_b.insert(v);
  }
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (n.phase != Node::Phase::kRecompute) continue;
    ++recomputed;
    weight += info.weight_nodes.count(n.name) > 0;
    bool b_inputs = false;
    for (ValueId v : n.inputs) b_inputs = b_inputs || (v != kNoId && read_in_b.count(v));
    EXPECT_FALSE(b_inputs && info.weight_nodes.count(n.name)) << n.describe() << " reads what the B reads but runs in W";
  }
  EXPECT_GT(recomputed, 0);
  EXPECT_GT(info.weight_nodes.size(), 0u);
}

// The MLP's second product's weight gradient (it reads the activation's output) runs before the
// activation's backward of its micro-batch under the interleaved schedules, on every stage: by node
// number alone it came after it on the last stage (whose graph numbers the weight gradients last),
// which held the activation's output across that backward (LLaMA: SwiGLU's product, pp 4 last
// stage arena 5.7 -> 5.0 MiB).
TEST(PipelineProgram, WeightGradientsFreeTheActivationBeforeItsBackward) {
  for (const char* schedule : {"oases", "overlap_checkpoint"}) {
    SCOPED_TRACE(schedule);
    Built b = build(2, 1, 2, 1, PipelineSchedule::k1F1B, schedule);
    for (int64_t rank : {0, 1}) {
      StageProgramInfo info;
      auto rp = b.shapes_program(rank, &info);
      ASSERT_TRUE(rp) << rp.status().message();
      const Graph& g = rp->train.graph;
      std::map<std::pair<std::string, int>, size_t> weight_at, activation_at;  // (block's MLP scope, chunk)
      for (size_t i = 0; i < rp->order.size(); ++i) {
        const Node& n = g.node(rp->order[i].node);
        const size_t mlp = n.name.find("/mlp/");
        if (n.phase != Node::Phase::kBackward || mlp == std::string::npos) continue;
        const std::pair<std::string, int> key{n.name.substr(0, mlp), n.chunk};
        const bool weight = n.op_type == "MatMulT" && n.name.find("/mlp/c_proj/") != std::string::npos &&
                            g.uses(n.outputs[0]).size() == 1 && g.node(g.uses(n.outputs[0])[0].node).chunk < 0;
        if (weight) weight_at[key] = i;
        if (n.op_type == "GeluGrad") activation_at[key] = i;
      }
      EXPECT_EQ(weight_at.size(), activation_at.size()) << "rank " << rank;
      EXPECT_FALSE(weight_at.empty()) << "rank " << rank;
      for (const auto& [key, i] : weight_at) {
        auto it = activation_at.find(key);
        ASSERT_NE(it, activation_at.end()) << key.first;
        EXPECT_LT(i, it->second) << "rank " << rank << " " << key.first << " chunk " << key.second;
      }
    }
  }
}

// The oases schedule moves the last block's recomputation ahead to hide the head's all-reduce
// behind it. A stage's transfers are no such collective: the last stage of an interleaved pipeline
// (2 virtual stages) received its first range's gradient at the top of the step, and the last
// block's recomputation moved up to that step ran ahead of the loss's backward, holding its
// activations across the head's (llama_4l pp 2 V 2 oases, last stage 7.5 -> 6.8 MiB).
TEST(PipelineProgram, TransfersDrawNoRecomputationAheadOfTheLoss) {
  PlanningModel pm = train_model("llama_4l", 8);  // untied: the last stage's steps start no exchange
  const int S = 2, V = 2, M = 2;
  auto cuts = cut_stages(count_blocks(pm.forward), S * V);
  ASSERT_TRUE(cuts) << cuts.status().message();
  auto gp = program_on(pm, 1, 1, M, "oases", *cuts);
  ASSERT_TRUE(gp) << gp.status().message();
  Plan first = Plan::megatron(1, 1);
  first.mesh().schedule = "oases";
  first.mesh().chunks = 1;
  auto plan = with_stages(first, S, M, "1f1b", stages_string(*cuts), {}, V);
  ASSERT_TRUE(plan) << plan.status().message();
  Built b{std::move(*gp), std::move(*plan), *cuts, {}, {}};
  b.machine = reshard_cluster(b.plan.world(), {}, {}, {});
  StageProgramInfo info;
  auto rp = b.shapes_program(S - 1, &info);
  ASSERT_TRUE(rp) << rp.status().message();
  const Graph& g = rp->train.graph;
  std::map<int, size_t> loss_grad_at, first_recompute_at;  // by micro-batch
  for (size_t i = 0; i < rp->order.size(); ++i) {
    const Node& n = g.node(rp->order[i].node);
    if (n.chunk < 0) continue;
    if (n.op_type == "SoftmaxCrossEntropyGrad") loss_grad_at[n.chunk] = i;
    if (n.phase == Node::Phase::kRecompute && !first_recompute_at.count(n.chunk)) first_recompute_at[n.chunk] = i;
  }
  ASSERT_EQ(loss_grad_at.size(), static_cast<size_t>(M));
  ASSERT_EQ(first_recompute_at.size(), static_cast<size_t>(M));
  for (const auto& [m, at] : loss_grad_at) EXPECT_LT(at, first_recompute_at[m]) << "micro-batch " << m;
}

// Data parallelism inside the stages: each stage buckets its own gradients' all-reduces (a bucket
// joining two stages would have one wait for the other), and the tied weight's gradient from the
// head crosses whole (reduced over dp on the last stage) into the embedding's stage.
TEST(PipelineProgram, DataParallelStagesBucketTheirOwnGradients) {
  Built b = build_meshes({{1, 2}, {1, 2}}, 2, PipelineSchedule::k1F1B);
  RankProgramOptions ro;
  ro.slice_constants = false;
  for (int64_t r = 0; r < b.plan.world(); ++r) {
    StageProgramInfo info;
    auto rp = build_stage_program(b.stages(), b.plan, b.machine, r, ro, &info);
    ASSERT_TRUE(rp) << rp.status().message();
    const Graph& g = rp->program.graph;
    int buckets = 0, whole_markers = 0;
    for (NodeId id : g.nodes()) {
      const Node& n = g.node(id);
      whole_markers += n.op_type == "Whole";
      if (n.op_type != "AllReduce" || n.inputs.size() < 2) continue;
      ++buckets;
      for (ValueId v : n.inputs) {
        NodeId p = g.producer(v);
        ASSERT_NE(p, kNoId) << n.describe();
        EXPECT_NE(g.node(p).op_type, "Reshard") << n.describe() << " waits for another stage's gradient";
      }
    }
    EXPECT_GT(buckets, 0) << "rank " << r;
    EXPECT_EQ(whole_markers, 0) << "the partitioner dissolves every marker";
  }
}

// The tied embedding's gradient on the first stage of dp 2: every micro-batch's gradient is summed
// first and the sum all-reduced once, the head's share (sent by the last stage once all its
// micro-batches ran) added last; each micro-batch's gradient reduced on its own, and all of them
// held until the head's share came, made the first stage's peak 3x its need (h128 x 4, vocab
// 16384, pp 2: 75.7 MiB, 25.8 after).
TEST(PipelineProgram, TiedGradientIsSummedOverMicroBatchesBeforeItsReduction) {
  Built b = build_meshes({{1, 2}, {1, 2}}, 4, PipelineSchedule::k1F1B);
  StageProgramInfo info;
  auto rp = b.shapes_program(0, &info);
  ASSERT_TRUE(rp) << rp.status().message();
  const Graph& g = rp->program.graph;
  int reductions = 0;  // all-reduces of the word embedding's gradient (or of a part of it)
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (n.op_type != "AllReduce") continue;
    for (ValueId v : n.inputs) {
      if (g.value(v).name.find("wte") != std::string::npos) {
        ++reductions;
        break;
      }
    }
  }
  EXPECT_EQ(reductions, 1) << "each micro-batch's embedding gradient all-reduced before the sum";
  EXPECT_GE(info.sends, 1);
}

// Stages on meshes of other shapes: the transfers carry each side's layout and mesh, pair up and
// replay without deadlock.
TEST(PipelineProgram, StagesOnTheirOwnMeshes) {
  for (PipelineSchedule sched : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kEager1F1B}) {
    SCOPED_TRACE(pipeline_name(sched));
    Built b = build_meshes({{2, 1}, {1, 2}}, 2, sched);
    EXPECT_EQ(b.plan.world(), 4);
    check_built_programs(b, 1, sched);
    check_built_programs(build_meshes({{1, 1}, {2, 2}, {1, 2}, {2, 1}}, 4, sched), 1, sched);
  }
  // a transfer from the tp 2 stage to the dp 2 stage: its source laid out on a 2-rank tp mesh,
  // its destination on the other stage's ranks
  Built b = build_meshes({{2, 1}, {1, 2}}, 2, PipelineSchedule::k1F1B);
  StageProgramInfo info;
  auto rp = b.shapes_program(2, &info);
  ASSERT_TRUE(rp) << rp.status().message();
  EXPECT_EQ(info.stage, 1);
  int seen = 0;
  for (NodeId id : rp->program.graph.nodes()) {
    const Node& n = rp->program.graph.node(id);
    if (n.op_type != "Reshard") continue;
    ++seen;
    auto src = n.attrs.get_ints("src_ranks"), dst = n.attrs.get_ints("dst_ranks");
    bool from0 = src == std::vector<int64_t>{0, 1};
    EXPECT_EQ(from0 ? dst : src, (std::vector<int64_t>{2, 3})) << n.describe();
  }
  EXPECT_GT(seen, 0);
}

TEST(PipelineProgram, ErrorsNameTheProblem) {
  Built b = build(2, 1, 2, 1, PipelineSchedule::k1F1B);
  StageProgramInfo info;
  auto bad_rank = build_stage_program(b.gp, b.plan, b.machine, 5, RankProgramOptions{}, &info);
  ASSERT_FALSE(bad_rank);
  EXPECT_NE(bad_rank.status().message().find("world rank 5"), std::string::npos) << bad_rank.status().message();
  for (int64_t s = 0; s < b.plan.num_stages(); ++s) b.set_stage_ranks(s, 2);
  auto bad_mesh = build_stage_program(b.gp, b.plan, b.machine, 0, RankProgramOptions{}, &info);
  ASSERT_FALSE(bad_mesh);
  EXPECT_NE(bad_mesh.status().message().find("partitioned over 1 ranks"), std::string::npos) << bad_mesh.status().message();
}

// oases-train's stage programs: stages whose (tp, dp, schedule) agree share one program (the
// first stage's mesh: the first program itself), the cuts are the ones asked for, and every
// program holds all micro-batches' chunks.
TEST(PipelineProgram, StageGlobalsShareTheProgramsOfEqualMeshes) {
  PlanningModel pm = tied_model();
  Plan plan = Plan::megatron(1, 1);
  auto sg =
      build_stage_globals(pm.forward, TrainingSpec{}, staged(plan, 4, 2, "eager-1f1b", "", "1x1,2x1,1x1,2x1"), GlobalProgramOptions{});
  ASSERT_TRUE(sg) << sg.status().message();
  ASSERT_EQ(sg->own.size(), 4u);
  EXPECT_EQ(sg->own[0], nullptr);
  EXPECT_EQ(sg->own[2], nullptr);
  ASSERT_NE(sg->own[1], nullptr);
  EXPECT_EQ(sg->own[1], sg->own[3]);
  EXPECT_EQ(&sg->program(2), &sg->first);
  EXPECT_EQ(sg->program(3).world, 2);
  EXPECT_EQ(sg->programs(), (std::vector<const GlobalProgram*>{&sg->first, sg->own[1].get(), &sg->first, sg->own[1].get()}));
  EXPECT_EQ(sg->first.plan.mesh().chunks, 2);
  EXPECT_EQ(sg->program(1).plan.mesh().chunks, 2);
  // the plan resolved: each stage's blocks and ranks, the micro-batches; the machine of its world
  const Plan& pl = sg->plan;
  EXPECT_EQ(pl.cuts(), "0-0,1-1,2-2,3-3");
  EXPECT_EQ(stages_string(stage_cuts_of(pl).value()), "0-0,1-1,2-2,3-3");
  EXPECT_EQ((std::vector<int64_t>{pl.stage_ranks(0), pl.stage_ranks(1), pl.stage_ranks(2), pl.stage_ranks(3)}),
            (std::vector<int64_t>{1, 2, 1, 2}));
  EXPECT_EQ(pl.world(), 6);
  EXPECT_EQ(pl.first_rank(3), 4);
  EXPECT_EQ(pl.stage_of_rank(2), 1);
  EXPECT_EQ(pl.stage_of_rank(6), -1);
  EXPECT_EQ(pl.micro_batches, 2);
  EXPECT_EQ(pl.mesh().chunk_count(), 1);
  EXPECT_EQ(pl.pipeline, "eager-1f1b");
  EXPECT_EQ(sg->machine.world(), 6);

  // another schedule is another program; the cuts are the ones given; no stage meshes: one program
  sg = build_stage_globals(pm.forward, TrainingSpec{}, staged(plan, 3, 2, "1f1b", "0-1,2-2,3-3", "1x1,2x1,2x1:default_checkpoint"),
                           GlobalProgramOptions{});
  ASSERT_TRUE(sg) << sg.status().message();
  EXPECT_EQ(sg->plan.cuts(), "0-1,2-2,3-3");
  ASSERT_NE(sg->own[2], nullptr);
  EXPECT_NE(sg->own[2], sg->own[1]);
  EXPECT_EQ(sg->own[2]->plan.mesh().schedule, "default_checkpoint");
  sg = build_stage_globals(pm.forward, TrainingSpec{}, staged(plan, 3, 2, "1f1b", "0-1,2-2,3-3"), GlobalProgramOptions{});
  ASSERT_TRUE(sg) << sg.status().message();
  EXPECT_TRUE(sg->own.empty());
  EXPECT_EQ(sg->plan.world(), 3);

  // errors: cuts that leave a block out, a schedule that is none, a model without blocks
  EXPECT_FALSE(build_stage_globals(pm.forward, TrainingSpec{}, staged(plan, 3, 2, "1f1b", "0-1,3-3,3-3"), GlobalProgramOptions{}));
  EXPECT_FALSE(build_stage_globals(pm.forward, TrainingSpec{}, staged(plan, 3, 2, "zigzag"), GlobalProgramOptions{}));
  Graph flat = pm.forward;
  for (NodeId id : flat.nodes()) flat.node(id).scope.clear();
  GlobalProgramOptions named;
  named.model_path = "m.onnx";
  auto none = build_stage_globals(flat, TrainingSpec{}, staged(plan, 2, 2, "1f1b"), named);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().message(), "m.onnx: no transformer blocks found; pipeline stages are cut at block boundaries");
}

// oases-plan --simulate for a pipeline: every stage's program (as oases-train builds it) replayed
// by the one-rank simulator, its Reshards priced by their build-time transfer plans on the
// cluster's links, the pipeline simulator composing the replays.
TEST(PipelineReplay, StageProgramsAreReplayedAndComposed) {
  PlanningModel pm = tied_model(32);
  auto cluster = load_cluster_file(std::string(OASES_SOURCE_DIR) + "/clusters/rtx3090_pcie_32.json");
  ASSERT_TRUE(cluster) << cluster.status().message();
  OpTimeModel ops = op_time_model(*cluster, nullptr);
  Plan plan = Plan::megatron(2, 1);
  auto sg = build_stage_globals(pm.forward, TrainingSpec{}, staged(plan, 2, 4, "1f1b"), GlobalProgramOptions{});
  ASSERT_TRUE(sg) << sg.status().message();
  auto r = replay_pipeline(*sg, *cluster, ops, nullptr);
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ(r->stages.size(), 2u);
  double other = 0, optimizer = 0;
  for (const StageReplay& st : r->stages) {
    EXPECT_EQ(st.world_rank, st.stage * 2);
    EXPECT_GT(st.forward_s, 0);
    EXPECT_GT(st.backward_s, 0);
    EXPECT_GT(st.optimizer_s, 0);
    EXPECT_GT(st.memory_bytes, 3.0 * 4 * 64 * 64);  // at least a block's weights and moments (fp32, hidden 64)
    // the replay's compute thread time is accounted for whole: 4 micro-batches' steps and the rest
    EXPECT_NEAR(4 * (st.forward_s + st.backward_s) + st.other_s, st.sim.step_s - st.sim.optimizer_s, 1e-12);
    other = std::max(other, st.other_s);
    optimizer = std::max(optimizer, st.optimizer_s);
  }
  // the activation crossing the boundary: [32 / 4 micro-batches, 16, 64] fp32 moved between two
  // tp 2 meshes over the cluster's PCIe at no less than bytes / bandwidth
  ASSERT_EQ(r->times.transfer_s.size(), 1u);
  const double bytes = 8.0 * 16 * 64 * 4;
  EXPECT_GE(r->times.transfer_s[0], bytes / (cluster->intra.bandwidth_gbps * 1e9));
  EXPECT_LT(r->times.transfer_s[0], 1e-3);
  // the tied table's gradient [V, H] fp32 goes from the head's stage to the embedding's and its
  // sum back, once a step (not per micro-batch): each card of either tp 2 mesh takes its half of
  // the rows each way
  auto an = analyze_model(pm.forward, pm.train.graph, pm.train.params, 2);
  ASSERT_TRUE(an) << an.status().message();
  const double table = static_cast<double>(an->vocab) * 64 * 4;
  EXPECT_GE(r->exchange_s, table / (cluster->intra.bandwidth_gbps * 1e9));
  auto again = simulate_pipeline(PipelineSchedule::k1F1B, 4, r->times);
  ASSERT_TRUE(again);
  EXPECT_DOUBLE_EQ(r->step_s, again->step_s + other + r->exchange_s + optimizer);
  // 1F1B over 2 stages: at least every micro-batch of the slower stage, plus the other stage's
  // first forward and last backward
  const auto& a = r->stages[0];
  const auto& b = r->stages[1];
  EXPECT_GE(r->sim.step_s + 1e-12, 4 * std::max(a.forward_s + a.backward_s, b.forward_s + b.backward_s));
}

TEST(PipelineSearch, PlansStagesOnAClusterAndPricesAGivenPipeline) {
  PlanningModel pm = tied_model(32);
  auto cluster = load_cluster_file(std::string(OASES_SOURCE_DIR) + "/clusters/a100_dgx_64.json");
  ASSERT_TRUE(cluster) << cluster.status().message();
  cluster->nodes = 2;  // 16 GPUs on 2 hosts
  OpTimeModel ops = op_time_model(*cluster, nullptr);
  PipelinePlanOptions o;
  o.memory_limit = 80.0 * (1 << 30);
  auto p = search_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, o);
  ASSERT_TRUE(p) << p.status().message();
  ASSERT_TRUE(p->found) << p->why;
  EXPECT_GE(p->stages, 2);
  EXPECT_EQ(p->stages * p->stage_ranks, 16);
  EXPECT_TRUE(p->stage_ranks % 8 == 0 || 8 % p->stage_ranks == 0) << "stage meshes line up with the hosts";
  EXPECT_EQ(p->micro_batches % p->stages, 0);
  ASSERT_EQ(static_cast<int>(p->stage.size()), p->stages);
  int next = 0;
  for (const auto& st : p->stage) {  // every block once, in order
    EXPECT_EQ(st.ranges.front().first, next);
    next = st.ranges.front().last + 1;
    EXPECT_GT(st.forward_s, 0);
    EXPECT_GT(st.backward_s, 0);
    EXPECT_LE(st.memory_bytes, o.memory_limit);
  }
  EXPECT_EQ(next, 4);
  EXPECT_TRUE(p->stage.front().embedding && p->stage.back().head);
  EXPECT_GT(p->step_s, 0);
  EXPECT_GE(p->bubble, 0);
  EXPECT_EQ(static_cast<int>(p->transfer_s.size()), p->stages - 1);
  auto j = pipeline_plan_json(*p);
  EXPECT_EQ(j["stages"], p->stages);
  EXPECT_FALSE(j["timeline"].empty());
  // the search's answer is a Plan: its stages with their blocks and meshes, valid as it stands
  const Plan& plan = p->plan;
  ASSERT_EQ(plan.num_stages(), p->stages);
  EXPECT_EQ(plan.world(), 16);
  EXPECT_EQ(plan.micro_batches, p->micro_batches);
  EXPECT_EQ(plan.pipeline, pipeline_name(p->schedule));
  EXPECT_EQ(stages_string(stage_cuts_of(plan).value()), j["cuts"].get<std::string>());
  EXPECT_TRUE(plan.validate().is_ok()) << plan.validate().message();
  EXPECT_FALSE(p->inner_layouts.empty());
  // a given pipeline, priced the same way: more micro-batches, a smaller bubble
  auto few = price_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, 2, 4, 2, PipelineSchedule::k1F1B, "plain");
  auto many = price_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, 2, 4, 8, PipelineSchedule::k1F1B, "plain");
  ASSERT_TRUE(few && many) << (few ? many.status().message() : few.status().message());
  EXPECT_LT(many->bubble, few->bubble);
  EXPECT_EQ(many->plan.num_stages(), 2);
  EXPECT_EQ(many->plan.mesh().tp, 4);
  auto bad = price_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, 3, 4, 2, PipelineSchedule::k1F1B, "plain");
  EXPECT_FALSE(bad);
  // zb-h1 prices each stage's W as its weight-gradient nodes' time: the first stage (it sends no
  // gradient) all of its backward, a later one less than half of it (its weight products' input
  // gradients cost as much again, and attention's and the norms' backward are input gradients), and
  // a schedule that does not split the backward none
  auto zb = price_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, 2, 4, 8, PipelineSchedule::kZBH1, "plain");
  ASSERT_TRUE(zb) << zb.status().message();
  EXPECT_DOUBLE_EQ(zb->stage[0].weight_s, zb->stage[0].backward_s);
  EXPECT_GT(zb->stage[1].weight_s, 0.25 * zb->stage[1].backward_s);
  EXPECT_LT(zb->stage[1].weight_s, 0.5 * zb->stage[1].backward_s);
  EXPECT_EQ(many->stage[1].weight_s, 0);
  EXPECT_LT(zb->bubble, many->bubble);
  // with 2 virtual stages a stage (4 blocks: one range each): a smaller bubble, its ranges in the
  // plan, the peak in flight counted in range steps; 3 virtual stages need 6 blocks
  auto v2 =
      price_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, 2, 4, 2, PipelineSchedule::k1F1B, "plain", false, 2);
  ASSERT_TRUE(v2) << v2.status().message();
  EXPECT_LT(v2->bubble, few->bubble);
  EXPECT_EQ(v2->virtual_stages, 2);
  EXPECT_EQ(v2->transfer_s.size(), 3u);
  EXPECT_EQ(v2->plan.virtual_stages, 2);
  EXPECT_EQ(v2->plan.stages[0].blocks, "0-0,2-2");
  EXPECT_EQ(v2->plan.stages[1].blocks, "1-1,3-3");
  EXPECT_EQ(v2->stage[0].peak_in_flight, 4);  // w = 2 (S - 1) + (V - 1) S = 4 = M V: all of them
  EXPECT_TRUE(v2->plan.validate().is_ok()) << v2->plan.validate().message();
  EXPECT_NE(describe_pipeline(*v2).find("x 2 virtual stages"), std::string::npos) << describe_pipeline(*v2);
  auto v3 =
      price_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, 2, 4, 2, PipelineSchedule::k1F1B, "plain", false, 3);
  ASSERT_FALSE(v3);
  EXPECT_NE(v3.status().message().find("need 6 block ranges"), std::string::npos) << v3.status().message();
}

// The pipeline search prices the transfers the stage programs make: per boundary the activation of
// one micro-batch between the two stages' layouts where the boundary lies among the hosts, and a
// tied table's gradient exchange once a step, each as the program's build-time transfer plan
// predicts it. A stage of its own tp runs the layout it was priced in (sequence parallelism kept).
// With --simulate the search's runners-up are replayed too and the fastest whose programs fit wins.
TEST(PipelineSearch, TransfersArePricedAsTheStageProgramsMakeThemAndReplaysRankTheCandidates) {
  PlanningModel pm = tied_model(32);
  auto cluster = load_cluster_file(std::string(OASES_SOURCE_DIR) + "/clusters/a100_dgx_64.json");
  ASSERT_TRUE(cluster) << cluster.status().message();
  cluster->nodes = 2;  // 2 hosts of 8: with 4 stages of 4 the middle boundary crosses hosts
  OpTimeModel ops = op_time_model(*cluster, nullptr);
  PipelinePlanOptions o;
  o.stage_counts = {2, 4};
  o.inner.schedules = {"plain"};
  o.keep = 3;
  auto p = search_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, o);
  ASSERT_TRUE(p && p->found) << (p ? p->why : p.status().message());
  ASSERT_EQ(p->runners_up.size(), 2u);
  EXPECT_LE(p->step_s, p->runners_up[0].step_s);
  EXPECT_LE(p->runners_up[0].step_s, p->runners_up[1].step_s);
  EXPECT_GT(p->exchange_s, 0);
  for (const PipelinePlan* c : {&*p, &p->runners_up[0], &p->runners_up[1]}) {
    auto r = replay_pipeline(pm.forward, "gpt2_4l", c->plan, *cluster, ops, nullptr);
    ASSERT_TRUE(r) << r.status().message();
    ASSERT_EQ(r->times.transfer_s.size(), c->transfer_s.size()) << describe_pipeline(*c);
    for (size_t k = 0; k < c->transfer_s.size(); ++k)
      EXPECT_NEAR(r->times.transfer_s[k], c->transfer_s[k], 1e-9) << "boundary " << k << " of " << describe_pipeline(*c);
    EXPECT_NEAR(r->exchange_s, c->exchange_s, 1e-9) << describe_pipeline(*c);
  }
  // the same model on 4 stages of 2: the boundary between hosts is the slow one
  o.stage_counts = {4};
  o.keep = 1;
  auto four = search_pipeline(pm.forward, pm.train.graph, pm.train.params, *cluster, ops, 16, o);
  ASSERT_TRUE(four && four->found) << (four ? four->why : four.status().message());
  ASSERT_EQ(four->transfer_s.size(), 3u);
  EXPECT_GT(four->transfer_s[1], 2 * four->transfer_s[0]);
  EXPECT_DOUBLE_EQ(four->transfer_s[0], four->transfer_s[2]);

  // re-ranked by replay: the fastest replayed step among those that fit, the search's choice first
  auto ranked = rank_pipelines_by_replay(pm.forward, "gpt2_4l", *p, 0, *cluster, ops, nullptr);
  ASSERT_TRUE(ranked) << ranked.status().message();
  ASSERT_EQ(ranked->tried.size(), 3u);
  EXPECT_DOUBLE_EQ(ranked->tried.front().step_s, p->step_s);
  for (const PipelineReplay& r : ranked->replays) EXPECT_GE(r.step_s, ranked->replays[ranked->best].step_s);
  EXPECT_FALSE(ranked->none_fits);
  // under a limit the smallest does not meet, none fits: the search's choice stays, said so
  double least = ranked->memory_bytes.front();
  for (double m : ranked->memory_bytes) least = std::min(least, m);
  auto none = rank_pipelines_by_replay(pm.forward, "gpt2_4l", *p, least / 2, *cluster, ops, nullptr);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->none_fits);
  EXPECT_EQ(none->best, 0u);
  EXPECT_NE(none->text.find("no pipeline candidate's programs fit"), std::string::npos) << none->text;
  // a limit only the smallest meets: it wins
  auto tight = rank_pipelines_by_replay(pm.forward, "gpt2_4l", *p, least, *cluster, ops, nullptr);
  ASSERT_TRUE(tight);
  EXPECT_DOUBLE_EQ(tight->memory_bytes[tight->best], least);
}

// A plan is a list of stages: version 4 files write them and read them back; version 3 files (one
// "pipeline" object of S stages sharing the plan's mesh, or naming each stage's tp x dp) still load
// into the same stages.
// Virtual stages in a plan file: each stage lists its V ranges, cuts() gives them in model order,
// the file round-trips, and a stage short of ranges, another schedule or micro-batches off the
// stages are refused naming the field.
TEST(PipelinePlanFile, VirtualStagesRoundTripAndAreChecked) {
  Plan p = with_stages(Plan::megatron(1, 1), 2, 4, "1f1b", "0-0,1-1,2-2,3-3", {}, 2).value();
  EXPECT_EQ(p.stages[0].blocks, "0-0,2-2");
  EXPECT_EQ(p.stages[1].blocks, "1-1,3-3");
  EXPECT_EQ(p.cuts(), "0-0,1-1,2-2,3-3");
  EXPECT_EQ(p.model_stages(), 4);
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().message();
  nlohmann::json j = p.to_json();
  EXPECT_EQ(j["pipeline"]["virtual_stages"], 2);
  auto back = Plan::from_json(j, "v.json");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->virtual_stages, 2);
  EXPECT_EQ(back->to_json(), j);
  EXPECT_EQ(stages_string(stage_cuts_of(*back).value()), "0-0,1-1,2-2,3-3");
  EXPECT_NE(p.to_string().find("2 stages x 2 virtual"), std::string::npos) << p.to_string();
  nlohmann::json short_stage = j;
  short_stage["pipeline"]["stages"][1]["blocks"] = "1-3";
  auto bad = Plan::from_json(short_stage, "short.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("pipeline.stages[1].blocks: '1-3' names 1 block range(s); each stage names 2"), std::string::npos)
      << bad.status().message();
  nlohmann::json zb = j;
  zb["pipeline"]["schedule"] = "zb-h1";
  bad = Plan::from_json(zb, "zb.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("interleaved 1f1b schedule, not zb-h1"), std::string::npos) << bad.status().message();
  nlohmann::json odd = j;
  odd["pipeline"]["micro_batches"] = 3;
  EXPECT_FALSE(Plan::from_json(odd, "odd.json"));
  EXPECT_FALSE(with_stages(Plan::megatron(1, 1), 2, 4, "1f1b", "0-1,2-3", {}, 2));
}

TEST(PipelinePlanFile, VersionFourRoundTripsAndVersionThreeStillLoads) {
  Plan p = staged(Plan::megatron(2, 1), 4, 8, "eager-1f1b", "0-0,1-1,2-2,3-3");
  nlohmann::json j = p.to_json();
  EXPECT_EQ(j["version"], kPlanVersionStages);
  ASSERT_TRUE(j["pipeline"]["stages"].is_array());
  EXPECT_EQ(j["pipeline"]["stages"].size(), 4u);
  auto back = Plan::from_json(j, "plan.json");
  ASSERT_TRUE(back) << back.status().message();
  Plan q = *back;
  for (size_t k = 0; k < q.stages.size(); ++k) q.stages[k].mesh = p.stages[k].mesh;  // a file's mesh comes back as axes
  EXPECT_TRUE(q == p) << q.to_string() << " vs " << p.to_string();
  EXPECT_EQ(back->to_json(), j);
  EXPECT_EQ(back->cuts(), "0-0,1-1,2-2,3-3");
  // a later stage of its own layouts (every part tp 2 with sequence parallelism) writes them and
  // reads them back; a part off the stage's tp is refused naming it
  Plan own = staged(Plan::megatron(2, 2), 2, 4, "1f1b", "0-1,2-3", "2x2,4x1");
  for (const char* part : {"embedding", "layer.0.attn", "head"}) own.stages[1].parts.push_back(PartLayout{part, Layout{4, true}});
  own.stages[1].ranks = 4;
  nlohmann::json oj = own.to_json();
  ASSERT_TRUE(oj["pipeline"]["stages"][1].contains("parts")) << oj.dump();
  EXPECT_FALSE(oj["pipeline"]["stages"][0].contains("parts"));
  auto own_back = Plan::from_json(oj, "own.json");
  ASSERT_TRUE(own_back) << own_back.status().message();
  EXPECT_EQ(own_back->stages[1].parts, own.stages[1].parts);
  EXPECT_EQ(own_back->to_json(), oj);
  oj["pipeline"]["stages"][1]["parts"][2]["tp"] = 2;
  oj["pipeline"]["stages"][1]["parts"][2].erase("dp");
  auto off = Plan::from_json(oj, "off.json");
  ASSERT_FALSE(off);
  EXPECT_EQ(off.status().message(), "off.json: pipeline.stages[1].parts[2].tp: 2, the stage's tp is 4 (a stage's parts share its tp)");
  auto old = Plan::from_json(Plan::megatron(2, 1).to_json(), "old.json");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->num_stages(), 1);
  nlohmann::json future = j;
  future["version"] = kPlanVersionStages + 1;
  EXPECT_FALSE(Plan::from_json(future, "future.json"));

  // version 3: the same pipeline as an object of counts and cuts
  nlohmann::json v3 = Plan::megatron(2, 1).to_json();
  v3["version"] = kPlanVersionPipeline;
  v3["pipeline"] = {{"stages", 4}, {"micro_batches", 8}, {"cuts", "0-0,1-1,2-2,3-3"}, {"schedule", "eager-1f1b"}};
  auto three = Plan::from_json(v3, "v3.json");
  ASSERT_TRUE(three) << three.status().message();
  EXPECT_EQ(three->to_json(), j);
  // version 3 with each stage's own mesh: stages on the first's keep its layout, others Megatron's
  v3["pipeline"]["meshes"] = {
      {{"tp", 2}, {"dp", 1}}, {{"tp", 1}, {"dp", 2}}, {{"tp", 2}, {"dp", 1}}, {{"tp", 2}, {"dp", 2}, {"schedule", "plain"}}};
  auto meshes = Plan::from_json(v3, "meshes.json");
  ASSERT_TRUE(meshes) << meshes.status().message();
  EXPECT_EQ(stage_meshes_string(meshes->stages), "2x1,1x2,2x1,2x2:plain");
  EXPECT_TRUE(same_stage_layout(meshes->stages[2], meshes->stages[0]));
  EXPECT_FALSE(same_stage_layout(meshes->stages[1], meshes->stages[0]));
  auto again = Plan::from_json(meshes->to_json(), "meshes4.json");
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->to_json(), meshes->to_json());
  EXPECT_EQ(stage_meshes_string(again->stages), "2x1,1x2,2x1,2x2:plain");
  nlohmann::json short_list = v3;
  short_list["pipeline"]["meshes"].erase(3);
  auto bad = Plan::from_json(short_list, "short.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("one mesh per stage"), std::string::npos) << bad.status().message();
  // a version 4 stage after the first without its mesh, a first stage that is not the plan's
  nlohmann::json no_mesh = j;
  no_mesh["pipeline"]["stages"][2].erase("tp");
  bad = Plan::from_json(no_mesh, "no_mesh.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("pipeline.stages[2]"), std::string::npos) << bad.status().message();
  nlohmann::json other_first = j;
  other_first["pipeline"]["stages"][0]["tp"] = 1;
  EXPECT_FALSE(Plan::from_json(other_first, "first.json"));
  nlohmann::json half_cut = j;
  half_cut["pipeline"]["stages"][1].erase("blocks");
  bad = Plan::from_json(half_cut, "half.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("every stage names its blocks"), std::string::npos) << bad.status().message();

  // per-part layouts (mixed sequence parallelism: no single tp) on every stage: later stages run
  // the first's mesh, written without a tp x dp of their own and read back as such
  nlohmann::json mixed = nlohmann::json::parse(R"({"format": "oases-plan", "version": 3,
      "mesh": {"axes": ["dp", "tp"], "sizes": [2, 2], "ranks": 4}, "batch": 16, "seq": 32, "schedule": {"name": "oases", "chunks": 2},
      "parts": [{"part": "embedding", "tp": 2, "dp": 2}, {"part": "layer.0.attn", "tp": 2, "sequence_parallel": true}],
      "pipeline": {"stages": 2, "micro_batches": 2, "cuts": "0-0,1-3", "schedule": "1f1b"}})");
  auto parts = Plan::from_json(mixed, "parts.json");
  ASSERT_TRUE(parts) << parts.status().message();
  EXPECT_EQ(parts->mesh().tp, 0);
  EXPECT_TRUE(same_stage_layout(parts->stages[1], parts->stages[0]));
  auto parts4 = Plan::from_json(parts->to_json(), "parts4.json");
  ASSERT_TRUE(parts4) << parts4.status().message();
  EXPECT_EQ(parts4->to_json(), parts->to_json());
  EXPECT_FALSE(parts->to_json()["pipeline"]["stages"][1].contains("tp"));

  auto parsed = parse_stage_meshes("2x1:oases,1x2,1x1,2x2:plain", 4);
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(stage_meshes_string(*parsed), "2x1:oases,1x2,1x1,2x2:plain");
  EXPECT_EQ((*parsed)[3].ranks, 4);
  EXPECT_FALSE(parse_stage_meshes("2x1,0x2,1x1,1x1", 4));
  EXPECT_FALSE(parse_stage_meshes("2x1,1x2", 4));
  EXPECT_FALSE(parse_stage_meshes("2x1,,1x1,1x1", 4));
  EXPECT_FALSE(parse_stage_meshes("99999999999999999999x1,1x1,1x1,1x1", 4));
}

}  // namespace
}  // namespace oases
