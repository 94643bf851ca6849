#include "graph/op_registry.h"

#include <algorithm>

namespace oases {

void InferContext::set_output(int i, DType dtype, Shape shape) {
  ValueId v = node_.output(i);
  if (v == kNoId) return;
  Value& val = graph_.value(v);
  val.dtype = dtype;
  val.shape = std::move(shape);
  val.has_shape = true;
}

const OpRegistry& OpRegistry::global() {
  static const OpRegistry reg = [] {
    OpRegistry r;
    register_elementwise_ops(r);
    register_activation_ops(r);
    register_matmul_ops(r);
    register_conv_ops(r);
    register_reduce_ops(r);
    register_shape_ops(r);
    register_indexing_ops(r);
    register_norm_ops(r);
    register_softmax_ops(r);
    register_attention_ops(r);
    register_loss_ops(r);
    register_misc_ops(r);
    register_grad_ops(r);
    register_collective_ops(r);
    register_fused_ops(r);
    return r;
  }();
  return reg;
}

OpSchema& OpRegistry::add(OpSchema s) {
  auto key = std::make_pair(s.domain, s.op_type);
  ops_[key] = std::move(s);
  return ops_[key];
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op_type) const {
  auto it = ops_.find({is_default_domain(domain) ? std::string() : domain, op_type});
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<const OpSchema*> OpRegistry::all() const {
  std::vector<const OpSchema*> out;
  for (const auto& [k, v] : ops_) out.push_back(&v);
  return out;
}

const OpSchema* find_schema(const Node& n) {
  return OpRegistry::global().find(n.domain, n.op_type);
}

bool op_has_trait(const Node& n, uint32_t trait) {
  return op_has_trait(find_schema(n), trait);
}

OpCost zero_cost(const Graph&, const Node&) {
  return OpCost{};
}

ExampleInput ex_float(Shape shape, double lo, double hi) {
  ExampleInput e;
  e.shape = std::move(shape);
  e.lo = lo;
  e.hi = hi;
  return e;
}

ExampleInput ex_ints(std::vector<int64_t> values, Shape shape) {
  return ex_data(Tensor::from_int64(values, std::move(shape)));
}

ExampleInput ex_data(Tensor t) {
  ExampleInput e;
  e.shape = t.shape();
  e.data = std::move(t);
  return e;
}

std::string schema_key(const OpSchema& s) {
  return is_default_domain(s.domain) ? s.op_type : s.domain + "." + s.op_type;
}

std::vector<std::string> missing_pieces(const OpSchema& s, const KernelCoverage& kernels) {
  std::vector<std::string> miss;
  const bool post = (s.traits & kTraitPostPartition) != 0;
  if (!s.infer) miss.push_back("shape rule (infer)");
  if (s.differentiable && !s.grad) miss.push_back("gradient rule (or differentiable = false)");
  if (!s.differentiable && s.grad) miss.push_back("differentiable = false contradicts its gradient rule");
  if (s.differentiable && s.grad && !s.examples) miss.push_back("examples for the gradient check");
  if (s.examples && s.examples().empty()) miss.push_back("examples (the list is empty)");
  if (!s.shard && !post) miss.push_back("sharding rule (or shard_replicated_only, or the post-partition trait)");
  if (s.shard && post) miss.push_back("a post-partition op needs no sharding rule");
  if (!s.cost) miss.push_back("cost rule (or zero_cost)");
  const std::string key = schema_key(s);
  const bool runs = (s.traits & kTraitNoKernel) == 0;
  if (runs && kernels.cpu && !kernels.cpu->count(key)) miss.push_back("CPU kernel (or the no-kernel trait)");
  if (!runs && kernels.cpu && kernels.cpu->count(key)) miss.push_back("the no-kernel trait contradicts its CPU kernel");
  if (runs && kernels.cuda && !kernels.cuda->count(key)) miss.push_back("CUDA kernel (or a reason in executor/cuda_coverage.cpp)");
  return miss;
}

Expected<bool> operand_to_ints_attr(InferContext& c, int slot, const std::string& attr) {
  if (!c.has_input(slot)) return false;
  const Tensor* t = c.constant(slot);
  if (!t) {
    return c.fail(
        "input {} ('{}') sets the {} but is not known before run time; Oases needs static shapes "
        "(bind the inputs it depends on with --dim/--shape)",
        slot, c.input(slot).name, attr);
  }
  if (!is_integer(t->dtype())) return c.fail("input {} ('{}') must be an integer tensor", slot, c.input(slot).name);
  if (t->numel() > (1 << 20)) return c.fail("input {} ('{}') is too large for a shape operand", slot, c.input(slot).name);
  c.node().attrs.set_ints(attr, t->to_int64());
  c.graph().set_input(c.node().id, slot, kNoId);
  return true;
}

Expected<bool> operand_to_float_attr(InferContext& c, int slot, const std::string& attr, bool required_constant) {
  if (!c.has_input(slot)) return false;
  const Tensor* t = c.constant(slot);
  if (!t) {
    if (!required_constant) return false;
    return c.fail("input {} ('{}') sets {} but is not known before run time", slot, c.input(slot).name, attr);
  }
  if (t->numel() != 1) return c.fail("input {} ('{}') must be a scalar", slot, c.input(slot).name);
  c.node().attrs.set_float(attr, static_cast<float>(t->item()));
  c.graph().set_input(c.node().id, slot, kNoId);
  return true;
}

void trim_inputs(InferContext& c) {
  Node& n = c.node();
  while (!n.inputs.empty() && n.inputs.back() == kNoId) n.inputs.pop_back();
}

Expected<std::vector<int64_t>> normalize_axes(const InferContext& c, const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t a : axes) {
    int64_t n = normalize_axis(a, rank);
    if (n < 0) return c.fail("axis {} is out of range for rank {}", a, rank);
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) return c.fail("repeated axis in {}", fmt::join(axes, ","));
  return out;
}

}  // namespace oases
