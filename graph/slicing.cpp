#include "graph/slicing.h"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <utility>

#include "graph/tiles.h"

namespace oases {

namespace {

TileMap tiles_of(const ShardingSpec& spec, const Shape& global, const Mesh& mesh) {
  auto t = tile_boxes(spec, global, mesh);
  if (!t) throw OasesError(t.status().message());
  return std::move(*t);
}

// Where `box`, one of a rank's `boxes`, lies in the rank's part (of shape `part`), as a box in the
// global tensor's coordinates: along each dimension the part holds the boxes' distinct ranges side
// by side, in order.
Box part_frame(const std::vector<Box>& boxes, const Box& box, const Shape& part) {
  Box frame{box.offset, part};
  for (size_t d = 0; d < box.offset.size(); ++d) {
    std::set<std::pair<int64_t, int64_t>> before;
    for (const Box& b : boxes) {
      if (b.offset[d] < box.offset[d]) before.insert({b.offset[d], b.extent[d]});
    }
    for (auto [off, len] : before) frame.offset[d] -= len;
  }
  return frame;
}

bool holds_the_sum(const ShardingSpec& spec, const Mesh& mesh, int64_t rank) {
  std::vector<int64_t> coords = mesh.coords(rank);
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (spec.is_partial(a) && coords[static_cast<size_t>(a)] != 0) return false;
  }
  return true;
}

}  // namespace

Tensor slice_for_rank(const Tensor& global, const ShardingSpec& spec, const Mesh& mesh, int64_t rank) {
  const TileMap tiles = tiles_of(spec, global.shape(), mesh);
  const size_t r = static_cast<size_t>(rank);
  Tensor part(global.dtype(), tiles.part_shapes.at(r));
  if (spec.any_partial() && !holds_the_sum(spec, mesh, rank)) return part;
  const Box whole{Shape(global.shape().size(), 0), global.shape()};
  const std::vector<Box>& boxes = tiles.boxes[r];
  for (const Box& b : boxes) {
    copy_region(b, whole, static_cast<const char*>(global.raw()), part_frame(boxes, b, part.shape()),
                static_cast<char*>(part.raw_mutable()), static_cast<int64_t>(dtype_size(global.dtype())));
  }
  return part;
}

Tensor assemble_from_ranks(const std::vector<Tensor>& parts, const ShardingSpec& spec, const Mesh& mesh, const Shape& global) {
  const TileMap tiles = tiles_of(spec, global, mesh);
  if (static_cast<int64_t>(parts.size()) != mesh.size())
    throw OasesError(fmt::format("assembling shards: {} parts for a mesh of {} ranks", parts.size(), mesh.size()));
  Tensor out(parts.at(0).dtype(), global);
  const Box whole{Shape(global.size(), 0), global};
  // one rank of each replica group, the first, writes its boxes
  for (const std::vector<int64_t>& group : tiles.replica_groups) {
    const size_t r = static_cast<size_t>(group.front());
    if (parts[r].shape() != tiles.part_shapes[r]) {
      throw OasesError(fmt::format("assembling shards: rank {} holds {}, its slice is {}", r, shape_str(parts[r].shape()),
                                   shape_str(tiles.part_shapes[r])));
    }
    const std::vector<Box>& boxes = tiles.boxes[r];
    for (const Box& b : boxes) {
      copy_region(b, part_frame(boxes, b, parts[r].shape()), static_cast<const char*>(parts[r].raw()), whole,
                  static_cast<char*>(out.raw_mutable()), static_cast<int64_t>(dtype_size(out.dtype())));
    }
  }
  return out;
}

}  // namespace oases
