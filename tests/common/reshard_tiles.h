// A reshard test's source tiles: each element its row-major index in the whole tensor, plus 0.5 x
// the rank's place in the source mesh (the parts of a partial source differ); shared by the CPU
// and GPU tests that compare two ways of running one plan.
#pragma once

#include <vector>

#include "executor/reshard_runner.h"
#include "graph/tiles.h"
#include "planner/reshard.h"

namespace oases::testutil {

// World rank r's source tile of `p` (float32; no boxes outside the source mesh).
inline TileData indexed_source_tile(const ReshardProblem& p, int r) {
  TileData src;
  src.element_bytes = 4;
  int64_t sr = p.src.placed.mesh_rank(r);
  if (sr < 0) return src;
  src = TileData::zeros(tile_boxes(p.src.spec, p.shape, p.src.placed.mesh).value(), sr, 4);
  for (size_t k = 0; k < src.boxes.size(); ++k) {
    const Box& b = src.boxes[k];
    auto* f = reinterpret_cast<float*>(src.data[k].data());
    std::vector<int64_t> at(b.extent.size());
    for (int64_t i = 0; i < b.numel(); ++i) {
      int64_t rest = i, flat = 0;
      for (size_t d = b.extent.size(); d-- > 0;) {
        at[d] = b.offset[d] + rest % b.extent[d];
        rest /= b.extent[d];
      }
      for (size_t d = 0; d < at.size(); ++d) flat = flat * p.shape[d] + at[d];
      f[i] = static_cast<float>(flat) + 0.5f * static_cast<float>(sr);
    }
  }
  return src;
}

}  // namespace oases::testutil
