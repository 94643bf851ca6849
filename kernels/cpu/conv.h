// Convolution (ONNX Conv with group 1) over any number S of spatial dims, by im2col and GEMM.
//   x [N, C, D1..DS], w [M, C, K1..KS], b [M] (optional), y [N, M, O1..OS] with
//   O_i = (D_i + pad_begin_i + pad_end_i - dil_i·(K_i - 1) - 1) / stride_i + 1.
// Per image n, with K = ΠK_i and P = ΠO_i:
//   col[C·K, P] = im2col(x[n])                (a padded position reads 0)
//   y[n] [M, P] = w [M, C·K] · col + b         (b broadcast over P)
// Backward (gradients are written, never accumulated into):
//   dw [M, C·K] = Σ_n dy[n] [M, P] · col[n]ᵀ
//   dx[n]       = col2im(wᵀ [C·K, M] · dy[n])  (overlapping windows add up)
// The bias gradient is a plain reduction of dy over N and the spatial dims (done by the graph).
#pragma once

#include <cstdint>
#include <vector>

namespace oases::kernels {

struct ConvShape {
  int64_t batch = 0, in_channels = 0, out_channels = 0;
  std::vector<int64_t> in, kernel, out;           // spatial sizes, S each
  std::vector<int64_t> strides, pads, dilations;  // pads: S begins then S ends (ONNX order)
  int64_t in_size() const;
  int64_t kernel_size() const;
  int64_t out_size() const;
};

template <class T>
void conv_forward(const ConvShape& s, const T* x, const T* w, const T* b, T* y);
template <class T>
void conv_grad_input(const ConvShape& s, const T* dy, const T* w, T* dx);
template <class T>
void conv_grad_weight(const ConvShape& s, const T* dy, const T* x, T* dw);

}  // namespace oases::kernels
