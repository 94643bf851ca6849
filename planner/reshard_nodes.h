// oases.Reshard nodes in programs (graph/ops/collectives.cpp): their transfer plans are made by the
// planner when it builds a program, never inside the kernel.
//
// A PlannedReshard is what a Reshard node does on every rank: the problem (each side's
// ShardingSpec on its placed mesh, the value's shape and element size), the cluster the sender
// choice and global order were made for (hosts and their links, from the plan's machine), and the
// plan itself (planner/reshard.h). The program keeps one per Reshard node, by node name
// (ProgramLayout::reshards); the executor hands it to the node's kernel. Problems that recur
// (a pipeline sends the same layout every micro-batch) share one plan.
//
// The node's attributes describe the same problem for the op's shape and gradient rules and for
// people reading a dump (reshard_attrs writes them from a problem); a program built by hand (tests,
// examples) is planned from them by plan_reshards.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "graph/graph.h"
#include "planner/cluster_spec.h"
#include "planner/reshard.h"

namespace oases {

struct PlannedReshard {
  ReshardProblem problem;
  ReshardCluster cluster;
  ReshardPlan plan;
  int channel = 1;  // the communication channel its transfers run on
};
using ReshardPlans = std::map<std::string, std::shared_ptr<const PlannedReshard>>;  // by node name

// The cluster a resharding between `world` ranks is planned for: the ranks spread over hosts by
// `host_of` (empty: one host), `intra` inside a host and `inter` between hosts. A link left
// unset (bandwidth 0) is the machine at hand's shared memory as the planner prices it.
ReshardCluster reshard_cluster(int64_t world, std::vector<int> host_of, LinkModel inter, LinkModel intra);
// The same from a cluster file's nodes and links (consecutive ranks share a node).
ReshardCluster reshard_cluster(const ClusterSpec& c, int64_t world);

// A Reshard node's attributes for `p` on world rank `world_rank`'s program.
AttrMap reshard_attrs(const ReshardProblem& p, int64_t world_rank, DType dtype, int channel);
// The problem a Reshard node's attributes describe (the same on every rank); errors name the side.
Expected<ReshardProblem> reshard_problem_of(const AttrMap& a);

// Plans, one per distinct problem, for the Reshard nodes added by one builder.
class ReshardPlanner {
 public:
  ReshardPlanner(ReshardCluster cluster, ReshardOptions options) : cluster_(std::move(cluster)), options_(options) {}
  // The plan of `p` on channel `channel` (made once per distinct problem); errors name the problem.
  Expected<std::shared_ptr<const PlannedReshard>> plan(const ReshardProblem& p, int channel);

 private:
  ReshardCluster cluster_;
  ReshardOptions options_;
  std::map<std::string, std::shared_ptr<const PlannedReshard>> made_;
};

// Plans every Reshard node of `g` from its attributes for `cluster` (its "strategy" attribute, if
// any, chooses the strategy); errors name the node.
Expected<ReshardPlans> plan_reshards(const Graph& g, const ReshardCluster& cluster);

// The Reshard nodes of `g` that `plans` lacks, as "[Reshard] node 'x'" (empty: every one planned).
std::string unplanned_reshards(const Graph& g, const ReshardPlans& plans);

}  // namespace oases
