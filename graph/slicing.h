// Moving whole tensors to and from their per-rank parts under a ShardingSpec (checkpoints, tests,
// the reference runs of tensor-parallel programs).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/mesh.h"
#include "graph/sharding_spec.h"
#include "graph/tensor.h"

namespace oases {

// The part of a global tensor that `rank` holds under `spec`: its tile's boxes (graph/tiles.h
// tile_boxes) side by side (partial specs: the full tensor on the ranks whose coordinates on the
// partial axes are 0, zeros elsewhere). Throws when the spec does not fit the tensor or the mesh.
Tensor slice_for_rank(const Tensor& global, const ShardingSpec& spec, const Mesh& mesh, int64_t rank);
// Inverse of slice_for_rank for non-partial specs: the global tensor from every rank's part
// (indexed by rank; of each group of replicas the first one's); throws when a part is not its
// tile in shape.
Tensor assemble_from_ranks(const std::vector<Tensor>& parts, const ShardingSpec& spec, const Mesh& mesh, const Shape& global);

}  // namespace oases
