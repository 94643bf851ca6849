// Normalisations over rows of length n (the trailing dims from the op's axis), forward and backward.
//   layernorm:      μ = mean(x), r = 1/√(var(x) + ε), x̂ = (x − μ)·r, y = x̂∘γ + β
//   rmsnorm:        r = 1/√(mean(x²) + ε), x̂ = x·r, y = x̂∘γ
//   layernorm_grad: g = dy∘γ: dx = r·(g − mean(g) − x̂·mean(g∘x̂)), dγ = Σ_rows dy∘x̂, dβ = Σ_rows dy
//   rmsnorm_grad:   g = dy∘γ: dx = r·(g − x̂·mean(g∘x̂)), dγ = Σ_rows dy∘x̂
// The forward saves μ and r per row in float for the backward. dx is written (=); dγ and dβ are
// written too, summed over rows in a fixed block order so that the bits do not depend on the
// thread count.
#pragma once

#include <cstdint>

namespace oases::kernels {

// y = (x - mean) * rstd * scale + bias (bias may be null); mean/rstd (may be null) receive the
// per-row statistics.
template <class T>
void layernorm(const T* x, const T* scale, const T* bias, T* y, float* mean, float* rstd, int64_t rows, int64_t n, float eps);
template <class T>
void rmsnorm(const T* x, const T* scale, T* y, float* rstd, int64_t rows, int64_t n, float eps);

// dscale, dbias may be null (not needed).
template <class T>
void layernorm_grad(const T* dy, const T* x, const T* scale, const float* mean, const float* rstd, T* dx, T* dscale, T* dbias, int64_t rows,
                    int64_t n);
template <class T>
void rmsnorm_grad(const T* dy, const T* x, const T* scale, const float* rstd, T* dx, T* dscale, int64_t rows, int64_t n);

}  // namespace oases::kernels
