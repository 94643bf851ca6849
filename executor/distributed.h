// What one rank of a parallel run needs besides its Trainer: its communication groups (one per
// mesh axis, plus the world), gathers of sharded tensors for checkpoints, exports and gradient
// dumps, the global gradient norm, and the start-up check that every rank runs the same model and
// binary.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/communicator.h"
#include "executor/emulated_link.h"
#include "graph/sharding.h"
#include "graph/tensor.h"
#include "graph/tiles.h"

namespace oases {

class RankRuntime {
 public:
  // Creates the groups (the same order on every rank: mesh axes, then the world). A single-rank
  // run passes comm = nullptr.
  static Expected<std::unique_ptr<RankRuntime>> create(Communicator* comm, const Mesh& mesh, const LinkModel& link = {});
  // A rank of a mesh placed on some of the world's ranks (a pipeline stage; meshes may leave
  // world ranks out): rank() is its mesh rank, and its groups are made by their members alone
  // (channel groups, tags kMeshGroupTag + axis), so the other meshes' ranks need not take part.
  static Expected<std::unique_ptr<RankRuntime>> create(Communicator* comm, const PlacedMesh& placed, const LinkModel& link = {});
  static constexpr int kMeshGroupTag = 30000;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(mesh_.size()); }
  const Mesh& mesh() const { return mesh_; }
  const std::vector<CommGroup*>& axis_groups() const { return axis_raw_; }
  bool distributed() const { return comm_ != nullptr && mesh_.size() > 1; }
  Communicator* communicator() const { return comm_; }

  // The global tensor of a value sharded by `spec`, on every rank (collective: all ranks call).
  Tensor gather(const Tensor& local, const ShardingSpec& spec, const Shape& global);
  // Every rank passes its hash of `what`; an error names the first rank that differs from rank 0.
  Status check_same(const std::string& what, uint64_t hash);
  // Global gradient norm² from per-parameter local Σ g²: sums shards over the axes that split them.
  double global_sum_squares(const std::vector<double>& ss, const std::vector<ShardingSpec>& specs);
  void abort(const std::string& why);
  // Every rank's string, on every rank (collective).
  std::vector<std::string> gather_strings(const std::string& mine);
  // The sum of every rank's `x` in rank order, on every rank (collective).
  double sum(double x);
  // Every rank's named tensors merged, on every rank (collective). A name given by two ranks must
  // carry bit-equal tensors (a tied weight's copies on two pipeline stages), else it throws.
  std::map<std::string, Tensor> merge_tensors(const std::map<std::string, Tensor>& mine);

 private:
  Communicator* comm_ = nullptr;
  Mesh mesh_;
  int rank_ = 0;
  std::vector<std::unique_ptr<CommGroup>> axis_groups_;
  std::vector<CommGroup*> axis_raw_;
  std::unique_ptr<CommGroup> world_;
};

// FNV-1a of a string, for start-up checks.
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull);
// Identity of this binary (build id), for start-up checks.
std::string binary_identity();

}  // namespace oases
