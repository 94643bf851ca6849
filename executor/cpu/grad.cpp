// CPU glue for the backward ops of graph/ops/grad_ops.cpp.
#include <cmath>
#include <limits>

#include "executor/communicator.h"
#include "executor/cpu/common.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/grad.h"
#include "kernels/cpu/layout.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/parallel.h"

namespace oases {

using namespace oases::cpu;
namespace k = oases::kernels;
using k::parallel_range;

namespace {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t rows_before(const Shape& s, int64_t axis) {
  int64_t r = 1;
  for (int64_t d = 0; d < axis; ++d) r *= s[d];
  return r;
}

int64_t loss_denominator_and_labels(KernelContext& c, int scores_slot, std::vector<int64_t>* labels, int64_t* n, int64_t* cls, int64_t* d,
                                    int64_t* ignore, double* denom) {
  const Shape& s = c.in[scores_slot].shape;
  *n = s[0];
  *cls = s[1];
  *d = 1;
  for (size_t i = 2; i < s.size(); ++i) *d *= s[i];
  *ignore = c.attrs().has("ignore_index") ? c.attrs().get_int("ignore_index", 0) : std::numeric_limits<int64_t>::min();
  const TensorView& lb = c.in[scores_slot + 1];
  labels->resize(static_cast<size_t>(lb.numel()));
  for (int64_t i = 0; i < lb.numel(); ++i) (*labels)[i] = load_as_int64(lb.data, lb.dtype, i);
  std::string red = c.attrs().get_string("reduction", "mean");
  double wsum = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < lb.numel(); ++i) {
    int64_t l = (*labels)[i];
    if (l == *ignore) continue;
    if (l < 0 || l >= *cls) c.fail("label {} at position {} is outside [0, {})", l, i, *cls);
    wsum += c.has_input(scores_slot + 2) ? load_as_double(c.in[scores_slot + 2].data, c.in[scores_slot + 2].dtype, l) : 1.0;
    ++counted;
  }
  *denom = red == "mean" ? (wsum > 0 ? wsum : 1.0) : 1.0;
  return counted;
}

}  // namespace

void register_cpu_grad(CpuKernelRegistry& r) {
  r.add("oases", "MatMulT", [](KernelContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      k::matmul<T>(c.in[0].as<T>(), c.in[0].shape, c.in[1].as<T>(), c.in[1].shape, c.out[0].as<T>(), c.out[0].shape, ta, tb);
    });
  });
  r.add("oases", "UnaryGrad", [](KernelContext& c) {
    k::UnaryOp op;
    std::string name = c.attrs().get_string("op", "");
    if (!k::unary_op_from_name(name, &op)) c.fail("unknown op '{}'", name);
    k::UnaryParams p;
    p.alpha = c.attrs().get_float(
        "alpha", name == "LeakyRelu" ? 0.01f : (name == "Selu" ? 1.67326319217681884765625f : (name == "HardSigmoid" ? 0.2f : 1.f)));
    p.beta = c.attrs().get_float("beta", 0.5f);
    p.gamma = c.attrs().get_float("gamma", 1.05070102214813232421875f);
    if (c.attrs().has("min")) p.lo = c.attrs().get_float("min", 0);
    if (c.attrs().has("max")) p.hi = c.attrs().get_float("max", 0);
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      const T* y = c.has_input(2) ? c.in[2].as<T>() : nullptr;
      k::unary_grad<T>(op, p, c.in[0].as<T>(), c.in[1].as<T>(), y, c.out[0].as<T>(), c.out[0].numel());
    });
  });
  r.add("oases", "GeluGrad", [](KernelContext& c) {
    k::Activation act = c.attrs().get_string("approximate", "none") == "tanh" ? k::Activation::kGeluTanh : k::Activation::kGeluErf;
    dispatch_float(c, c.in[0].dtype,
                   [&]<class T>() { k::activation_grad<T>(act, c.in[0].as<T>(), c.in[1].as<T>(), c.out[0].as<T>(), c.out[0].numel()); });
  });
  r.add("oases", "SwiGLUGrad", [](KernelContext& c) {
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      T* dg = c.out[0].data ? c.out[0].as<T>() : nullptr;
      T* du = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      k::swiglu_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), c.in[2].as<T>(), dg, du, c.in[0].numel());
    });
  });
  r.add("oases", "SoftmaxGrad", [](KernelContext& c) {
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(c.in[0].shape.size()));
    bool log = c.attrs().get_int("log", 0) != 0;
    const Shape& s = c.in[0].shape;
    int64_t outer = rows_before(s, axis), inner = shape_numel(s) / std::max<int64_t>(1, outer * s[axis]);
    dispatch_float(c, c.in[0].dtype,
                   [&]<class T>() { k::softmax_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), c.out[0].as<T>(), outer, s[axis], inner, log); });
  });
  r.add("oases", "LayerNormGrad", [](KernelContext& c) {
    const Shape& s = c.in[1].shape;
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
    int64_t rows = rows_before(s, axis), n = shape_numel(s) / std::max<int64_t>(1, rows);
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      std::vector<T> scale(static_cast<size_t>(n));
      Shape ns(s.begin() + axis, s.end());
      k::broadcast_to(c.in[2].as<T>(), c.in[2].shape, scale.data(), ns);
      T* ds = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      T* db = c.out.size() > 2 && c.out[2].data ? c.out[2].as<T>() : nullptr;
      k::layernorm_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), scale.data(), c.in[3].as<float>(), c.in[4].as<float>(), c.out[0].as<T>(), ds,
                           db, rows, n);
    });
  });
  r.add("oases", "RMSNormGrad", [](KernelContext& c) {
    const Shape& s = c.in[1].shape;
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
    int64_t rows = rows_before(s, axis), n = shape_numel(s) / std::max<int64_t>(1, rows);
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      std::vector<T> scale(static_cast<size_t>(n));
      Shape ns(s.begin() + axis, s.end());
      k::broadcast_to(c.in[2].as<T>(), c.in[2].shape, scale.data(), ns);
      T* ds = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      k::rmsnorm_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), scale.data(), c.in[3].as<float>(), c.out[0].as<T>(), ds, rows, n);
    });
  });
  r.add("oases", "AttentionGrad", [](KernelContext& c) {
    AttentionArgs a = attention_args(c, 1);
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      k::attention_backward<T>(a.shape, c.in[0].as<T>(), c.in[1].as<T>(), c.in[2].as<T>(), c.in[3].as<T>(), c.in[4].as<T>(),
                               c.in[5].as<float>(), a.mask, a.mask_bool, a.ms, c.out[0].as<T>(), c.out[1].as<T>(), c.out[2].as<T>());
    });
  });
  r.add("oases", "SoftmaxCrossEntropyGrad", [](KernelContext& c) {
    std::vector<int64_t> labels;
    int64_t n, cls, d, ignore;
    double denom;
    loss_denominator_and_labels(c, 1, &labels, &n, &cls, &d, &ignore, &denom);
    bool per_sample = c.attrs().get_string("reduction", "mean") == "none";
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      const T* w = c.has_input(3) ? c.in[3].as<T>() : nullptr;
      k::softmax_cross_entropy_grad<T>(c.in[0].as<T>(), per_sample, c.in[1].as<T>(), labels.data(), w, n, cls, d, ignore, denom,
                                       c.out[0].as<T>());
    });
  });
  r.add("oases", "NLLLossGrad", [](KernelContext& c) {
    std::vector<int64_t> labels;
    int64_t n, cls, d, ignore;
    double denom;
    loss_denominator_and_labels(c, 1, &labels, &n, &cls, &d, &ignore, &denom);
    bool per_sample = c.attrs().get_string("reduction", "mean") == "none";
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      T* dx = c.out[0].as<T>();
      std::fill(dx, dx + c.out[0].numel(), T(0));
      const T* w = c.has_input(3) ? c.in[3].as<T>() : nullptr;
      for (int64_t s = 0; s < n * d; ++s) {
        int64_t l = labels[s];
        if (l == ignore) continue;
        int64_t i = s / d, j = s % d;
        T coef = (per_sample ? c.in[0].as<T>()[s] : c.in[0].as<T>()[0] / static_cast<T>(denom)) * (w ? w[l] : T(1));
        dx[(i * cls + l) * d + j] = -coef;
      }
    });
  });
  r.add("oases", "GatherGrad", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& ds = c.out[0].shape;
    int64_t outer = rows_before(ds, axis), dim = ds[axis];
    int64_t inner = shape_numel(ds) / std::max<int64_t>(1, outer * dim);
    int64_t nidx = c.in[1].numel();
    // a vocabulary-split table: this rank's rows (plain names, not a structured binding: clang 14
    // cannot capture those in the lambdas below)
    const TableRows rows = table_rows(c, dim);
    const int64_t start = rows.start, total = rows.total;
    dispatch_float(c, c.out[0].dtype, [&]<class T>() {
      T* out = c.out[0].as<T>();
      const T* dy = c.in[0].as<T>();
      std::fill(out, out + c.out[0].numel(), T(0));
      // rows of the table are disjoint across `inner` chunks: parallel over inner blocks keeps sums exact and ordered
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < nidx; ++i) {
          int64_t v = load_as_int64(c.in[1].data, c.in[1].dtype, i);
          if (v < 0) v += total;
          if (v < 0 || v >= total) c.fail("index {} outside [0, {})", v, total);
          v -= start;
          if (v < 0 || v >= dim) continue;
          T* dst = out + (o * dim + v) * inner;
          const T* src = dy + (o * nidx + i) * inner;
          for (int64_t e = 0; e < inner; ++e) dst[e] += src[e];
        }
      }
    });
  });
  r.add("oases", "SliceGrad", [](KernelContext& c) {
    const Shape& in = c.out[0].shape;
    std::vector<int64_t> starts(in.size(), 0), steps(in.size(), 1);
    std::vector<int64_t> axes = c.attrs().get_ints("axes"), st = c.attrs().get_ints("starts"), sp = c.attrs().get_ints("steps");
    for (size_t i = 0; i < axes.size(); ++i) {
      starts[axes[i]] = st[i];
      steps[axes[i]] = sp[i];
    }
    std::memset(c.out[0].data, 0, c.out[0].nbytes());
    k::strided_scatter(c.in[0].data, c.in[0].shape, starts, steps, c.out[0].data, in, dtype_size(c.out[0].dtype));
  });
  r.add("oases", "DropoutGrad", [](KernelContext& c) {
    float ratio = c.attrs().get_float("ratio", 0.5f);
    bool train = c.attrs().get_int("training_mode", 0) != 0 && (!c.state || c.state->training);
    if (!train || ratio == 0.f) {
      if (c.out[0].data != c.in[0].data) std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());
      return;
    }
    if (c.in[0].dtype != DType::kF32) c.fail("training-mode dropout supports float32 only");
    apply_dropout(c, c.in[0].as<float>(), c.out[0].as<float>(), nullptr, ratio);
  });
}

}  // namespace oases
