// A device mesh: named axes with sizes; rank r has coordinates with the last axis fastest, so a
// tensor-parallel group is a run of consecutive ranks.
//
// Compound axes (for plans whose ops use different tp x dp splits of one set of ranks): an axis
// may span several base axes (`parts`, major first); its coordinate is the mixed-radix number of
// theirs and its groups are the ranks that differ only in those base axes. Ranks count over the
// base axes alone. Two axes overlap when they share a base axis; a spec never uses overlapping
// axes on two dimensions (or sharded and partial).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/status.h"

namespace oases {

struct Mesh {
  std::vector<std::string> axes;  // e.g. {"dp", "tp"}
  std::vector<int64_t> sizes;
  // Per axis: the base axes a compound axis spans, major first; empty (or absent) for a base axis.
  std::vector<std::vector<int>> parts = {};

  static Mesh data_tensor(int64_t dp, int64_t tp) { return Mesh{{"dp", "tp"}, {dp, tp}, {}}; }
  int num_axes() const { return static_cast<int>(axes.size()); }
  bool is_base(int a) const { return a < 0 || static_cast<size_t>(a) >= parts.size() || parts[static_cast<size_t>(a)].empty(); }
  bool has_compound_axes() const;
  // Bit b set: the axis spans base axis b.
  uint32_t base_mask(int a) const;
  bool overlaps(int a, int b) const { return a >= 0 && b >= 0 && (base_mask(a) & base_mask(b)) != 0; }
  // Appends a compound axis over `base_axes` (major first); returns its index.
  int add_compound(const std::string& name, const std::vector<int>& base_axes);
  // Sizes positive, parts naming distinct base axes, a compound's size the product of its parts'.
  Status validate() const;
  int64_t size() const;
  int axis(const std::string& name) const;  // -1 when absent
  int64_t axis_size(int a) const { return a < 0 ? 1 : sizes.at(static_cast<size_t>(a)); }
  std::vector<int64_t> coords(int64_t rank) const;
  int64_t rank_of(const std::vector<int64_t>& coords) const;
  // Ranks of the group along mesh axis `a` that contains `rank`, in coordinate order.
  std::vector<int64_t> group(int64_t rank, int a) const;
  std::string to_string() const;  // "dp=2 x tp=4"; compound axes as "tp4=(m1 m2)"
  bool operator==(const Mesh& o) const;
};

// The most ranks a mesh may have, in all and along any one axis: a plan's meshes (planner/plan.h
// kMaxPlanRanks), a tool's mesh flags (oases-reshard --src-mesh), a Reshard node's meshes. Per-rank
// tables of a mesh are built eagerly, so a larger one would not fit or would take hours.
constexpr int64_t kMaxMeshRanks = int64_t{1} << 20;
// Every axis size of `mesh` from 1 to kMaxMeshRanks and its base axes' sizes multiplying to at most
// kMaxMeshRanks (stopping before the product overflows). Errors name `what`, e.g. with "mesh.sizes":
// "mesh.sizes[1]: 0 is not a size from 1 to 1048576", "mesh.sizes: more than 1048576 ranks in all".
// The mesh's structure (axes, parts) is Mesh::validate's.
Status check_mesh_ranks(const Mesh& mesh, const std::string& what);

}  // namespace oases
