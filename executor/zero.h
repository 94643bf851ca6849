// The distributed optimizer on a rank (ZeRO stage 1, `--zero 1`; the program side is
// planner/partition.h shard_gradient_reductions): a parameter whose gradient the program
// reduce-scatters in flat pieces (oases.FlatReduceScatter) has its optimizer state for its piece
// only (graph/tiles.h flat_piece: member r of n holds elements [r·piece, r·piece + length) of the
// flattened parameter). The optimizer updates that range of the rank's full copy, and the members
// all-gather the updated pieces so every rank again holds the whole parameter its program reads.
//
// Checkpoints stay layout-free: the moments leave as whole tensors (gathered over the group) and
// come back as whole tensors (each rank keeps its piece), so a run saved under --zero 1 at dp 4
// resumes at dp 2 without it and back. Everything here that talks is collective over each
// piece's group, called by all its members in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "executor/communicator.h"
#include "graph/graph.h"
#include "graph/tensor.h"

namespace oases {

struct ZeroPiece {
  CommGroup* group = nullptr;  // the members that sum the gradient and share the state
  int64_t numel = 0;           // the parameter's (this rank's full copy)
  int64_t piece = 0;           // elements of each member's piece (the last ones padded)
  int64_t offset = 0;          // this member's first element
  int64_t length = 0;          // of its piece, within the parameter (0 past the end)
  // The program gives the whole gradient, already summed (a tied weight's, made whole before it
  // crosses pipeline stages): the update reads its piece at `offset`, nothing is reduce-scattered.
  bool whole_gradient = false;
};

class ZeroShards {
 public:
  // The pieces of `grads` (parameter i's gradient output of `program`, the graph the executor
  // runs) made by FlatReduceScatter nodes, whose groups come from `groups` (this rank's group per
  // mesh axis). Errors name a gradient whose node's group is missing or whose piece does not match
  // its parameter's size.
  static Expected<ZeroShards> find(const Graph& program, const std::vector<ValueId>& params, const std::vector<ValueId>& grads,
                                   const std::vector<CommGroup*>& groups);
  bool any() const { return any_; }
  // Parameter i (of `numel` elements), whose gradient the program gives whole and equal on every
  // member of `group`, shares its state over the group too (whole_gradient); no-op if it is sharded.
  void add_whole(size_t i, CommGroup* group, int64_t numel);
  const std::optional<ZeroPiece>& piece(size_t i) const { return pieces_.at(i); }
  size_t size() const { return pieces_.size(); }

  // Per parameter Σ g² of its piece summed over its group (other entries left), on every member.
  void sum_over_groups(std::vector<double>* ss) const;
  // Every member's updated piece of each sharded parameter into `params` (full copies, in order).
  void all_gather(const std::vector<Tensor*>& params) const;
  // The same as buckets of at most 64 MiB gathered, each run on its own (in this order on every
  // member): the parameters (indices into `params`) it completes, and the work. Given each
  // parameter's first use in the program (`first_use`, an instruction index) and its part (`part`,
  // e.g. its block), the parameters go in order of first use and a bucket never spans two parts,
  // so the first ones needed arrive first and the later ones fly beside the compute before them.
  struct GatherBucket {
    std::vector<size_t> params;
    std::function<void()> run;
    int64_t first_use = 0;
  };
  std::vector<GatherBucket> gather_buckets(const std::vector<Tensor*>& params, const std::vector<int64_t>& first_use = {},
                                           const std::vector<int>& part = {}) const;
  // The whole tensor (shape `shape`) from this member's piece `mine` (`piece` floats) and the others'.
  Tensor gather(size_t i, const float* mine, const Shape& shape) const;
  // This member's piece of a whole tensor of parameter i's shape ([length] elements).
  Tensor slice(size_t i, const Tensor& whole) const;

 private:
  std::vector<std::optional<ZeroPiece>> pieces_;
  bool any_ = false;
};

}  // namespace oases
