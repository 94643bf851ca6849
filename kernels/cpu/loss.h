// Classification losses over scores viewed as [N, C, D] (D = product of the dims after the class
// dim) with integer labels [N, D], optional class weights w [C] and an ignored label value.
//   softmax_cross_entropy:      logp = log_softmax(x) over C, loss[n, d] = −w_l · logp[n, l, d]
//   softmax_cross_entropy_grad: dx[n, :, d] = coef · (softmax(x)[n, :, d] − onehot(l)),
//                               coef = w_l · (dloss[n, d] per sample, or dloss / denom)
//   nll_loss:                   loss[n, d] = −w_l · logp[n, l, d] (logp already log-probabilities)
//   nll_loss_grad:              dlogp[n, l, d] = −coef, zero elsewhere
// Reductions (mean divides by Σ w over counted labels, sum, none) are the caller's; the gradient
// takes the scalar or per-sample upstream gradient and the mean's denominator. Ignored labels give
// a zero loss and a zero gradient.
#pragma once

#include <cstdint>

namespace oases::kernels {

// Per-sample losses into `losses` (0 where ignored), log-probabilities into logp when non-null.
// Returns the number of counted (not ignored) labels, or -(1 + position) of the first label
// outside [0, C).
template <class T>
int64_t softmax_cross_entropy(const T* scores, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d,
                              int64_t ignore_index, T* losses, T* logp, double* weight_sum);
// `dloss` is the scalar (reduction mean/sum) or per-sample ([N, D], reduction none) gradient.
template <class T>
void softmax_cross_entropy_grad(const T* dloss, bool per_sample, const T* scores, const int64_t* labels, const T* weights, int64_t n,
                                int64_t c, int64_t d, int64_t ignore_index, double denom, T* dscores);

// NegativeLogLikelihoodLoss on log-probabilities logp [N, C, D]: loss[n, d] = −w_l · logp[n, l, d];
// same contract as softmax_cross_entropy (the count, or -(1 + position) of a label outside [0, C)).
template <class T>
int64_t nll_loss(const T* logp, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d, int64_t ignore_index, T* losses,
                 double* weight_sum);
// dlogp[n, l, d] = −coef, zero elsewhere (coef as for softmax_cross_entropy_grad).
template <class T>
void nll_loss_grad(const T* dloss, bool per_sample, const int64_t* labels, const T* weights, int64_t n, int64_t c, int64_t d,
                   int64_t ignore_index, double denom, T* dlogp);
// The reduced loss of `count` per-sample losses: their sum in double, divided by weight_sum for
// the mean (0 when nothing was counted).
template <class T>
T reduce_losses(const T* losses, int64_t count, double weight_sum, bool mean);

}  // namespace oases::kernels
