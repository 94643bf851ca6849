// Cross-entropy, NLL, embedding and the vocabulary-parallel helpers, forward and backward (math in
// loss.cu and embedding.cu). Labels and indices are int64 or int32 (`idx64`). A label or index
// outside its range cannot throw from a kernel: the kernel records fault_base + position with
// atomicMin in `*fault` (the executor checks it after the step and names the node and position).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/check.h"

namespace oases::cuda {

struct Fault {
  unsigned long long* slot = nullptr;  // device word, ULLONG_MAX when nothing failed
  unsigned long long base = 0;         // added to the position (the executor encodes the instruction)
};

// Scores [N, C, D] (D = product of extra dims), labels [N, D], weights [C] or null.
struct LossDesc {
  int64_t n = 0, c = 0, d = 1;
  int64_t ignore_index = INT64_MIN;  // INT64_MIN: none
  int reduction = 1;                 // 0 none, 1 mean, 2 sum
  bool idx64 = true;
};
// Softmax cross-entropy: loss = (reduction of) −w_l·(x_l − logsumexp x); logp (may be null) gets
// log-probabilities [N, C, D]. `scratch` holds loss_scratch_floats(desc) floats.
size_t loss_scratch_floats(const LossDesc& l);
void softmax_cross_entropy_forward(const LossDesc& l, Elem t, const void* scores, const void* labels, const void* weights, void* loss,
                                   void* logp, float* scratch, Fault f, cudaStream_t s);
// dscores = coef·w_l·(softmax(x) − onehot(l)), coef = dloss / Σw (mean), dloss (sum), dloss[s] (none).
void softmax_cross_entropy_backward(const LossDesc& l, Elem t, const void* dloss, const void* scores, const void* labels,
                                    const void* weights, void* dscores, float* scratch, Fault f, cudaStream_t s);
// The same with scores of type ts (fp16/bf16 widened per element under a float32 loss t: a Cast
// before the loss folded in) and, backward, dscores of type td (t, or ts: rounded once).
void softmax_cross_entropy_forward(const LossDesc& l, Elem t, Elem ts, const void* scores, const void* labels, const void* weights,
                                   void* loss, void* logp, float* scratch, Fault f, cudaStream_t s);
void softmax_cross_entropy_backward(const LossDesc& l, Elem t, Elem ts, Elem td, const void* dloss, const void* scores, const void* labels,
                                    const void* weights, void* dscores, float* scratch, Fault f, cudaStream_t s);
// NLL on log-probabilities: loss = (reduction of) −w_l·x_l ; dx = −coef·w_l at the label, 0 elsewhere.
void nll_forward(const LossDesc& l, Elem t, const void* logp, const void* labels, const void* weights, void* loss, float* scratch, Fault f,
                 cudaStream_t s);
void nll_backward(const LossDesc& l, Elem t, const void* dloss, const void* labels, const void* weights, void* dx, float* scratch, Fault f,
                  cudaStream_t s);

// Vocabulary-parallel pieces over [N, C, D] with this rank's classes [start, start + C):
//   sharded_pick        out[n, d] = z[n, l − start, d] when the label is local, else 0
//   sharded_onehot_sub  out = p − onehot(l − start) (ignored labels: the column is zeroed)
void sharded_pick(Elem t, const void* z, const void* labels, bool idx64, void* out, int64_t n, int64_t c, int64_t d, int64_t start,
                  cudaStream_t s);
void sharded_onehot_sub(Elem t, const void* p, const void* labels, bool idx64, void* out, int64_t n, int64_t c, int64_t d, int64_t start,
                        bool has_ignore, int64_t ignore, cudaStream_t s);

// Embedding / Gather over [outer, dim, inner] along the gathered axis:
//   forward   out[o, i, e] = data[o, idx_i − start, e] for indices inside [start, start + dim) of a
//             table of `total` rows (negative indices count from `total`); rows of other shards
//             are zeros when `zero_foreign`, a fault otherwise
//   backward  ddata[o, idx_i − start, e] += dy[o, i, e] (zeroed first); fp32 atomics, so the order of
//             the additions (and the last bits of the sums) can vary run to run; fp16/bf16 tables
//             accumulate in the fp32 `scratch` (outer·dim·inner floats, may be null for fp32)
void gather_forward(size_t es, const void* data, const void* idx, bool idx64, int64_t nidx, void* out, int64_t outer, int64_t dim,
                    int64_t inner, int64_t start, int64_t total, bool zero_foreign, Fault f, cudaStream_t s);
void gather_backward(Elem t, const void* dy, const void* idx, bool idx64, int64_t nidx, void* ddata, int64_t outer, int64_t dim,
                     int64_t inner, int64_t start, int64_t total, float* scratch, Fault f, cudaStream_t s);

}  // namespace oases::cuda
