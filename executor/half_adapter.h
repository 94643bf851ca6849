// fp16/bf16 operands on the CPU: mixed-precision graphs (--dtype bf16|fp16) carry 16-bit values
// through ops whose CPU kernels compute in float32 or float64 only. The adapter runs such a kernel
// on float32 copies of its 16-bit inputs and rounds its 16-bit outputs once at the end (what the
// CUDA kernels do per element), so every op runs in mixed precision on the CPU too, slowly.
#pragma once

#include "executor/kernel_context.h"

namespace oases {

bool has_half_operand(const Graph& g, const Node& n);
// The kernel of (domain, op) wrapped by the adapter; the pointer stays valid for the process.
const CpuKernelFn* half_adapted_kernel(const std::string& domain, const std::string& op, const CpuKernelFn* fn);

}  // namespace oases
