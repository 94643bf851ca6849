#include "planner/reshard_nodes.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/op_registry.h"
#include "planner/profile.h"

namespace oases {

namespace {

LinkModel link_of(const LinkSpec& l) {
  return LinkModel{l.bandwidth_gbps, l.latency_us};
}

std::vector<int64_t> base_sizes(const Mesh& mesh) {
  std::vector<int64_t> sizes;
  for (int ax = 0; ax < mesh.num_axes(); ++ax) {
    if (mesh.is_base(ax)) sizes.push_back(mesh.sizes[static_cast<size_t>(ax)]);
  }
  if (sizes.empty()) sizes.push_back(1);
  return sizes;
}

bool is_reshard(const Node& n) {
  return n.domain == kOasesDomain && n.op_type == "Reshard";
}

std::string problem_key(const ReshardProblem& p, int channel) {
  auto side = [](const PlacedLayout& s) {
    return fmt::format("{} on {} [{}]", s.spec.to_string(&s.placed.mesh), s.placed.mesh.to_string(), fmt::join(s.placed.ranks, ","));
  };
  return fmt::format("{} x{} B: {} -> {}; channel {}", shape_str(p.shape), p.element_bytes, side(p.src), side(p.dst), channel);
}

}  // namespace

ReshardCluster reshard_cluster(int64_t world, std::vector<int> host_of, LinkModel inter, LinkModel intra) {
  if (!inter.enabled() || !intra.enabled()) {
    const LinkSpec shm = this_machine(std::max<int64_t>(world, 1), nullptr, "", 1).intra;
    if (!intra.enabled()) intra = link_of(shm);
    if (!inter.enabled()) inter = intra;
  }
  ReshardCluster c{std::move(host_of), inter, intra};
  c.host_of.resize(static_cast<size_t>(std::max<int64_t>(world, 0)), 0);
  return c;
}

ReshardCluster reshard_cluster(const ClusterSpec& c, int64_t world) {
  std::vector<int> host_of;
  const int64_t per = std::max<int64_t>(1, c.gpus_per_node);
  for (int64_t r = 0; r < world; ++r) host_of.push_back(static_cast<int>(r / per));
  return reshard_cluster(world, std::move(host_of), link_of(c.inter), link_of(c.has_nvlink ? c.nvlink : c.intra));
}

AttrMap reshard_attrs(const ReshardProblem& p, int64_t world_rank, DType dtype, int channel) {
  AttrMap a;
  a.set_ints("shape", p.shape);
  a.set_ints("src_mesh", base_sizes(p.src.placed.mesh));
  a.set_ints("dst_mesh", base_sizes(p.dst.placed.mesh));
  a.set_ints("src_ranks", p.src.placed.ranks);
  a.set_ints("dst_ranks", p.dst.placed.ranks);
  a.set_string("src_layout", layout_string(p.src.spec, p.src.placed.mesh));
  a.set_string("dst_layout", layout_string(p.dst.spec, p.dst.placed.mesh));
  a.set_int("world_rank", world_rank);
  a.set_int("dtype", dtype_to_onnx(dtype));
  a.set_int("channel", channel);
  return a;
}

Expected<ReshardProblem> reshard_problem_of(const AttrMap& a) {
  ReshardProblem p;
  p.shape = a.get_ints("shape");
  auto src = placed_layout(a.get_ints("src_mesh"), a.get_ints("src_ranks"), a.get_string("src_layout", ""), p.shape.size());
  if (!src) return src.status().with_context("source");
  auto dst = placed_layout(a.get_ints("dst_mesh"), a.get_ints("dst_ranks"), a.get_string("dst_layout", ""), p.shape.size());
  if (!dst) return dst.status().with_context("destination");
  p.src = std::move(*src);
  p.dst = std::move(*dst);
  p.element_bytes = static_cast<int64_t>(dtype_size(dtype_from_onnx(static_cast<int>(a.get_int("dtype", 1)))));
  return p;
}

Expected<std::shared_ptr<const PlannedReshard>> ReshardPlanner::plan(const ReshardProblem& p, int channel) {
  const std::string key = problem_key(p, channel);
  auto& slot = made_[key];
  if (!slot) {
    auto plan = plan_reshard(p, cluster_, options_);
    if (!plan) return plan.status().with_context(key);
    slot = std::make_shared<const PlannedReshard>(PlannedReshard{p, cluster_, std::move(*plan), channel});
  }
  return slot;
}

Expected<ReshardPlans> plan_reshards(const Graph& g, const ReshardCluster& cluster) {
  ReshardPlans out;
  std::map<ReshardStrategy, ReshardPlanner> planners;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (!is_reshard(n)) continue;
    auto p = reshard_problem_of(n.attrs);
    if (!p) return p.status().with_context(n.describe());
    if (n.output(0) != kNoId && g.value(n.output(0)).dtype != DType::kUndefined)
      p->element_bytes = static_cast<int64_t>(dtype_size(g.value(n.output(0)).dtype));
    auto strategy = parse_reshard_strategy(n.attrs.get_string("strategy", "auto"));
    if (!strategy) return strategy.status().with_context(n.describe());
    ReshardOptions o;
    o.strategy = *strategy;
    auto it = planners.try_emplace(*strategy, cluster, o).first;
    auto planned = it->second.plan(*p, static_cast<int>(n.attrs.get_int("channel", 1)));
    if (!planned) return planned.status().with_context(n.describe());
    out[n.name] = *planned;
  }
  return out;
}

std::string unplanned_reshards(const Graph& g, const ReshardPlans& plans) {
  std::vector<std::string> missing;
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    if (is_reshard(n) && !plans.count(n.name)) missing.push_back(n.describe());
  }
  return fmt::format("{}", fmt::join(missing, ", "));
}

}  // namespace oases
