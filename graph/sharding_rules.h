// Sharding rules: the context a rule sees and the rules shared by op families.
//
// Sharding rules (OpSchema::shard, one per op family file) map the specs of a node's inputs to its
// outputs' specs, and may require an input in another spec; an unhandled combination is an error
// naming the op and the specs, never a silent replicate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/mesh.h"
#include "graph/sharding_spec.h"

namespace oases {

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

// --- rules shared by op families -------------------------------------------------------------

// Numpy-broadcasting elementwise ops: output dims take the sharding of the inputs' non-broadcast
// dims (inputs that disagree are required to match the first sharded one; broadcast dims must be
// replicated). `linear` ops (Add/Sub/Neg/Identity/Cast...) pass partial sums through when every
// input is partial over the axis; `multiplicative` (Mul/Div numerator) allow one partial factor;
// others need no partial inputs.
enum class PartialPolicy { kNone, kAdditive, kMultiplicative, kFirstOnly };
Status shard_elementwise(ShardContext& c, PartialPolicy policy, int first_input = 0);
// Elementwise and nonlinear (activations, Exp, Pow ...): partial sums reduced first.
Status shard_nonlinear(ShardContext& c);
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
