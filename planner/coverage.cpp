#include "planner/coverage.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "planner/pipeline_program.h"

namespace oases {

PricingSpace default_pricing_space(int64_t gpus, const std::vector<int64_t>& more_chunks) {
  PricingSpace s;
  s.gpus = gpus;
  for (int64_t k : more_chunks) {
    if (k >= 1 && std::find(s.search.chunks.begin(), s.search.chunks.end(), k) == s.search.chunks.end()) s.search.chunks.push_back(k);
  }
  std::sort(s.search.chunks.begin(), s.search.chunks.end());
  s.pipeline = gpus >= 2;
  return s;
}

std::string PricedSample::where() const {
  std::string w = fmt::format("{} at tp {} x dp {}, {} chunk{}", part, layout.tp, ranks / layout.tp, chunks, chunks == 1 ? "" : "s");
  if (layout.sequence_parallel) w += ", sequence-parallel";
  if (stages > 1) w += fmt::format(", a stage of {} pipeline stages", stages);
  return w;
}

namespace {

// Adds the ops of every part of `a` (on `ranks` ranks) under every layout the search allows with
// `chunks` chunks, keys not seen before.
void add_space(const ModelAnalysis& a, int64_t ranks, const SearchOptions& so, int64_t chunks, int64_t stages, std::set<std::string>* seen,
               std::vector<PricedSample>* out) {
  for (int i = 0; i < static_cast<int>(a.parts.size()); ++i) {
    std::set<std::pair<int64_t, bool>> done;  // a collective-matmul layout prices its split's ops
    for (const Layout& l : allowed_layouts(a, ranks, so, i, chunks)) {
      if (!done.insert({l.tp, l.sequence_parallel}).second) continue;
      const std::vector<PartRecords>& recs = l.sequence_parallel ? a.seqpar : a.plain;
      if (recs.empty()) continue;
      auto ops = priced_part_ops(recs[static_cast<size_t>(i)], l.tp, ranks / l.tp * chunks);
      if (!ops) continue;  // the layout does not divide this part: never priced
      for (PricedOp& op : *ops) {
        if (!seen->insert(op.key).second) continue;
        PricedSample s;
        s.op = std::move(op);
        s.part = a.parts[static_cast<size_t>(i)];
        s.layout = Layout{l.tp, l.sequence_parallel};
        s.ranks = ranks;
        s.chunks = chunks;
        s.stages = stages;
        out->push_back(std::move(s));
      }
    }
  }
}

}  // namespace

Expected<std::vector<PricedSample>> priced_ops(const Graph& forward, const Graph& train, const std::vector<ValueId>& params,
                                               const ModelAnalysis& a, const PricingSpace& space) {
  std::vector<PricedSample> out;
  std::set<std::string> seen;
  for (int64_t k : space.search.chunks) add_space(a, space.gpus, space.search, k, 1, &seen, &out);
  const int blocks = count_blocks(train);
  if (!space.pipeline || space.gpus < 2 || blocks < 2) return out;
  ClusterSpec hosts;
  hosts.gpus_per_node = space.gpus_per_node > 0 ? space.gpus_per_node : space.gpus;
  hosts.nodes = std::max<int64_t>(1, space.gpus / hosts.gpus_per_node);
  for (int64_t S : pipeline_stage_counts(hosts, space.gpus, blocks, space.pipe)) {
    const int64_t n = space.gpus / S;
    ModelAnalysis stage_an;
    if (n != space.gpus) {
      OASES_ASSIGN_OR_RETURN(stage_an, analyze_model(forward, train, params, n));
    }
    const ModelAnalysis& an = n != space.gpus ? stage_an : a;
    for (int64_t M : pipeline_micro_batches(S, an.batch, space.pipe)) {
      for (int64_t k : space.pipe.inner_chunks) add_space(an, n, space.search, M * k, S, &seen, &out);
    }
  }
  return out;
}

std::vector<const PricedSample*> uncovered(const std::vector<PricedSample>& priced, const Profile& p) {
  std::set<std::string> have;
  for (const OpSample& s : p.ops) have.insert(p.backend == "cpu" ? s.key : s.op);
  std::vector<const PricedSample*> out;
  for (const PricedSample& s : priced) {
    if (!have.count(p.backend == "cpu" ? s.op.key : s.op.op)) out.push_back(&s);
  }
  return out;
}

}  // namespace oases
