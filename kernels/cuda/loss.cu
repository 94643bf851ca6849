// Losses, forward and backward side by side, scores viewed as [N, C, D], fp32 math:
//
//   softmax cross-entropy   lse = m + log Σ_c exp(x_c − m) ;  loss_s = −w_l (x_l − lse)   (0 where l = ignore)
//                           mean: Σ loss_s / Σ w_l over counted s ;  sum: Σ loss_s ;  none: loss_s
//                           dx_c = coef · w_l · (softmax(x)_c − [c = l]),  coef = dloss/Σw | dloss | dloss_s
//   NLL (log-probs in)      loss_s = −w_l x_l ;  dx_l = −coef · w_l, 0 elsewhere
//   vocabulary-parallel     pick the local label's logit, subtract the local one-hot (partitioned loss)
//
// One block per sample s = (n, d) for the row work; the reductions over samples run in one block
// in a fixed order (deterministic). Labels outside [0, C) are reported through the fault word.
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss.h"

namespace oases::cuda {

namespace {

__device__ __forceinline__ int64_t read_index(const void* p, bool idx64, int64_t i) {
  return idx64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

__device__ __forceinline__ void report(Fault f, int64_t pos) {
  atomicMin(f.slot, f.base + static_cast<unsigned long long>(pos));
}

// logsumexp of one sample's scores xr[a · d], a < c, in one pass: each thread keeps a running
// maximum and the sum of exponentials scaled to it; the block then combines the pairs.
template <class TX>
__device__ __forceinline__ float row_logsumexp(const TX* xr, int64_t c, int64_t d, float* red) {
  float m = -INFINITY, sum = 0.f;
  for (int64_t a = threadIdx.x; a < c; a += blockDim.x) {
    float x = to_float(xr[a * d]);
    if (x > m) {
      sum = sum * expf(m - x) + 1.f;
      m = x;
    } else if (x != -INFINITY) {
      sum += expf(x - m);  // NaN stays NaN
    }
  }
  float bm = block_max(m, red);
  float part = m == -INFINITY ? 0.f : sum * expf(m - bm);
  if (sum != sum) part = sum;  // a NaN score makes the sum NaN
  float total = block_sum(part, red);
  return bm + logf(total);
}

// Per sample: loss into scratch[s], counted weight into scratch[nd + s]; logp when asked. Scores of
// type TX (widened per element), weights, logp and the loss of type T.
template <class TX, class T>
__global__ void ce_rows_kernel(LossDesc l, const TX* x, const void* labels, const T* w, T* logp, float* scratch, Fault f, bool from_logits) {
  __shared__ float red[32];
  int64_t sidx = blockIdx.x, nd = l.n * l.d;
  int64_t i = sidx / l.d, j = sidx % l.d;
  const TX* xr = x + i * l.c * l.d + j;
  int64_t lab = read_index(labels, l.idx64, sidx);
  bool ignored = lab == l.ignore_index;
  bool bad = !ignored && (lab < 0 || lab >= l.c);
  float lse = 0.f;
  if (from_logits) {
    lse = row_logsumexp(xr, l.c, l.d, red);
    if (logp) {
      for (int64_t a = threadIdx.x; a < l.c; a += blockDim.x)
        logp[i * l.c * l.d + a * l.d + j] = from_float<T>(to_float(xr[a * l.d]) - lse);
    }
  }
  if (threadIdx.x == 0) {
    float loss = 0.f, wt = 0.f;
    if (bad) {
      report(f, sidx);
    } else if (!ignored) {
      wt = w ? to_float(w[lab]) : 1.f;
      loss = -(to_float(xr[lab * l.d]) - lse) * wt;
    }
    scratch[sidx] = loss;
    scratch[nd + sidx] = wt;
  }
}

// One block: out = Σ losses (/ Σ weights for mean); or the per-sample losses (none).
template <class T>
__global__ void loss_reduce_kernel(LossDesc l, const float* scratch, T* out) {
  __shared__ float red[32];
  int64_t nd = l.n * l.d;
  if (l.reduction == 0) {
    for (int64_t s = threadIdx.x; s < nd; s += blockDim.x) out[s] = from_float<T>(scratch[s]);
    return;
  }
  float tl = 0.f, tw = 0.f;
  for (int64_t s = threadIdx.x; s < nd; s += blockDim.x) {
    tl += scratch[s];
    tw += scratch[nd + s];
  }
  tl = block_sum(tl, red);
  tw = block_sum(tw, red);
  if (threadIdx.x == 0) out[0] = from_float<T>(l.reduction == 1 ? (tw > 0.f ? tl / tw : 0.f) : tl);
}

// One block: scratch[0] = Σ w_l over counted samples (the mean's denominator; 1 when zero).
template <class T>
__global__ void weight_sum_kernel(LossDesc l, const void* labels, const T* w, float* scratch, Fault f) {
  __shared__ float red[32];
  float tw = 0.f;
  for (int64_t s = threadIdx.x; s < l.n * l.d; s += blockDim.x) {
    int64_t lab = read_index(labels, l.idx64, s);
    if (lab == l.ignore_index) continue;
    if (lab < 0 || lab >= l.c) {
      report(f, s);
      continue;
    }
    tw += w ? to_float(w[lab]) : 1.f;
  }
  tw = block_sum(tw, red);
  if (threadIdx.x == 0) scratch[0] = l.reduction == 1 ? (tw > 0.f ? tw : 1.f) : 1.f;
}

template <class T>
__device__ __forceinline__ float coef_of(const LossDesc& l, const T* dloss, const float* denom, int64_t s) {
  return l.reduction == 0 ? to_float(dloss[s]) : to_float(dloss[0]) / denom[0];
}

// dscores (type TD) from scores (type TX) and dloss, weights (type T): two passes over the scores
template <class TX, class T, class TD>
__global__ void ce_grad_kernel(LossDesc l, const T* dloss, const TX* x, const void* labels, const T* w, TD* dx, const float* denom) {
  __shared__ float red[32];
  int64_t sidx = blockIdx.x;
  int64_t i = sidx / l.d, j = sidx % l.d;
  const TX* xr = x + i * l.c * l.d + j;
  TD* dr = dx + i * l.c * l.d + j;
  int64_t lab = read_index(labels, l.idx64, sidx);
  if (lab == l.ignore_index || lab < 0 || lab >= l.c) {  // out of range: reported by weight_sum_kernel
    for (int64_t a = threadIdx.x; a < l.c; a += blockDim.x) dr[a * l.d] = from_float<TD>(0.f);
    return;
  }
  float lse = row_logsumexp(xr, l.c, l.d, red);
  float coef = coef_of(l, dloss, denom, sidx) * (w ? to_float(w[lab]) : 1.f);
  for (int64_t a = threadIdx.x; a < l.c; a += blockDim.x) {
    float p = expf(to_float(xr[a * l.d]) - lse);
    dr[a * l.d] = from_float<TD>(coef * (p - (a == lab ? 1.f : 0.f)));
  }
}

template <class T>
__global__ void nll_grad_kernel(LossDesc l, const T* dloss, const void* labels, const T* w, T* dx, const float* denom) {
  int64_t nd = l.n * l.d;
  OASES_GRID_STRIDE(s, nd) {
    int64_t lab = read_index(labels, l.idx64, s);
    if (lab == l.ignore_index || lab < 0 || lab >= l.c) continue;
    int64_t i = s / l.d, j = s % l.d;
    float coef = coef_of(l, dloss, denom, s) * (w ? to_float(w[lab]) : 1.f);
    dx[(i * l.c + lab) * l.d + j] = from_float<T>(-coef);
  }
}

template <class T>
__global__ void sharded_pick_kernel(const T* z, const void* labels, bool idx64, T* out, int64_t n, int64_t c, int64_t d, int64_t start) {
  OASES_GRID_STRIDE(s, n * d) {
    int64_t i = s / d, j = s % d, lab = read_index(labels, idx64, s) - start;
    out[s] = lab >= 0 && lab < c ? z[(i * c + lab) * d + j] : from_float<T>(0.f);
  }
}

template <class T>
__global__ void sharded_onehot_sub_kernel(const T* p, const void* labels, bool idx64, T* out, int64_t n, int64_t c, int64_t d,
                                          int64_t start, bool has_ignore, int64_t ignore) {
  OASES_GRID_STRIDE(e, n * c * d) {
    int64_t j = e % d, a = (e / d) % c, i = e / (c * d);
    int64_t label = read_index(labels, idx64, i * d + j);
    float v = to_float(p[e]);
    if (has_ignore && label == ignore) {
      v = 0.f;
    } else if (label - start == a) {
      v -= 1.f;
    }
    out[e] = from_float<T>(v);
  }
}

unsigned rows_grid(int64_t rows) {
  if (rows > 0x7fffffff) throw std::runtime_error("[cuda loss] more than 2^31 samples");
  return static_cast<unsigned>(std::max<int64_t>(rows, 1));
}

}  // namespace

size_t loss_scratch_floats(const LossDesc& l) {
  return static_cast<size_t>(2 * l.n * l.d + 1);
}

namespace {
// Scores of type ts for a loss of type t: the same type, or 16-bit scores under a float32 loss.
template <class F>
void dispatch_scores(const char* what, Elem t, Elem ts, F&& f) {
  if (ts == t) {
    dispatch_floating(what, t, [&](auto tag) { f(tag, tag); });
    return;
  }
  if (t != Elem::kF32 || (ts != Elem::kF16 && ts != Elem::kBF16)) unsupported(what, ts);
  dispatch_floating(what, ts, [&](auto st) { f(st, Tag<float>{}); });
}
}  // namespace

void softmax_cross_entropy_forward(const LossDesc& l, Elem t, const void* scores, const void* labels, const void* weights, void* loss,
                                   void* logp, float* scratch, Fault f, cudaStream_t s) {
  softmax_cross_entropy_forward(l, t, t, scores, labels, weights, loss, logp, scratch, f, s);
}

void softmax_cross_entropy_forward(const LossDesc& l, Elem t, Elem ts, const void* scores, const void* labels, const void* weights,
                                   void* loss, void* logp, float* scratch, Fault f, cudaStream_t s) {
  if (l.n * l.d <= 0) return;
  dispatch_scores("SoftmaxCrossEntropyLoss", t, ts, [&](auto stag, auto tag) {
    using TX = typename decltype(stag)::type;
    using T = typename decltype(tag)::type;
    ce_rows_kernel<TX, T><<<rows_grid(l.n * l.d), 256, 0, s>>>(l, static_cast<const TX*>(scores), labels, static_cast<const T*>(weights),
                                                               static_cast<T*>(logp), scratch, f, true);
    OASES_CUDA_CHECK_LAUNCH("ce_rows_kernel");
    loss_reduce_kernel<T><<<1, 1024, 0, s>>>(l, scratch, static_cast<T*>(loss));
    OASES_CUDA_CHECK_LAUNCH("loss_reduce_kernel");
  });
}

void softmax_cross_entropy_backward(const LossDesc& l, Elem t, const void* dloss, const void* scores, const void* labels,
                                    const void* weights, void* dscores, float* scratch, Fault f, cudaStream_t s) {
  softmax_cross_entropy_backward(l, t, t, t, dloss, scores, labels, weights, dscores, scratch, f, s);
}

void softmax_cross_entropy_backward(const LossDesc& l, Elem t, Elem ts, Elem td, const void* dloss, const void* scores, const void* labels,
                                    const void* weights, void* dscores, float* scratch, Fault f, cudaStream_t s) {
  if (l.n * l.d <= 0) return;
  if (td != t && td != ts) unsupported("SoftmaxCrossEntropyGrad (dscores)", td);
  dispatch_scores("SoftmaxCrossEntropyGrad", t, ts, [&](auto stag, auto tag) {
    using TX = typename decltype(stag)::type;
    using T = typename decltype(tag)::type;
    weight_sum_kernel<T><<<1, 1024, 0, s>>>(l, labels, static_cast<const T*>(weights), scratch, f);
    OASES_CUDA_CHECK_LAUNCH("weight_sum_kernel");
    auto launch = [&](auto dtag) {
      using TD = typename decltype(dtag)::type;
      ce_grad_kernel<TX, T, TD><<<rows_grid(l.n * l.d), 256, 0, s>>>(l, static_cast<const T*>(dloss), static_cast<const TX*>(scores), labels,
                                                                     static_cast<const T*>(weights), static_cast<TD*>(dscores), scratch);
      OASES_CUDA_CHECK_LAUNCH("ce_grad_kernel");
    };
    if (td == t) {
      launch(tag);
    } else {
      launch(stag);
    }
  });
}

void nll_forward(const LossDesc& l, Elem t, const void* logp, const void* labels, const void* weights, void* loss, float* scratch, Fault f,
                 cudaStream_t s) {
  if (l.n * l.d <= 0) return;
  dispatch_floating("NegativeLogLikelihoodLoss", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // from_logits = false: lse = 0, the loss reads x_l directly (one thread per sample suffices)
    ce_rows_kernel<T, T><<<rows_grid(l.n * l.d), 32, 0, s>>>(l, static_cast<const T*>(logp), labels, static_cast<const T*>(weights), nullptr,
                                                          scratch, f, false);
    OASES_CUDA_CHECK_LAUNCH("ce_rows_kernel");
    loss_reduce_kernel<T><<<1, 1024, 0, s>>>(l, scratch, static_cast<T*>(loss));
    OASES_CUDA_CHECK_LAUNCH("loss_reduce_kernel");
  });
}

void nll_backward(const LossDesc& l, Elem t, const void* dloss, const void* labels, const void* weights, void* dx, float* scratch, Fault f,
                  cudaStream_t s) {
  if (l.n * l.d <= 0) return;
  dispatch_floating("NLLLossGrad", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    OASES_CUDA_CHECK(cudaMemsetAsync(dx, 0, static_cast<size_t>(l.n * l.c * l.d) * sizeof(T), s));
    weight_sum_kernel<T><<<1, 1024, 0, s>>>(l, labels, static_cast<const T*>(weights), scratch, f);
    OASES_CUDA_CHECK_LAUNCH("weight_sum_kernel");
    nll_grad_kernel<T><<<grid_for(l.n * l.d, kThreads), kThreads, 0, s>>>(l, static_cast<const T*>(dloss), labels,
                                                                          static_cast<const T*>(weights), static_cast<T*>(dx), scratch);
    OASES_CUDA_CHECK_LAUNCH("nll_grad_kernel");
  });
}

void sharded_pick(Elem t, const void* z, const void* labels, bool idx64, void* out, int64_t n, int64_t c, int64_t d, int64_t start,
                  cudaStream_t s) {
  if (n * d <= 0) return;
  dispatch_floating("ShardedPick", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sharded_pick_kernel<T>
        <<<grid_for(n * d, kThreads), kThreads, 0, s>>>(static_cast<const T*>(z), labels, idx64, static_cast<T*>(out), n, c, d, start);
  });
  OASES_CUDA_CHECK_LAUNCH("sharded_pick_kernel");
}

void sharded_onehot_sub(Elem t, const void* p, const void* labels, bool idx64, void* out, int64_t n, int64_t c, int64_t d, int64_t start,
                        bool has_ignore, int64_t ignore, cudaStream_t s) {
  if (n * c * d <= 0) return;
  dispatch_floating("ShardedOneHotSub", t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sharded_onehot_sub_kernel<T><<<grid_for(n * c * d, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(p), labels, idx64, static_cast<T*>(out), n, c, d, start, has_ignore, ignore);
  });
  OASES_CUDA_CHECK_LAUNCH("sharded_onehot_sub_kernel");
}

}  // namespace oases::cuda
