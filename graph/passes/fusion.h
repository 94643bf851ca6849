// Executor-level fusion: rewrites a program's own copy of the canonical graph so that short chains
// of nodes run as one CPU kernel of the "oases.cpu" domain, an op that only the executor knows (the
// canonical graph, its MatMul → Add bias patterns and every ValueId a caller holds stay as they
// are; the passes, the planner and autodiff never see these ops).
//
//   MatMul / MatMulT reading Transpose(W) (last two axes swapped)  → reads W with the operand's
//       transpose flag toggled (no copy of W: e.g. GPT-2's tied LM head, wteᵀ, 154 MB a run)
//   MatMul → Add(bias over the last axis) [→ Gelu | Relu | → Add(residual)]
//                                                                  → oases.cpu.FusedMatMul: one GEMM
//       whose blocks get bias, activation or residual while still in cache
//   Transpose(op(A)·op(B)) (last two axes)                        → op(B)ᵀ·op(A)ᵀ written directly
//       (e.g. the tied LM head's weight gradient)
//   Add(X, GatherGrad(dy, idx))                                     → oases.cpu.AddGatherGrad: dy's
//       rows added into X (the tied embedding's two gradient halves), in place when X dies
//   oases.Attention whose q/k/v are Transpose(0,2,1,3)(Reshape(Split part of a [B, T, W] value))
//   and whose output goes through Transpose(0,2,1,3)                → oases.cpu.Attention reading
//       and writing with strides (inference graphs; in training the transposed values have
//       other readers and stay)
//   device programs, training: MatMul → Add(bias) → Gelu(tanh) whose pre-activation the GELU's
//       gradient reads too → oases.device.FusedMatMul writing both (cuBLASLt's GELU_AUX_BIAS); and
//       GeluGrad(tanh)(product, X) [→ ReduceSum over all axes but the last, the bias gradient]
//       → oases.device.MatMulGeluGrad (DGELU_BGRAD)
//   device programs: oases.Attention and its oases.AttentionGrad together, as oases.device.Attention
//       / AttentionGrad reading q, k, v, O and dO through strides and writing dq, dk, dv into the
//       fused projection's gradient (the head transposes, the qkv Split and the Concat of its
//       gradient, in training too)
//
// The executor also names, for the memory plan, the inputs whose buffers a kernel may overwrite
// with its outputs (inplace_outputs below).
//
// OASES_NO_FUSION=1 turns all of it off; OASES_NO_DEVICE_FUSION=attention,gelu,loss (any of them)
// leaves those device fusions out.
//
// A chain is fused only where its inner values have no other reader and are neither graph
// outputs nor in `keep`. The fused node writes the chain's last value and takes the place of the
// chain's last node in `order`; removed nodes leave `order`.
#pragma once

#include <set>
#include <vector>

#include "graph/graph.h"

namespace oases {

struct FusionStats {
  int transposes_folded = 0;  // Transpose nodes no longer run
  int bias = 0;               // MatMul + Add fused
  int activation = 0;         // ... + Gelu/Relu fused
  int residual = 0;           // ... + Add of a same-shaped value fused
  int gather_grad = 0;        // Add(X, GatherGrad) fused
  int attention = 0;          // attention reading/writing through head transposes
  int loss_casts = 0;         // Casts around softmax cross-entropy folded into the loss (device)
  int gelu_aux = 0;           // products writing a GELU and its input, which its gradient reads (device)
  int gelu_grad = 0;          // backward products with the GELU's gradient [and the bias gradient] (device)
  int dead = 0;               // nodes left without readers, removed
};

// The domain of the device programs' fused products (the same FusedMatMul contract as the CPU's).
inline constexpr const char* kDeviceFusedDomain = "oases.device";

// `slots` (optional) receives, for each node of the fused order, its place in the order before
// fusion (a fused node stands where its chain's last node stood).
FusionStats fuse_for_cpu(Graph& g, std::vector<NodeId>& order, const std::set<ValueId>& keep, std::vector<size_t>* slots = nullptr);
// For a device's kernels: the products (transposes folded into the operand flags; bias,
// activation and residual epilogues, fp32 and the 16-bit types too) as oases.device.FusedMatMul,
// which the CUDA backend runs through cuBLASLt epilogues, and softmax cross-entropy reading 16-bit
// logits (oases.device.SoftmaxCrossEntropyLoss/Grad: the Casts to float32 and back folded in),
// and attention through strides (oases.device.Attention/AttentionGrad); none of the CPU's other ops.
FusionStats fuse_for_device(Graph& g, std::vector<NodeId>& order, const std::set<ValueId>& keep, std::vector<size_t>* slots = nullptr);

// The (output, input slot) pairs whose input buffer the CPU kernel of `n` may overwrite with that
// output: elementwise kernels that read element i before writing it (output 0 over the operand
// shaped as the output), and the all-reduce, whose output i is its input i reduced (one tensor or
// a bucket: the kernel packs the inputs before it writes any output). Empty where none.
struct InplacePair {
  int output = 0, input = 0;
};
std::vector<InplacePair> inplace_outputs(const Graph& g, const Node& n);

}  // namespace oases
