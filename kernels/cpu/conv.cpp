#include "kernels/cpu/conv.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm.h"

namespace oases::kernels {

namespace {

int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t d : v) p *= d;
  return p;
}

// For each kernel offset k and output position p: the offset of the input element it reads within
// one channel's spatial block, or -1 where it falls into the padding. [K, P], shared by every
// channel and image.
std::vector<int64_t> window_offsets(const ConvShape& s) {
  const size_t S = s.in.size();
  const int64_t K = s.kernel_size(), P = s.out_size();
  std::vector<int64_t> off(static_cast<size_t>(K * P));
  std::vector<int64_t> ki(S, 0), pi(S, 0);
  for (int64_t k = 0; k < K; ++k) {
    std::fill(pi.begin(), pi.end(), 0);
    for (int64_t p = 0; p < P; ++p) {
      int64_t o = 0;
      bool inside = true;
      for (size_t d = 0; d < S; ++d) {
        int64_t pos = pi[d] * s.strides[d] - s.pads[d] + ki[d] * s.dilations[d];
        if (pos < 0 || pos >= s.in[d]) {
          inside = false;
          break;
        }
        o = o * s.in[d] + pos;
      }
      off[static_cast<size_t>(k * P + p)] = inside ? o : -1;
      for (size_t d = S; d-- > 0;) {  // next output position, last dim fastest
        if (++pi[d] < s.out[d]) break;
        pi[d] = 0;
      }
    }
    for (size_t d = S; d-- > 0;) {
      if (++ki[d] < s.kernel[d]) break;
      ki[d] = 0;
    }
  }
  return off;
}

// col[C·K, P] from one image x[C, D...].
template <class T>
void im2col(const ConvShape& s, const std::vector<int64_t>& off, const T* x, T* col) {
  const int64_t K = s.kernel_size(), P = s.out_size(), D = s.in_size();
  for (int64_t c = 0; c < s.in_channels; ++c) {
    const T* xc = x + c * D;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t* o = off.data() + k * P;
      T* row = col + (c * K + k) * P;
      for (int64_t p = 0; p < P; ++p) row[p] = o[p] >= 0 ? xc[o[p]] : T(0);
    }
  }
}

// dx[C, D...] = Σ of col[C·K, P] over the windows that read each element.
template <class T>
void col2im(const ConvShape& s, const std::vector<int64_t>& off, const T* col, T* dx) {
  const int64_t K = s.kernel_size(), P = s.out_size(), D = s.in_size();
  std::fill(dx, dx + s.in_channels * D, T(0));
  for (int64_t c = 0; c < s.in_channels; ++c) {
    T* dxc = dx + c * D;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t* o = off.data() + k * P;
      const T* row = col + (c * K + k) * P;
      for (int64_t p = 0; p < P; ++p) {
        if (o[p] >= 0) dxc[o[p]] += row[p];
      }
    }
  }
}

}  // namespace

int64_t ConvShape::in_size() const {
  return product(in);
}
int64_t ConvShape::kernel_size() const {
  return product(kernel);
}
int64_t ConvShape::out_size() const {
  return product(out);
}

template <class T>
void conv_forward(const ConvShape& s, const T* x, const T* w, const T* b, T* y) {
  const int64_t CK = s.in_channels * s.kernel_size(), P = s.out_size(), M = s.out_channels;
  std::vector<int64_t> off = window_offsets(s);
  std::vector<T> col(static_cast<size_t>(CK * P));
  for (int64_t n = 0; n < s.batch; ++n) {
    im2col(s, off, x + n * s.in_channels * s.in_size(), col.data());
    T* yn = y + n * M * P;
    if (b) {
      for (int64_t m = 0; m < M; ++m) std::fill(yn + m * P, yn + (m + 1) * P, b[m]);
    }
    gemm<T>(false, false, M, P, CK, T(1), w, CK, col.data(), P, b ? T(1) : T(0), yn, P);
  }
}

template <class T>
void conv_grad_input(const ConvShape& s, const T* dy, const T* w, T* dx) {
  const int64_t CK = s.in_channels * s.kernel_size(), P = s.out_size(), M = s.out_channels;
  std::vector<int64_t> off = window_offsets(s);
  std::vector<T> col(static_cast<size_t>(CK * P));
  for (int64_t n = 0; n < s.batch; ++n) {
    gemm<T>(true, false, CK, P, M, T(1), w, CK, dy + n * M * P, P, T(0), col.data(), P);
    col2im(s, off, col.data(), dx + n * s.in_channels * s.in_size());
  }
}

template <class T>
void conv_grad_weight(const ConvShape& s, const T* dy, const T* x, T* dw) {
  const int64_t CK = s.in_channels * s.kernel_size(), P = s.out_size(), M = s.out_channels;
  std::vector<int64_t> off = window_offsets(s);
  std::vector<T> col(static_cast<size_t>(CK * P));
  if (s.batch == 0) std::fill(dw, dw + M * CK, T(0));
  for (int64_t n = 0; n < s.batch; ++n) {
    im2col(s, off, x + n * s.in_channels * s.in_size(), col.data());
    gemm<T>(false, true, M, CK, P, T(1), dy + n * M * P, P, col.data(), P, n == 0 ? T(0) : T(1), dw, CK);
  }
}

template void conv_forward<float>(const ConvShape&, const float*, const float*, const float*, float*);
template void conv_forward<double>(const ConvShape&, const double*, const double*, const double*, double*);
template void conv_grad_input<float>(const ConvShape&, const float*, const float*, float*);
template void conv_grad_input<double>(const ConvShape&, const double*, const double*, double*);
template void conv_grad_weight<float>(const ConvShape&, const float*, const float*, float*);
template void conv_grad_weight<double>(const ConvShape&, const double*, const double*, double*);

}  // namespace oases::kernels
