// Sharding of values over a device mesh.
//
// A Mesh names its axes ("dp", "tp") with sizes; rank r has coordinates with the last axis
// fastest, so a tensor-parallel group is a run of consecutive ranks.
//
// Compound axes (for plans whose ops use different tp x dp splits of one set of ranks): an axis
// may span several base axes (`parts`, major first); its coordinate is the mixed-radix number of
// theirs and its groups are the ranks that differ only in those base axes. Ranks count over the
// base axes alone. Two axes overlap when they share a base axis; a spec never uses overlapping
// axes on two dimensions (or sharded and partial).
//
// A ShardingSpec says, per dimension of a value, whether it is replicated or split over one mesh
// axis (`Shard(axis)`), optionally in `segments` equal segments each split separately (a fused
// QKV weight [C, 3C]: every rank holds its part of q, of k and of v); and over which mesh axes the
// value is a partial sum pending a reduction (`Partial(sum)`). A mesh axis shards at most one
// dimension, and is never both sharding and partial.
//
// Sharding rules (OpSchema::shard, one per op family file) map the specs of a node's inputs to its
// outputs' specs, and may require an input in another spec; an unhandled combination is an error
// naming the op and the specs, never a silent replicate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"

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

struct ShardingSpecHash {
  size_t operator()(const ShardingSpec& s) const { return s.hash(); }
};

// What a sharding rule sees: the node, the mesh, the current specs of its inputs. It sets every
// output's spec and may require an input in another spec (the propagation then inserts the
// conversion: an all-reduce, all-gather, reduce-scatter, all-to-all or a local slice).
class ShardContext {
 public:
  ShardContext(const Graph& g, const Node& n, const Mesh& mesh, std::vector<ShardingSpec> inputs);
  const Graph& graph() const { return g_; }
  const Node& node() const { return n_; }
  const Mesh& mesh() const { return mesh_; }
  int num_inputs() const { return static_cast<int>(in_.size()); }
  bool has_input(int i) const { return n_.has_input(i); }
  const ShardingSpec& in(int i) const { return in_.at(static_cast<size_t>(i)); }
  Shape in_shape(int i) const { return g_.value(n_.inputs.at(static_cast<size_t>(i))).shape; }
  Shape out_shape(int i) const { return g_.value(n_.outputs.at(static_cast<size_t>(i))).shape; }
  int num_outputs() const { return static_cast<int>(n_.outputs.size()); }
  bool has_output(int i) const { return n_.output(i) != kNoId; }
  void require(int i, ShardingSpec s);
  void set_out(int i, ShardingSpec s);
  // Requires every partial input to be reduced first (nonlinear ops).
  void require_no_partial();
  // Requires input i to be replicated on dims [from, rank) (normalised axes, softmax's axis, ...).
  void require_replicated_dims(int i, int64_t from, int64_t to);

  const std::vector<ShardingSpec>& inputs() const { return in_; }
  const std::vector<ShardingSpec>& outputs() const { return out_; }
  const std::vector<bool>& required() const { return required_; }
  template <class... Args>
  Status fail(fmt::format_string<Args...> f, Args&&... args) const {
    return Status::error(n_.describe() + ": cannot shard with inputs " + describe_inputs() + ": " +
                         fmt::format(f, std::forward<Args>(args)...));
  }
  std::string describe_inputs() const;

 private:
  const Graph& g_;
  const Node& n_;
  const Mesh& mesh_;
  std::vector<ShardingSpec> in_, out_;
  std::vector<bool> required_;
};

// The part of a global tensor that `rank` holds under `spec` (partial specs: the full tensor on
// the first member of each partial group, zeros elsewhere).
Tensor slice_for_rank(const Tensor& global, const ShardingSpec& spec, const Mesh& mesh, int64_t rank);
// Inverse of slice_for_rank for non-partial specs: the global tensor from every rank's part
// (indexed by rank); throws when the result is not `global` in shape.
Tensor assemble_from_ranks(const std::vector<Tensor>& parts, const ShardingSpec& spec, const Mesh& mesh, const Shape& global);

// --- rules shared by op families -------------------------------------------------------------

// Numpy-broadcasting elementwise ops: output dims take the sharding of the inputs' non-broadcast
// dims (inputs that disagree are required to match the first sharded one; broadcast dims must be
// replicated). `linear` ops (Add/Sub/Neg/Identity/Cast...) pass partial sums through when every
// input is partial over the axis; `multiplicative` (Mul/Div numerator) allow one partial factor;
// others need no partial inputs.
enum class PartialPolicy { kNone, kAdditive, kMultiplicative, kFirstOnly };
Status shard_elementwise(ShardContext& c, PartialPolicy policy, int first_input = 0);
// MatMul / oases.MatMulT: batch dims broadcast like elementwise ops; a contraction over a sharded K
// gives a partial sum; M and N keep their operand's sharding.
Status shard_matmul(ShardContext& c, bool trans_a, bool trans_b);

// Reshape-like ops (Reshape, Flatten, Squeeze, Unsqueeze): dims are grouped where the products
// of input and output dims agree; a group may be sharded only on its outermost input dim, and the
// sharding moves to the group's outermost output dim (Megatron's [B,T,C] <-> [B,T,H,D] by heads).
Status shard_reshape(ShardContext& c);
// Attention (q at input `q`; grad: AttentionGrad's layout): batch and heads split, T and D whole.
Status shard_attention(ShardContext& c, int q, bool grad);
// Cross-entropy losses and their gradients (scores at input `scores`).
Status shard_cross_entropy(ShardContext& c, int scores, bool grad);
// Explicit rule for ops that only run on whole tensors: every input is required replicated.
Status shard_replicated_only(ShardContext& c);

// Output 0 takes input 0's spec; extra outputs too (same-shape ops: Dropout, unary grads...).
Status shard_same_as_input(ShardContext& c, PartialPolicy policy);

}  // namespace oases
