#include "executor/half_adapter.h"

#include <map>
#include <mutex>

#include "executor/cpu/common.h"

namespace oases {

bool has_half_operand(const Graph& g, const Node& n) {
  auto half = [&](ValueId v) { return v != kNoId && (g.value(v).dtype == DType::kF16 || g.value(v).dtype == DType::kBF16); };
  for (ValueId v : n.inputs) {
    if (half(v)) return true;
  }
  for (ValueId v : n.outputs) {
    if (half(v)) return true;
  }
  return false;
}

const CpuKernelFn* half_adapted_kernel(const std::string& domain, const std::string& op, const CpuKernelFn* fn) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, CpuKernelFn> wrapped;
  std::lock_guard<std::mutex> lock(mu);
  auto it = wrapped.find({domain, op});
  if (it == wrapped.end()) {
    CpuKernelFn inner = *fn;
    it = wrapped.emplace(std::make_pair(domain, op), [inner](KernelContext& c) { cpu::with_half_as_float(c, inner); }).first;
  }
  return &it->second;
}

}  // namespace oases
