// Scaled-dot-product attention, forward and backward, per (batch, head), never forming more of the
// score matrix S than a block of query rows at a time:
//   forward:  S = scale·q kᵀ (+ mask, causal limit) ; P = softmax(S) ; o = P v ; lse = log Σ_j exp(S_ij)
//   backward: P = exp(S − lse) recomputed ; dV = Pᵀ dO ; dP = dO Vᵀ ; dS = P ∘ (dP − rowsum(dO ∘ O)) ;
//             dQ = scale · dS K ; dK = scale · dSᵀ Q
// Gradients are written (=); dK and dV sum over the query heads that share a key/value head.
#pragma once

#include <cstdint>

namespace oases::kernels {

// Fused scaled-dot-product attention, per (batch, head):
//   S = q kᵀ · scale (+ mask) (causal: key j > query i + (Tk - Tq) masked) ; P = softmax(S) ; o = P v
// q [B, H, Tq, D], k/v [B, Hkv, Tk, D|Dv]; mask (float additive or uint8 boolean, keep where 1)
// broadcast through mask_strides over [B, H, Tq, Tk] (stride 0 where broadcast).
// If probs != nullptr it receives P ([B, H, Tq, Tk]) for the backward pass.
struct AttentionShape {
  int64_t batch, heads, kv_heads, tq, tk, d, dv;
  bool causal;
  float scale;
};
// Element strides (batch, head, time) of q, k, v and out, the last dim contiguous; null layout:
// all four contiguous [B, H, T, D]. Lets the kernel read heads straight out of a fused
// [B, T, 3·H·D] projection and write [B, T, H, Dv] (graph/passes/fusion.h).
struct AttentionLayout {
  int64_t q[3], k[3], v[3], o[3];
  static AttentionLayout contiguous(const AttentionShape& s);
};
// lse (may be null) receives log(sum(exp(S_i))) per query row [B, H, Tq] for the backward pass.
template <class T>
void attention(const AttentionShape& s, const T* q, const T* k, const T* v, const void* mask, bool mask_is_bool,
               const int64_t* mask_strides, T* out, float* lse, const AttentionLayout* layout = nullptr);

// Element strides (batch, head, time) of the backward pass's operands and gradients, the last dim
// contiguous; null: all contiguous [B, H, T, D]. Lets a device program's fused backward read q, k,
// v from the fused projection and write dq, dk, dv into the gradient of that projection
// (graph/passes/fusion.h). The gradients' regions must not overlap one another.
struct AttentionGradLayout {
  int64_t q[3], k[3], v[3], o[3], dout[3], dq[3], dk[3], dv[3];
  static AttentionGradLayout contiguous(const AttentionShape& s);
};

// Backward of attention, recomputing P = exp(S - lse) per head:
//   dV = Pᵀ dO ; dP = dO Vᵀ ; dS = P ∘ (dP - rowsum(dO ∘ O)) ; dQ = scale · dS K ; dK = scale · dSᵀ Q
// dk/dv accumulate over the query heads sharing a key/value head (grouped-query attention).
template <class T>
void attention_backward(const AttentionShape& s, const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse,
                        const void* mask, bool mask_is_bool, const int64_t* mask_strides, T* dq, T* dk, T* dv,
                        const AttentionGradLayout* layout = nullptr);

}  // namespace oases::kernels
