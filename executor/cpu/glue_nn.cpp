// CPU glue for matrix products (MatMul, Gemm, Einsum), reductions, TopK, softmax,
// normalisations, attention and losses, and their backward ops (MatMulT, SoftmaxGrad, LayerNormGrad,
// RMSNormGrad, AttentionGrad, SoftmaxCrossEntropyGrad, NLLLossGrad).
#include <cmath>
#include <limits>

#include "executor/cpu/common.h"
#include "graph/passes/fusion.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/einsum.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/indexing.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/softmax.h"

namespace oases {

using namespace oases::cpu;
namespace k = oases::kernels;

namespace {

template <class F>
void dispatch_matmul_type(const KernelContext& c, DType t, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<float>(); break;
    case DType::kF64: f.template operator()<double>(); break;
    case DType::kI64: f.template operator()<int64_t>(); break;
    case DType::kI32: f.template operator()<int32_t>(); break;
    case DType::kU32: f.template operator()<uint32_t>(); break;
    case DType::kU64: f.template operator()<uint64_t>(); break;
    default: c.fail("MatMul of {} is not supported", dtype_name(t));
  }
}

k::ReduceKind reduce_kind(const std::string& op) {
  if (op == "ReduceSum") return k::ReduceKind::kSum;
  if (op == "ReduceMean") return k::ReduceKind::kMean;
  if (op == "ReduceMax") return k::ReduceKind::kMax;
  if (op == "ReduceMin") return k::ReduceKind::kMin;
  if (op == "ReduceProd") return k::ReduceKind::kProd;
  if (op == "ReduceL1") return k::ReduceKind::kL1;
  if (op == "ReduceL2") return k::ReduceKind::kL2;
  if (op == "ReduceSumSquare") return k::ReduceKind::kSumSquare;
  if (op == "ReduceLogSum") return k::ReduceKind::kLogSum;
  return k::ReduceKind::kLogSumExp;
}

void loss_kernel(KernelContext& c, bool from_logits) {
  const Shape& s = c.in[0].shape;
  int64_t n = s[0], cls = s[1], d = 1;
  for (size_t i = 2; i < s.size(); ++i) d *= s[i];
  std::string red = c.attrs().get_string("reduction", "mean");
  int64_t ignore = c.attrs().has("ignore_index") ? c.attrs().get_int("ignore_index", 0) : std::numeric_limits<int64_t>::min();
  std::vector<int64_t> labels(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n * d; ++i) labels[i] = load_as_int64(c.in[1].data, c.in[1].dtype, i);
  dispatch_float(c, c.in[0].dtype, [&]<class T>() {
    std::vector<T> losses(static_cast<size_t>(n * d));
    const T* w = c.has_input(2) ? c.in[2].as<T>() : nullptr;
    double wsum = 0;
    int64_t counted;
    if (from_logits) {
      T* logp = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      counted = k::softmax_cross_entropy<T>(c.in[0].as<T>(), labels.data(), w, n, cls, d, ignore, losses.data(), logp, &wsum);
    } else {  // NegativeLogLikelihoodLoss: input already holds log-probabilities
      counted = k::nll_loss<T>(c.in[0].as<T>(), labels.data(), w, n, cls, d, ignore, losses.data(), &wsum);
    }
    if (counted < 0) c.fail("label {} at position {} is outside [0, {})", labels[-counted - 1], -counted - 1, cls);
    T* out = c.out[0].as<T>();
    if (red == "none") {
      std::copy(losses.begin(), losses.end(), out);
      return;
    }
    *out = k::reduce_losses<T>(losses.data(), n * d, wsum, red == "mean");
  });
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

// The geometry of a Conv or one of its backward ops from the shapes of x, w and y and the
// canonical attributes (graph/ops/conv.cpp).
k::ConvShape conv_shape(const KernelContext& c, const Shape& x, const Shape& w, const Shape& y) {
  k::ConvShape s;
  s.batch = x[0];
  s.in_channels = x[1];
  s.out_channels = w[0];
  s.in.assign(x.begin() + 2, x.end());
  s.kernel.assign(w.begin() + 2, w.end());
  s.out.assign(y.begin() + 2, y.end());
  s.strides = c.attrs().get_ints("strides");
  s.pads = c.attrs().get_ints("pads");
  s.dilations = c.attrs().get_ints("dilations");
  size_t S = s.in.size();
  if (w.size() != S + 2 || y.size() != S + 2 || s.strides.size() != S || s.dilations.size() != S || s.pads.size() != 2 * S) {
    c.fail("convolution attributes not resolved for x {}, w {}, y {}", shape_str(x), shape_str(w), shape_str(y));
  }
  return s;
}

}  // namespace

AttentionArgs cpu::attention_args(const KernelContext& c, int q_slot) {
  AttentionArgs a;
  std::vector<int64_t> dims = c.attrs().get_ints("dims");  // oases.cpu.Attention: [B, H, Hkv, Tq, Tk, D, Dv]
  if (dims.size() == 7) {
    a.shape = k::AttentionShape{dims[0],
                                dims[1],
                                dims[2],
                                dims[3],
                                dims[4],
                                dims[5],
                                dims[6],
                                c.attrs().get_int("causal", 0) != 0,
                                c.attrs().get_float("scale", 1.f / std::sqrt(static_cast<float>(dims[5])))};
  } else {
    const Shape &q = c.in[q_slot].shape, &kk = c.in[q_slot + 1].shape, &v = c.in[q_slot + 2].shape;
    a.shape = k::AttentionShape{q[0],
                                q[1],
                                kk[1],
                                q[2],
                                kk[2],
                                q[3],
                                v[3],
                                c.attrs().get_int("causal", 0) != 0,
                                c.attrs().get_float("scale", 1.f / std::sqrt(static_cast<float>(q[3])))};
  }
  int mask_slot = q_slot == 0 ? 3 : 6;
  if (c.has_input(mask_slot)) {
    const Shape& m = c.in[mask_slot].shape;
    std::vector<int64_t> st = contiguous_strides(m);
    for (int d = 0; d < 4; ++d) {
      int md = d - (4 - static_cast<int>(m.size()));
      a.ms[d] = md < 0 || m[md] == 1 ? 0 : st[md];
    }
    a.mask = c.in[mask_slot].data;
    a.mask_bool = c.in[mask_slot].dtype == DType::kBool;
    if (!a.mask_bool && c.in[mask_slot].dtype != DType::kF32) c.fail("mask must be bool or float32");
  }
  return a;
}

void cpu::attention_layouts(const KernelContext& c, bool backward, int64_t* const strides[8], int64_t offsets[6]) {
  static const char* const names[8] = {"q_layout", "k_layout", "v_layout", "o_layout", "dout_layout", "dq_layout", "dk_layout", "dv_layout"};
  int64_t* off = offsets;
  for (int i = 0; i < (backward ? 8 : 4); ++i) {
    const bool with_offset = i != 3 && i != 4;  // O and dO: [batch, head, time strides]
    std::vector<int64_t> l = c.attrs().get_ints(names[i]);
    if (l.size() != (with_offset ? 4u : 3u)) {
      c.fail("{} must be [{}batch, head, time strides]", names[i], with_offset ? "offset, " : "");
    }
    std::copy(l.end() - 3, l.end(), strides[i]);
    if (with_offset) *off++ = l[0];
  }
}

// The norm gradients' common part: x [rows, n] normalised over the trailing axes from `axis`,
// the scale (input 2) broadcast to [n]; calls f.template operator()<T>(scale, rows, n).
template <class F>
static void with_norm_grad_rows(KernelContext& c, F&& f) {
  const Shape& s = c.in[1].shape;
  int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
  int64_t rows = rows_before(s, axis), n = shape_numel(s) / std::max<int64_t>(1, rows);
  dispatch_float(c, c.in[1].dtype, [&]<class T>() {
    std::vector<T> scale(static_cast<size_t>(n));
    k::broadcast_to(c.in[2].as<T>(), c.in[2].shape, scale.data(), Shape(s.begin() + axis, s.end()));
    f.template operator()<T>(scale.data(), rows, n);
  });
}

void register_cpu_nn(CpuKernelRegistry& r) {
  r.add("", "MatMul", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_matmul_type(f, f.in[0].dtype, [&]<class T>() {
        auto sa = promote_matrix(f.in[0].shape, true), sb = promote_matrix(f.in[1].shape, false);
        std::vector<int64_t> so = f.out[0].shape;
        if (f.in[0].shape.size() == 1) so.insert(so.end() - (f.in[1].shape.size() == 1 ? 0 : 1), 1);
        if (f.in[1].shape.size() == 1) so.push_back(1);
        k::matmul<T>(f.in[0].as<T>(), sa, f.in[1].as<T>(), sb, f.out[0].as<T>(), so);
      });
    });
  });
  r.add("", "Gemm", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_matmul_type(f, f.in[0].dtype, [&]<class T>() {
        bool ta = f.attrs().get_int("transA", 0) != 0, tb = f.attrs().get_int("transB", 0) != 0;
        T alpha = static_cast<T>(f.attrs().get_float("alpha", 1.f)), beta = static_cast<T>(f.attrs().get_float("beta", 1.f));
        int64_t m = f.out[0].shape[0], n = f.out[0].shape[1];
        int64_t kk = ta ? f.in[0].shape[0] : f.in[0].shape[1];
        T* y = f.out[0].as<T>();
        T b0 = T(0);
        if (f.has_input(2) && beta != T(0)) {
          k::broadcast_to(f.in[2].as<T>(), f.in[2].shape, y, f.out[0].shape);
          if (beta != T(1)) k::unary(y, y, m * n, [&](T v) { return static_cast<T>(v * beta); });
          b0 = T(1);
        }
        k::gemm<T>(ta, tb, m, n, kk, alpha, f.in[0].as<T>(), f.in[0].shape[1], f.in[1].as<T>(), f.in[1].shape[1], b0, y, n);
      });
    });
  });
  r.add("", "Einsum", [](KernelContext& c) {
    // canonical equation: letters only, explicit ("bij,bjk->bik")
    const std::string eq = c.attrs().get_string("equation", "");
    size_t arrow = eq.find("->");
    if (arrow == std::string::npos) c.fail("equation '{}' is not in canonical form", eq);
    std::vector<std::string> labels;
    for (size_t pos = 0;;) {
      size_t comma = eq.find(',', pos);
      labels.push_back(eq.substr(pos, std::min(comma, arrow) - pos));
      if (comma == std::string::npos || comma > arrow) break;
      pos = comma + 1;
    }
    if (labels.size() != c.in.size()) c.fail("equation '{}' has {} operands for {} inputs", eq, labels.size(), c.in.size());
    const std::string out_labels = eq.substr(arrow + 2);
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_matmul_type(f, f.in[0].dtype, [&]<class T>() {
        std::vector<const T*> ins;
        std::vector<std::vector<int64_t>> shapes;
        for (const auto& v : f.in) {
          ins.push_back(v.as<T>());
          shapes.push_back(v.shape);
        }
        k::einsum<T>(ins, shapes, labels, out_labels, f.out[0].as<T>());
      });
    });
  });
  r.add("", "TopK", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", -1), kk = c.attrs().get_int("k", 0);
    bool largest = c.attrs().get_int("largest", 1) != 0;
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        k::top_k<T>(f.in[0].as<T>(), f.in[0].shape, axis, kk, largest, f.out[0].as<T>(), f.out[1].as<int64_t>());
      });
    });
  });
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                         "ReduceLogSum", "ReduceLogSumExp"}) {
    k::ReduceKind kind = reduce_kind(op);
    r.add("", op, [kind](KernelContext& c) {
      if (c.in[0].shape == c.out[0].shape && c.in[0].numel() == c.out[0].numel() && c.attrs().get_ints("axes").empty()) {
        std::memcpy(c.out[0].data, c.in[0].data, c.in[0].nbytes());  // noop_with_empty_axes
        return;
      }
      with_half_as_float(c, [&](KernelContext& f) {
        auto run = [&]<class T>() { k::reduce<T>(kind, f.in[0].as<T>(), f.in[0].shape, f.attrs().get_ints("axes"), f.out[0].as<T>()); };
        switch (f.in[0].dtype) {
          case DType::kF32: run.template operator()<float>(); break;
          case DType::kF64: run.template operator()<double>(); break;
          case DType::kI64: run.template operator()<int64_t>(); break;
          case DType::kI32: run.template operator()<int32_t>(); break;
          case DType::kU8: run.template operator()<uint8_t>(); break;
          case DType::kI8: run.template operator()<int8_t>(); break;
          case DType::kU32: run.template operator()<uint32_t>(); break;
          case DType::kU64: run.template operator()<uint64_t>(); break;
          default: f.fail("reduction of {} is not supported", dtype_name(f.in[0].dtype));
        }
      });
    });
  }
  for (const char* op : {"ArgMax", "ArgMin"}) {
    bool is_max = std::string(op) == "ArgMax";
    r.add("", op, [is_max](KernelContext& c) {
      int64_t axis = c.attrs().get_int("axis", 0);
      bool last = c.attrs().get_int("select_last_index", 0) != 0;
      const Shape& s = c.in[0].shape;
      int64_t outer = 1, inner = 1, n = s[axis];
      for (int64_t d = 0; d < axis; ++d) outer *= s[d];
      for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
      int64_t* out = c.out[0].as<int64_t>();
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = 0; j < inner; ++j) {
          int64_t best = 0;
          double bv = load_as_double(c.in[0].data, c.in[0].dtype, o * n * inner + j);
          for (int64_t i = 1; i < n; ++i) {
            double v = load_as_double(c.in[0].data, c.in[0].dtype, (o * n + i) * inner + j);
            bool better = is_max ? (last ? v >= bv : v > bv) : (last ? v <= bv : v < bv);
            if (better) {
              bv = v;
              best = i;
            }
          }
          out[o * inner + j] = best;
        }
      }
    });
  }
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    bool log = std::string(op) == "LogSoftmax";
    r.add("", op, [log](KernelContext& c) {
      with_half_as_float(c, [&](KernelContext& f) {
        const Shape& s = f.in[0].shape;
        int64_t axis = normalize_axis(f.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
        int64_t outer = 1, inner = 1;
        for (int64_t d = 0; d < axis; ++d) outer *= s[d];
        for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
        dispatch_float(f, f.in[0].dtype, [&]<class T>() { k::softmax<T>(f.in[0].as<T>(), f.out[0].as<T>(), outer, s[axis], inner, log); });
      });
    });
  }
  r.add("", "CumSum", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    bool excl = c.attrs().get_int("exclusive", 0) != 0, rev = c.attrs().get_int("reverse", 0) != 0;
    const Shape& s = c.in[0].shape;
    int64_t outer = 1, inner = 1, n = s[axis];
    for (int64_t d = 0; d < axis; ++d) outer *= s[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() { k::cumsum<T>(f.in[0].as<T>(), f.out[0].as<T>(), outer, n, inner, excl, rev); });
    });
  });
  r.add("", "Trilu", [](KernelContext& c) {
    bool upper = c.attrs().get_int("upper", 1) != 0;
    int64_t kk = c.attrs().get_int("k", 0);
    const Shape& s = c.in[0].shape;
    int64_t rows = s[s.size() - 2], cols = s[s.size() - 1];
    int64_t mats = c.in[0].numel() / std::max<int64_t>(1, rows * cols);
    k::trilu(c.in[0].data, c.out[0].data, mats, rows, cols, dtype_size(c.in[0].dtype), upper, kk);
  });
  auto norm = [](KernelContext& c, bool rms) {
    const Shape& s = c.in[0].shape;
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
    float eps = c.attrs().get_float("epsilon", rms ? 1e-6f : 1e-5f);
    int64_t rows = 1, n = 1;
    for (int64_t d = 0; d < axis; ++d) rows *= s[d];
    for (size_t d = static_cast<size_t>(axis); d < s.size(); ++d) n *= s[d];
    float* mean = !rms && c.out.size() > 1 && c.out[1].data ? c.out[1].as<float>() : nullptr;
    int rstd_slot = rms ? 1 : 2;  // RMSNorm has no mean output
    float* rstd = static_cast<int>(c.out.size()) > rstd_slot && c.out[rstd_slot].data ? c.out[rstd_slot].as<float>() : nullptr;
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        // scale and bias broadcast to the normalised shape
        std::vector<T> sc(static_cast<size_t>(n)), bi;
        Shape ns(s.begin() + axis, s.end());
        k::broadcast_to(f.in[1].as<T>(), f.in[1].shape, sc.data(), ns);
        if (!rms && f.has_input(2)) {
          bi.resize(static_cast<size_t>(n));
          k::broadcast_to(f.in[2].as<T>(), f.in[2].shape, bi.data(), ns);
        }
        if (rms) {
          k::rmsnorm<T>(f.in[0].as<T>(), sc.data(), f.out[0].as<T>(), rstd, rows, n, eps);
        } else {
          k::layernorm<T>(f.in[0].as<T>(), sc.data(), bi.empty() ? nullptr : bi.data(), f.out[0].as<T>(), mean, rstd, rows, n, eps);
        }
      });
    });
  };
  r.add("", "LayerNormalization", [norm](KernelContext& c) { norm(c, false); });
  r.add("oases", "RMSNormalization", [norm](KernelContext& c) { norm(c, true); });
  r.add("oases", "Attention", [](KernelContext& c) {
    AttentionArgs a = attention_args(c, 0);
    float* lse = c.out.size() > 1 && c.out[1].data ? c.out[1].as<float>() : nullptr;
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      k::attention<T>(a.shape, c.in[0].as<T>(), c.in[1].as<T>(), c.in[2].as<T>(), a.mask, a.mask_bool, a.ms, c.out[0].as<T>(), lse);
    });
  });
  r.add("", "SoftmaxCrossEntropyLoss", [](KernelContext& c) { loss_kernel(c, true); });
  r.add("", "NegativeLogLikelihoodLoss", [](KernelContext& c) { loss_kernel(c, false); });

  r.add("", "Conv", [](KernelContext& c) {
    with_half_as_float(c, [&](KernelContext& f) {
      k::ConvShape s = conv_shape(f, f.in[0].shape, f.in[1].shape, f.out[0].shape);
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        k::conv_forward<T>(s, f.in[0].as<T>(), f.in[1].as<T>(), f.has_input(2) ? f.in[2].as<T>() : nullptr, f.out[0].as<T>());
      });
    });
  });

  // backward
  r.add("oases", "ConvGradInput", [](KernelContext& c) {  // (dy, w) -> dx
    with_half_as_float(c, [&](KernelContext& f) {
      k::ConvShape s = conv_shape(f, f.out[0].shape, f.in[1].shape, f.in[0].shape);
      dispatch_float(f, f.in[0].dtype, [&]<class T>() { k::conv_grad_input<T>(s, f.in[0].as<T>(), f.in[1].as<T>(), f.out[0].as<T>()); });
    });
  });
  r.add("oases", "ConvGradWeight", [](KernelContext& c) {  // (dy, x) -> dw
    with_half_as_float(c, [&](KernelContext& f) {
      k::ConvShape s = conv_shape(f, f.in[1].shape, f.out[0].shape, f.in[0].shape);
      dispatch_float(f, f.in[0].dtype, [&]<class T>() { k::conv_grad_weight<T>(s, f.in[0].as<T>(), f.in[1].as<T>(), f.out[0].as<T>()); });
    });
  });
  r.add("oases", "MatMulT", [](KernelContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      k::matmul<T>(c.in[0].as<T>(), c.in[0].shape, c.in[1].as<T>(), c.in[1].shape, c.out[0].as<T>(), c.out[0].shape, ta, tb);
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
    with_norm_grad_rows(c, [&]<class T>(const T* scale, int64_t rows, int64_t n) {
      T* ds = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      T* db = c.out.size() > 2 && c.out[2].data ? c.out[2].as<T>() : nullptr;
      k::layernorm_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), scale, c.in[3].as<float>(), c.in[4].as<float>(), c.out[0].as<T>(), ds, db,
                           rows, n);
    });
  });
  r.add("oases", "RMSNormGrad", [](KernelContext& c) {
    with_norm_grad_rows(c, [&]<class T>(const T* scale, int64_t rows, int64_t n) {
      T* ds = c.out.size() > 1 && c.out[1].data ? c.out[1].as<T>() : nullptr;
      k::rmsnorm_grad<T>(c.in[0].as<T>(), c.in[1].as<T>(), scale, c.in[3].as<float>(), c.out[0].as<T>(), ds, rows, n);
    });
  });
  r.add("oases", "AttentionGrad", [](KernelContext& c) {
    AttentionArgs a = attention_args(c, 1);
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      k::attention_backward<T>(a.shape, c.in[0].as<T>(), c.in[1].as<T>(), c.in[2].as<T>(), c.in[3].as<T>(), c.in[4].as<T>(),
                               c.in[5].as<float>(), a.mask, a.mask_bool, a.ms, c.out[0].as<T>(), c.out[1].as<T>(), c.out[2].as<T>());
    });
  });
  auto sce_grad = [](KernelContext& c) {
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
  };
  r.add("oases", "SoftmaxCrossEntropyGrad", sce_grad);
  // the device programs' losses on 16-bit scores (graph/passes/fusion.h): the same kernels on the
  // widened scores, the gradient rounded back when it is 16-bit
  r.add(kDeviceFusedDomain, "SoftmaxCrossEntropyLoss",
        [](KernelContext& c) { with_half_as_float(c, [](KernelContext& f) { loss_kernel(f, true); }); });
  r.add(kDeviceFusedDomain, "SoftmaxCrossEntropyGrad", [sce_grad](KernelContext& c) { with_half_as_float(c, sce_grad); });
  r.add("oases", "NLLLossGrad", [](KernelContext& c) {
    std::vector<int64_t> labels;
    int64_t n, cls, d, ignore;
    double denom;
    loss_denominator_and_labels(c, 1, &labels, &n, &cls, &d, &ignore, &denom);
    bool per_sample = c.attrs().get_string("reduction", "mean") == "none";
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      const T* w = c.has_input(3) ? c.in[3].as<T>() : nullptr;
      k::nll_loss_grad<T>(c.in[0].as<T>(), per_sample, labels.data(), w, n, cls, d, ignore, denom, c.out[0].as<T>());
    });
  });
}

}  // namespace oases
