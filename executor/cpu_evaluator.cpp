#include "executor/cpu_evaluator.h"

namespace oases {

const CpuKernelRegistry& CpuKernelRegistry::global() {
  static const CpuKernelRegistry reg = [] {
    CpuKernelRegistry r;
    register_cpu_elementwise(r);
    register_cpu_layout(r);
    register_cpu_nn(r);
    register_cpu_collectives(r);
    register_cpu_fused(r);
    return r;
  }();
  return reg;
}

void CpuKernelRegistry::add(const std::string& domain, const std::string& op, CpuKernelFn fn) {
  fns_[{domain, op}] = std::move(fn);
}

const CpuKernelFn* CpuKernelRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = fns_.find({domain == "ai.onnx" ? std::string() : domain, op});
  return it == fns_.end() ? nullptr : &it->second;
}

std::vector<std::string> CpuKernelRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : fns_) out.push_back(k.first.empty() ? k.second : k.first + "." + k.second);
  return out;
}

Expected<std::vector<Tensor>> CpuEvaluator::evaluate(const Graph& g, const Node& node, const std::vector<Tensor>& inputs) const {
  const CpuKernelFn* fn = CpuKernelRegistry::global().find(node.domain, node.op_type);
  if (!fn) return error("{}: no CPU kernel", node.describe());
  KernelContext c;
  c.graph = &g;
  c.node = &node;
  RunState st;
  c.state = &st;
  for (const Tensor& t : inputs) {
    TensorView tv;
    if (t.defined()) {
      tv.dtype = t.dtype();
      tv.shape = t.shape();
      tv.data = const_cast<void*>(t.raw());
    }
    c.in.push_back(tv);
  }
  std::vector<Tensor> outs;
  for (ValueId o : node.outputs) {
    if (o == kNoId) {
      outs.emplace_back();
      c.out.emplace_back();
      continue;
    }
    const Value& v = g.value(o);
    outs.emplace_back(v.dtype, v.shape);
    c.out.push_back(TensorView{v.dtype, v.shape, outs.back().raw_mutable()});
  }
  try {
    (*fn)(c);
  } catch (const OasesError& e) {
    return Status::error(e.what());
  }
  return outs;
}

}  // namespace oases
