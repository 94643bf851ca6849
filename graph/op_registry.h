// The op registry: one OpSchema per op type, holding every device-independent rule of the op:
// how old opsets are normalised to the canonical form, the shape rule, the gradient, sharding and
// partition-lowering rules, the cost, its traits and the examples the registry-driven tests run.
// Kernels live in kernels/, never here.
//
// Canonical form: operands that fix shapes (Reshape's shape, Slice's starts/ends, reduction axes,
// Split sizes, ...) are moved from inputs into attributes once they are constant, so passes,
// autodiff and the partitioner read plain attributes; an operand that never becomes constant is
// an error naming the node, since Oases plans static shapes.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace oases {

constexpr int kMinOpset = 13;
constexpr int kMaxOpset = 21;

class InferContext {
 public:
  InferContext(Graph& g, NodeId n) : graph_(g), node_(g.node(n)) {}
  Graph& graph() { return graph_; }
  Node& node() { return node_; }
  int num_inputs() const { return node_.num_inputs(); }
  bool has_input(int i) const { return node_.has_input(i); }
  const Value& input(int i) const { return graph_.value(node_.inputs.at(i)); }
  const Shape& shape(int i) const { return input(i).shape; }
  int64_t rank(int i) const { return static_cast<int64_t>(input(i).shape.size()); }
  DType dtype(int i) const { return input(i).dtype; }
  // Constant data of input i, or nullptr when it is not known before run time.
  const Tensor* constant(int i) const {
    if (!has_input(i)) return nullptr;
    const Value& v = input(i);
    return v.is_constant() ? &v.constant : nullptr;
  }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  bool has_output(int i) const { return node_.output(i) != kNoId; }
  void set_output(int i, DType dtype, Shape shape);
  const AttrMap& attrs() const { return node_.attrs; }
  int opset() const { return node_.opset; }

  // An error whose message starts with the node, e.g. "[Reshape] node 'r1': ...".
  template <class... Args>
  Status fail(fmt::format_string<Args...> f, Args&&... args) const {
    return Status::error(node_.describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  Graph& graph_;
  Node& node_;
};

class GradContext;   // graph/autodiff.h
class ShardContext;  // graph/sharding.h
class LowerContext;  // graph/lowering.h

// Facts about an op that passes and the planner ask (op_has_trait) instead of keeping their own
// lists of op types.
enum OpTrait : uint32_t {
  kTraitNorm = 1u << 0,          // a normalisation layer (LayerNorm, RMSNorm): blocks end at it
  kTraitLinear = 1u << 1,        // a matrix product of a layer (MatMul, Gemm): a block's linear layers
  kTraitComputeBound = 1u << 2,  // time follows FLOPs rather than bytes (products, attention)
  kTraitElementwise = 1u << 3,   // output element i reads input element i (after broadcasting)
  kTraitCollective = 1u << 4,    // communicates over a mesh axis (ShardSlice is local: not one)
  kTraitLoss = 1u << 5,          // a loss over class scores (mixed precision keeps it in float32)
  // Made only after partitioning (the partitioner's or the executor's own ops: collectives'
  // local forms, oases.cpu fusions): never sharded, so no sharding rule.
  kTraitPostPartition = 1u << 6,
  // Never executed: removed or folded before a program runs (no kernel needed).
  kTraitNoKernel = 1u << 7,
  // Draws from the run's counter-based generator, keyed by step and chunk (Dropout and its
  // gradient): its kernels take a per-step key, so a captured device graph cannot replay it; a
  // micro-batch chunk's copy replays the whole batch's mask at its rows (planner/chunking.cpp).
  kTraitRandom = 1u << 8,
  // The nonlinearity of a transformer MLP (Gelu, Relu, oases.Silu, oases.SwiGLU): the block finder
  // (graph/blocks.cpp) looks for the MLP's projections around it.
  kTraitActivation = 1u << 9,
  // A product whose operands 0 and 1 may be a layer's weights (MatMul, Gemm, Conv, Einsum): an
  // initializer read there beside a non-constant operand is trained (graph/parameters.cpp).
  kTraitWeightProduct = 1u << 10,
  // Output 0 holds input 0's elements moved, cast or repeated (Transpose, Reshape, Cast, Expand,
  // ...): a read of it is a read of the input (graph/parameters.cpp).
  kTraitRelayout = 1u << 11,
  // Reads only its input's shape, never its data (Shape, Size): the result is known before run time.
  kTraitShapeOnly = 1u << 12,
  // Over the micro-batch chunk axis, a combination of the chunks' values rather than an op run per
  // chunk: planner/chunking.cpp rewrites it into local Adds, Concats or Slices (or rejects it).
  kTraitCombinesChunks = 1u << 13,
};

// One small instance of an op for the registry-driven tests: the finite-difference gradient check
// (tests/unit/grad_check_test.cpp) and the split-state table (tests/unit/op_registry_test.cpp).
struct ExampleInput {
  Shape shape;
  double lo = -1.0, hi = 1.0;  // float inputs: uniform in [lo, hi], float64
  std::optional<Tensor> data;  // fixed data (indices, masks, constant operands): never differentiated
};
struct OpExample {
  std::string name;
  std::vector<ExampleInput> inputs;
  AttrMap attrs;
  int outputs = 1;
};
ExampleInput ex_float(Shape shape, double lo = -1.0, double hi = 1.0);
ExampleInput ex_ints(std::vector<int64_t> values, Shape shape);
ExampleInput ex_data(Tensor t);

struct OpCost {
  double flops = 0;  // floating-point operations of one execution
  double bytes = 0;  // bytes read and written
};

struct OpSchema {
  std::string domain;  // "" for ai.onnx, "oases" for the project's own ops
  std::string op_type;
  int min_inputs = 0, max_inputs = INT_MAX;
  int min_outputs = 1, max_outputs = 1;
  // Oldest version of the op (its ONNX since-version) these rules read correctly. The importer takes
  // a model below kMinOpset when each op is unchanged since then in ONNX's schema history or at
  // least this old here (`normalize` turning the older form canonical, e.g. Unsqueeze-11's axes
  // attribute); anything older is an error naming the node.
  int oldest_version = kMinOpset;
  // Rewrites the node into canonical form (opset differences, constant operands into
  // attributes). Runs before `infer`, once the node's inputs are as constant as they get.
  std::function<Status(InferContext&)> normalize;
  // Sets every output's dtype and shape from the inputs' and the attributes.
  std::function<Status(InferContext&)> infer;
  // Gradient rule: emits IR nodes computing the inputs' gradients (graph/autodiff.h).
  std::function<Status(GradContext&)> grad;
  // Sharding rule: maps input specs to output specs (graph/sharding.h).
  std::function<Status(ShardContext&)> shard;
  // Partition lowering: rewrites the node of a local (per-rank template) graph whose attributes
  // carry global shapes or that has a distributed form (graph/lowering.h). Absent: the node runs
  // as it is on its local shapes.
  std::function<Status(LowerContext&)> lower;
  // FLOPs and bytes; `zero_cost` for views and shape bookkeeping.
  std::function<OpCost(const Graph&, const Node&)> cost;
  // Inputs through which no gradient flows (indices, masks, shape operands).
  std::vector<int> non_differentiable_inputs;
  // False: the op has no gradient rule on purpose (integer results, the backward ops themselves,
  // ops only made after autodiff); build_backward errs if a gradient must flow through it.
  bool differentiable = true;
  uint32_t traits = 0;  // OpTrait bits
  // Float inputs that mixed precision leaves in float32 (Attention's additive mask, Dropout's ratio).
  std::vector<int> float32_inputs;
  // Small instances for the registry-driven tests (every differentiable op has at least one).
  std::function<std::vector<OpExample>()> examples;
  bool foldable = true;    // deterministic and cheap: may be constant-folded
  int view_of_input = -1;  // output 0 may share this input's buffer (Reshape, Squeeze, ...)
  std::string doc;         // one line for `oases-import --ops`
};

class OpRegistry {
 public:
  // The registry with every op of the project registered.
  static const OpRegistry& global();
  // Registers a complete schema: each op file builds an op's every rule in one block, then adds it.
  OpSchema& add(OpSchema s);
  const OpSchema* find(const std::string& domain, const std::string& op_type) const;
  std::vector<const OpSchema*> all() const;

 private:
  std::map<std::pair<std::string, std::string>, OpSchema> ops_;
};

// The schema of a node's op, or nullptr.
const OpSchema* find_schema(const Node& n);
inline bool op_has_trait(const OpSchema* s, uint32_t t) {
  return s && (s->traits & t) != 0;
}
bool op_has_trait(const Node& n, uint32_t trait);

// The cost rule of ops that compute nothing and move nothing (views, shape bookkeeping).
OpCost zero_cost(const Graph& g, const Node& n);

// What the registry completeness check knows about kernels: names "Op" (ai.onnx) or
// "domain.Op"; a null set is not checked (e.g. no CUDA backend in the build).
struct KernelCoverage {
  const std::set<std::string>* cpu = nullptr;
  const std::set<std::string>* cuda = nullptr;  // CUDA kernels and the ops exempt from one, with reasons
};
// Every piece of `s` that is missing, one line each ("shape rule", "gradient rule or
// differentiable=false", ...); empty when the op is complete.
std::vector<std::string> missing_pieces(const OpSchema& s, const KernelCoverage& kernels);
// "MatMul", "oases.Attention": how kernel registries and profiles name an op.
std::string schema_key(const OpSchema& s);

// Domains the registry treats as the default one.
inline bool is_default_domain(const std::string& d) {
  return d.empty() || d == "ai.onnx";
}
constexpr const char* kOasesDomain = "oases";

// --- helpers shared by op files ---------------------------------------------------------------

// Moves constant input `slot` into an int-list attribute (Reshape's shape, reduction axes, ...).
// Returns false when the input is absent; an error when it exists but is not constant.
Expected<bool> operand_to_ints_attr(InferContext& c, int slot, const std::string& attr);
// Same for a scalar float operand (Clip min/max, Dropout ratio); `required_constant` false keeps a
// non-constant input in place.
Expected<bool> operand_to_float_attr(InferContext& c, int slot, const std::string& attr, bool required_constant);
// Drops trailing omitted inputs so that num_inputs() is meaningful.
void trim_inputs(InferContext& c);
// Normalised axes (sorted, unique) or an error naming the node.
Expected<std::vector<int64_t>> normalize_axes(const InferContext& c, const std::vector<int64_t>& axes, int64_t rank);

// Registration, one function per op family file in graph/ops/.
void register_elementwise_ops(OpRegistry& r);
void register_activation_ops(OpRegistry& r);
void register_matmul_ops(OpRegistry& r);
void register_conv_ops(OpRegistry& r);
void register_reduce_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_indexing_ops(OpRegistry& r);
void register_norm_ops(OpRegistry& r);
void register_softmax_ops(OpRegistry& r);
void register_attention_ops(OpRegistry& r);
void register_loss_ops(OpRegistry& r);
void register_misc_ops(OpRegistry& r);
void register_grad_ops(OpRegistry& r);
void register_collective_ops(OpRegistry& r);
void register_fused_ops(OpRegistry& r);
// A collective that communicates (ShardSlice is local, not one): op_has_trait(n, kTraitCollective).
bool is_collective(const Node& n);

}  // namespace oases
