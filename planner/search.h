// The search: for every schedule and chunk count K, an exact dynamic program over the chain of
// parts (embedding, attention, MLP, ..., head) whose state is the layout of the part before, so the
// cost of moving the batch between layouts is counted where it happens. The objective is the sum
// of CostModel::part_objective (time with its exposed communication and the part's optimizer
// step). Memory per rank is the sum of every part's kept bytes plus the largest working set of one
// part's backward; under a limit the program keeps, per state, the Pareto front of (time, memory)
// for each cap on that working set, which is still exact. A tied embedding and head share one tp
// degree. brute_force enumerates every assignment (tests).
//
// The work is bounded by construction, not by dropping choices: costs are tabulated once per class
// of identical parts; layouts no better than another of their part are dropped (dominance); and
// under a limit every (schedule, K, tied degree, cap) chain is first bounded by Lagrangian
// relaxation (one-label programs on time + lambda * memory, lambda moved along the hull of the
// paths' (memory, time) points to the edge that crosses the limit), which also meets fitting plans
// (the hull's paths and their crossings: some parts one way, the rest the other). A chain whose
// bound cannot beat the best plan known to fit is not expanded, and the label programs make only
// labels whose bounds (the rest of the chain's least time, least memory and Lagrangian bound) can
// still beat it. The plan chosen is the one the label programs alone choose (equal labels are kept
// by a fixed order, so the bounds never change which of two equal plans wins): SearchOptions::
// bound_chains = false runs them alone, and the tests compare.
#pragma once

#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/plan.h"

namespace oases {

struct SearchOptions {
  std::vector<std::string> schedules{"plain", "default_checkpoint", "optim_comm_checkpoint", "overlap_checkpoint", "oases"};
  std::vector<int64_t> chunks{1, 2, 4, 8};
  double memory_limit = 0;  // bytes per rank, 0: none
  bool allow_mixed = true;  // parts may take different layouts (when the model allows)
  bool allow_sequence_parallel = true;
  // only the sequence-parallel layouts where a part at a degree has one (oases-plan --gpus N
  // --sequence-parallel); parts without (tp 1, or none possible) keep theirs
  bool require_sequence_parallel = false;
  bool allow_collective_matmul = true;  // sequence-parallel parts may decompose their collectives (Layout::collective_matmul)
  std::vector<int64_t> degrees;  // tp degrees allowed (empty: every candidate)
  // Also keep the best fitting plan of every (schedule, K) space (SearchResult::spaces), for a
  // caller that ranks them by another measure (oases-plan --simulate). Each space is then searched
  // to its own best instead of being cut off by the best of the spaces before it.
  bool keep_spaces = false;
  // Under a limit, bound each chain first (a Lagrangian dual bound and the plans met finding it) and
  // make only labels that can beat the best plan known to fit. false: the label programs alone
  // (what tests compare against: the same plan, more work).
  bool bound_chains = true;
};

struct SpaceBest {
  PlanChoice choice;
  double objective = 0, memory = 0;
};

struct SearchResult {
  bool found = false;
  PlanChoice best;
  double objective = 0;     // seconds (the chain cost plus the optimizer step)
  double memory = 0;        // bytes per rank
  double least_memory = 0;  // the least any plan of the space needs (when none fits the limit)
  int64_t transitions = 0;  // (part, previous layout, layout) pairs priced
  int64_t labels = 0;       // (objective, memory) labels made by the chain programs (the Pareto fronts' work)
  int64_t dominated = 0;    // (part, layout) pairs dropped as dominated (exact pruning) over all spaces
  int64_t bound_transitions = 0;  // (part, previous layout, layout) pairs priced by the one-label programs that bound the chains
  std::string restriction;  // how the space was narrowed, for people
  std::vector<SpaceBest> spaces;  // with SearchOptions::keep_spaces: by objective, fastest first
};

SearchResult search_plan(CostModel& m, const SearchOptions& o);

// The layouts the search prices for part `part` with K chunks on `ranks` ranks: the candidates
// (candidate_layouts) the options allow (degrees, sequence parallelism, collective matmuls).
std::vector<Layout> allowed_layouts(const ModelAnalysis& a, int64_t ranks, const SearchOptions& o, int part, int64_t K);
SearchResult brute_force(CostModel& m, const SearchOptions& o);

// Chain cost and memory of one plan under the search's objective.
double plan_objective(CostModel& m, const PlanChoice& p);
double plan_memory(CostModel& m, const PlanChoice& p);

// The search's candidate (layouts by part index) as the plan it stands for on `ranks` ranks.
std::vector<PartLayout> part_layouts_of(const ModelAnalysis& a, const std::vector<Layout>& layouts);
Plan plan_of_choice(const ModelAnalysis& a, const PlanChoice& p, int64_t ranks);

// The Megatron baseline's space beside a search of `asked` (same limit and degrees): one layout for
// every part, no sequence parallelism nor collective matmuls, plain or default_checkpoint, one
// chunk. With degrees {1} it is pure data parallelism.
SearchOptions megatron_search_options(const SearchOptions& asked);

// What replayed programs choose among (oases-plan --simulate): Megatron's split where it lies in the
// space asked for (its schedule and chunks among `asked`'s), then the best of every (schedule,
// chunks) space of `best` (a search with keep_spaces), fastest first by the chain model.
std::vector<PlanChoice> simulation_candidates(const SearchResult& best, const SearchResult& megatron, const SearchOptions& asked);

}  // namespace oases
