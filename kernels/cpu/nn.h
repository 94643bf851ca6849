// Neural-network kernels on rows: softmax, log-softmax, LayerNorm, RMSNorm, fused attention,
// softmax cross-entropy. A tensor is viewed as [outer, n, inner] around the op's axis; most
// callers have inner == 1 (the last axis).
#pragma once

#include <cstdint>
#include <vector>

namespace oases::kernels {

// y = softmax(x) (or log_softmax) over the middle dim of [outer, n, inner].
template <class T>
void softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log);

// LayerNorm over rows of length n: y = (x - mean) * rstd * scale + bias (bias may be null).
// mean/rstd (may be null) receive per-row statistics in float.
template <class T>
void layernorm(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t rows, int64_t n, float eps);
// RMSNorm over rows: y = x * rstd * scale, rstd = 1/sqrt(mean(x²) + eps).
template <class T>
void rmsnorm(const T* x, const T* scale, T* y, float* rstd, int64_t rows, int64_t n, float eps);

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

// Backward of attention, recomputing P = exp(S - lse) per head:
//   dV = Pᵀ dO ; dP = dO Vᵀ ; dS = P ∘ (dP - rowsum(dO ∘ O)) ; dQ = scale · dS K ; dK = scale · dSᵀ Q
// dk/dv accumulate over the query heads sharing a key/value head (grouped-query attention).
template <class T>
void attention_backward(const AttentionShape& s, const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse,
                        const void* mask, bool mask_is_bool, const int64_t* mask_strides, T* dq, T* dk, T* dv);

// Softmax cross-entropy over scores viewed as [N, C, D] (D = product of extra dims) with labels
// [N, D]; per-sample losses into `losses` (0 where ignored), log-probabilities into logp when
// non-null. Returns the number of counted (not ignored) labels, or -(1 + position) of the first
// label outside [0, C).
template <class T>
int64_t softmax_cross_entropy(const T* scores, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d,
                              int64_t ignore_index, T* losses, T* logp, double* weight_sum);

}  // namespace oases::kernels
