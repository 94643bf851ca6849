// ShardingSpec: how a value is laid out over a Mesh.
//
// A ShardingSpec says, per dimension of a value, whether it is replicated or split over one mesh
// axis (`Shard(axis)`), optionally in `segments` equal segments each split separately (a fused
// QKV weight [C, 3C]: every rank holds its part of q, of k and of v); and over which mesh axes the
// value is a partial sum pending a reduction (`Partial(sum)`). A mesh axis shards at most one
// dimension, and is never both sharding and partial.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/mesh.h"
#include "graph/tensor.h"

namespace oases {

struct DimSpec {
  int axis = -1;     // mesh axis splitting this dimension, -1 = replicated
  int segments = 1;  // the dimension is `segments` equal parts, each split over the axis
  bool operator==(const DimSpec& o) const { return axis == o.axis && (axis < 0 || segments == o.segments); }
  bool operator!=(const DimSpec& o) const { return !(*this == o); }
};

class ShardingSpec {
 public:
  ShardingSpec() = default;
  static ShardingSpec replicated(size_t rank) {
    ShardingSpec s;
    s.dims.resize(rank);
    return s;
  }
  std::vector<DimSpec> dims;
  uint32_t partial = 0;  // bit a set: a partial sum over mesh axis a

  size_t rank() const { return dims.size(); }
  bool is_replicated() const;  // no dim sharded and nothing partial
  bool is_partial(int a) const { return a >= 0 && (partial >> a) & 1u; }
  bool any_partial() const { return partial != 0; }
  int dim_of_axis(int a) const;  // dimension sharded over axis a, or -1
  bool uses_axis(int a) const { return dim_of_axis(a) >= 0 || is_partial(a); }
  ShardingSpec with_dim(size_t d, int axis, int segments = 1) const;
  ShardingSpec with_partial(int a, bool on = true) const;
  ShardingSpec without_partial() const;

  bool operator==(const ShardingSpec& o) const { return dims == o.dims && partial == o.partial; }
  bool operator!=(const ShardingSpec& o) const { return !(*this == o); }
  size_t hash() const;
  // "[S(tp), R, R]", "[S(tp)/3, R]", "[R, R] P(dp)"; mesh axis names when a mesh is given.
  std::string to_string(const Mesh* mesh = nullptr) const;
  // Every sharded dimension divides evenly (segments included); each axis used once.
  Status validate(const Shape& global, const Mesh& mesh) const;
  Shape local_shape(const Shape& global, const Mesh& mesh) const;
};

// The notation ShardingSpec::to_string writes, read back: "[S(tp), R]", "[S(tp)/3, R] P(dp)" ->
// spec over `mesh`; errors name the text. Segments run from 1 to kMaxSegments; nothing but
// P(axis) terms may follow the brackets. `lookup`, when given, names the axes instead of the
// mesh's axis names (an index, -1 when unknown; it may add an axis to the mesh).
constexpr int64_t kMaxSegments = int64_t{1} << 20;
using AxisLookup = std::function<int(const std::string& name)>;
Expected<ShardingSpec> parse_spec(const std::string& text, const Mesh& mesh, const AxisLookup& lookup = nullptr);

struct ShardingSpecHash {
  size_t operator()(const ShardingSpec& s) const { return s.hash(); }
};

}  // namespace oases
