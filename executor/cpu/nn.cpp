// CPU glue for matrix products (MatMul, Gemm, Einsum), reductions, TopK, softmax,
// normalisations, attention and losses.
#include <cmath>
#include <limits>

#include "executor/cpu/common.h"
#include "kernels/cpu/einsum.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/indexing.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/reduce.h"

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
      counted = 0;
      for (int64_t i = 0; i < n * d; ++i) {
        int64_t l = labels[i];
        if (l == ignore) {
          losses[i] = 0;
          continue;
        }
        if (l < 0 || l >= cls) {
          counted = -(1 + i);
          break;
        }
        int64_t b = i / d, j = i % d;
        T wt = w ? w[l] : T(1);
        losses[i] = -c.in[0].as<T>()[(b * cls + l) * d + j] * wt;
        wsum += static_cast<double>(wt);
        ++counted;
      }
    }
    if (counted < 0) c.fail("label {} at position {} is outside [0, {})", labels[-counted - 1], -counted - 1, cls);
    T* out = c.out[0].as<T>();
    if (red == "none") {
      std::copy(losses.begin(), losses.end(), out);
      return;
    }
    double total = 0;
    for (T v : losses) total += static_cast<double>(v);
    if (red == "mean") total = wsum > 0 ? total / wsum : 0.0;
    *out = static_cast<T>(total);
  });
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
        int64_t axis = f.attrs().get_int("axis", -1);
        const Shape& s = f.in[0].shape;
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
      dispatch_numeric(f, f.in[0].dtype, [&]<class T>() {
        const T* x = f.in[0].as<T>();
        T* y = f.out[0].as<T>();
        for (int64_t o = 0; o < outer; ++o) {
          for (int64_t j = 0; j < inner; ++j) {
            T acc = 0;
            for (int64_t t = 0; t < n; ++t) {
              int64_t i = rev ? n - 1 - t : t;
              int64_t idx = (o * n + i) * inner + j;
              if (excl) {
                y[idx] = acc;
                acc += x[idx];
              } else {
                acc += x[idx];
                y[idx] = acc;
              }
            }
          }
        }
      });
    });
  });
  r.add("", "Trilu", [](KernelContext& c) {
    bool upper = c.attrs().get_int("upper", 1) != 0;
    int64_t kk = c.attrs().get_int("k", 0);
    const Shape& s = c.in[0].shape;
    int64_t rows = s[s.size() - 2], cols = s[s.size() - 1];
    int64_t mats = c.in[0].numel() / std::max<int64_t>(1, rows * cols);
    size_t es = dtype_size(c.in[0].dtype);
    const char* x = static_cast<const char*>(c.in[0].data);
    char* y = static_cast<char*>(c.out[0].data);
    for (int64_t m = 0; m < mats; ++m) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          bool keep = upper ? (j - i >= kk) : (j - i <= kk);
          int64_t off = ((m * rows + i) * cols + j) * static_cast<int64_t>(es);
          if (keep) {
            std::memcpy(y + off, x + off, es);
          } else {
            std::memset(y + off, 0, es);
          }
        }
      }
    }
  });
  auto norm = [](KernelContext& c, bool rms) {
    int64_t axis = c.attrs().get_int("axis", -1);
    float eps = c.attrs().get_float("epsilon", rms ? 1e-6f : 1e-5f);
    const Shape& s = c.in[0].shape;
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
}

}  // namespace oases
