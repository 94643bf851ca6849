// Tiles as boxes: where each rank's part of a value lies in the global tensor, for resharding
// between meshes (cross-mesh resharding, pipeline stages).
//
// A PlacedMesh is a Mesh and the world ranks it occupies (mesh rank i is world rank ranks[i]); two
// placed meshes may be disjoint or overlap. `tile_boxes` gives, per mesh rank, the boxes of its
// tile under a ShardingSpec (one box per segment of a segmented dimension, e.g. fused QKV), the
// replica groups (ranks holding equal data) and, for partial specs, the groups whose parts sum to
// the value. Unlike ShardingSpec::validate, a dimension need not divide: a dimension of n split
// k ways gives tiles of ceil(n / k), the last ones shorter (or empty).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/mesh.h"
#include "graph/sharding_spec.h"
#include "graph/status.h"
#include "graph/tensor.h"

namespace oases {

struct PlacedMesh {
  Mesh mesh;
  std::vector<int64_t> ranks;  // world rank of each mesh rank, in mesh-rank order

  // The mesh on world ranks first, first + 1, ...
  static PlacedMesh contiguous(Mesh mesh, int64_t first);
  int64_t size() const { return static_cast<int64_t>(ranks.size()); }
  // Mesh rank of world rank `w`, -1 when the mesh does not hold it.
  int64_t mesh_rank(int64_t world_rank) const;
  // One world rank per mesh rank, distinct, inside [0, world).
  Status validate(int64_t world) const;
  std::string to_string() const;  // "m0=2 x m1=4 on ranks 8-15"
};

// The distributed optimizer's pieces (executor/zero.h): a tensor of `numel` elements, flattened and
// padded with zeros to a multiple of `members`, is cut into `members` contiguous pieces of
// flat_piece elements; member r's piece starts at r * flat_piece and holds flat_piece_length of
// the tensor's elements (the rest, at the end of the last pieces, is padding).
inline int64_t flat_piece(int64_t numel, int64_t members) {
  return members <= 1 ? numel : (numel + members - 1) / members;
}
inline int64_t flat_piece_length(int64_t numel, int64_t members, int64_t member) {
  int64_t piece = flat_piece(numel, members), start = piece * member;
  return start >= numel ? 0 : std::min(piece, numel - start);
}

// A box in a tensor: per dimension the first index and the length.
struct Box {
  std::vector<int64_t> offset, extent;

  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  // The common part of two boxes of one rank (empty extents when they do not meet).
  Box intersect(const Box& o) const;
  bool contains(const Box& o) const;
  bool operator==(const Box& o) const { return offset == o.offset && extent == o.extent; }
  bool operator<(const Box& o) const { return offset != o.offset ? offset < o.offset : extent < o.extent; }
  std::string to_string() const;  // "[0:4, 8:16]" (half-open ranges)
};

struct TileMap {
  std::vector<std::vector<Box>> boxes;               // per mesh rank; none for an empty tile
  std::vector<std::vector<int64_t>> replica_groups;  // mesh ranks holding equal data, ascending
  // Partial specs: mesh ranks whose parts sum to the value (same boxes, differing only in the
  // partial axes), ascending; empty when the spec is not partial.
  std::vector<std::vector<int64_t>> partial_groups;
  // Per mesh rank: the shape of its part as a tensor, its boxes side by side (a segmented
  // dimension's pieces concatenated in segment order); zero-sized for an empty tile.
  std::vector<Shape> part_shapes;
};

// Every rank's tile of a value of `shape` laid out by `spec` on `mesh`: the one computation of
// a rank's part (graph/slicing.h copies tensors by it). Errors: a spec of another rank, an axis
// off the mesh or used twice, a segmented dimension that segments do not divide.
Expected<TileMap> tile_boxes(const ShardingSpec& spec, const Shape& shape, const Mesh& mesh);
// Copies the part `region` between two dense boxes holding it (row-major, `es` bytes each).
void copy_region(const Box& region, const Box& from_box, const char* from, const Box& to_box, char* to, int64_t es);

// A value's layout on a placed mesh: each side of a resharding (planner/reshard.h). A Reshard
// node's attributes write it as the mesh's sizes (base axes m0, m1, ...), its world ranks, and a
// layout string (parse_layout); placed_layout reads them back (the mesh bounded by check_mesh_ranks).
struct PlacedLayout {
  PlacedMesh placed;
  ShardingSpec spec;
};
Expected<PlacedLayout> placed_layout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& ranks, const std::string& layout,
                                     size_t tensor_rank);

// "2x4" → base axes m0=2, m1=4 ("8" → one axis). Sizes 1 … 2^20, at most 8 axes, at most 2^20
// ranks in all (check_mesh_ranks).
Expected<Mesh> parse_mesh_shape(const std::string& text);
// A layout as ShardingSpec::to_string writes it over axes named m0, m1, ... ("[S(m0), R]",
// "[S(m01), R]": sharded over both axes, major first; "[S(m0), R] P(m1)": a partial sum over m1),
// or in the compact notation of one token per tensor dimension that oases-reshard's --src/--dst
// also take: R, or S followed by mesh axes (S0, S1, S01), optionally followed by ":P" and the
// partial axes ("S0R:P1"). An axis pair adds a compound axis to `mesh`.
Expected<ShardingSpec> parse_layout(const std::string& text, size_t rank, Mesh* mesh);
// `spec` written as parse_layout reads it back on a mesh of the same base sizes (the bracket
// notation, the mesh's base axes named m0, m1, ... and its compound axes by their base axes).
std::string layout_string(const ShardingSpec& spec, const Mesh& mesh);

}  // namespace oases
