// CPU glue for the executor's fused ops (graph/passes/fusion.h), domain "oases.cpu":
//   FusedMatMul(A, B[, bias[, residual]]) trans_a, trans_b, activation:
//     Y = act(op(A) · op(B) + bias) or (op(A) · op(B) + bias) + residual, A [..., M, K] (or [..., K, M]
//     with trans_a), B [..., K, N] (or [..., N, K] with trans_b), bias [N], residual shaped as Y;
//     batch dims broadcast as in MatMul.
//   Attention(q_src, k_src, v_src[, mask]) dims [B, H, Hkv, Tq, Tk, D, Dv], q_layout/k_layout/v_layout
//     [offset, batch, head, time strides] into their sources, o_layout [batch, head, time strides]
//     of the output; causal, scale: oases.Attention reading its operands where they lie. It is
//     also the CPU reference of a device program's oases.device.Attention.
//   oases.device.AttentionGrad(dO_src, q_src, k_src, v_src, O_src, lse[, mask]) with those layouts,
//     dout_layout, dq/dk/dv_layout and packed_shape (graph/ops/fused.cpp): the CPU reference of a
//     device program's strided backward.
//   oases.device.FusedMatMul with output 1 (the activation's input, written beside Y), and
//   oases.device.MatMulGeluGrad(A, B, X) -> (GeluGrad(op(A)·op(B), X)[, its sums over the rows]):
//     the CPU references of a device program's GELU epilogues.
//   AddGatherGrad(X, dy, indices) axis: Y = X + GatherGrad(dy, indices), the scattered rows summed
//     per index in index order first (the same bits as the two nodes it replaces); Y may be X.
#include <algorithm>
#include <cstring>

#include "executor/communicator.h"
#include "executor/cpu/common.h"
#include "graph/passes/fusion.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace oases {

using namespace oases::cpu;
namespace k = oases::kernels;

namespace {

k::Activation activation_of(const KernelContext& c) {
  std::string a = c.attrs().get_string("activation", "");
  if (a.empty() || a == "none") return k::Activation::kNone;
  if (a == "gelu_tanh") return k::Activation::kGeluTanh;
  if (a == "gelu") return k::Activation::kGeluErf;
  if (a == "relu") return k::Activation::kRelu;
  c.fail("unknown activation '{}'", a);
}

}  // namespace

void register_cpu_fused(CpuKernelRegistry& r) {
  // oases.device.FusedMatMul (a device program's fused product) has the same contract: this
  // kernel is its CPU reference
  auto fused_matmul = [](KernelContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    k::Activation act = activation_of(c);
    with_half_as_float(c, [&](KernelContext& f) {
      auto run = [&]<class T>() {
        const T* bias = f.has_input(2) ? f.in[2].as<T>() : nullptr;
        const T* res = f.has_input(3) ? f.in[3].as<T>() : nullptr;
        const int64_t n = f.out[0].shape.back();
        // a device program's output 1: the activation's input, written beside its output
        T* preact = f.out.size() > 1 && f.out[1].data ? f.out[1].as<T>() : nullptr;
        const k::Activation in_gemm = preact ? k::Activation::kNone : act;
        k::GemmEpilogue<T> ep;
        if constexpr (std::is_floating_point_v<T>) {
          if (bias || res || in_gemm != k::Activation::kNone) {
            ep = [&](T* y, int64_t rows, int64_t cols, int64_t ldy, int64_t row0, int64_t col0) {
              k::bias_activation<T>(y, rows, cols, ldy, bias ? bias + col0 : nullptr, in_gemm, res ? res + row0 * n + col0 : nullptr, n);
            };
          }
          if (preact) {
            k::matmul<T>(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, preact, f.out[0].shape, ta, tb, ep);
            k::activation<T>(act, preact, f.out[0].as<T>(), f.out[0].numel());
            return;
          }
        } else if (bias || res || act != k::Activation::kNone || preact) {
          f.fail("bias, residual and activation need a floating-point type");
        }
        k::matmul<T>(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, f.out[0].as<T>(), f.out[0].shape, ta, tb, ep);
      };
      switch (f.in[0].dtype) {
        case DType::kF32: run.template operator()<float>(); break;
        case DType::kF64: run.template operator()<double>(); break;
        case DType::kI64: run.template operator()<int64_t>(); break;
        case DType::kI32: run.template operator()<int32_t>(); break;
        case DType::kU32: run.template operator()<uint32_t>(); break;
        case DType::kU64: run.template operator()<uint64_t>(); break;
        default: f.fail("FusedMatMul of {} is not supported", dtype_name(f.in[0].dtype));
      }
    });
  };
  r.add("oases.cpu", "FusedMatMul", fused_matmul);
  r.add(kDeviceFusedDomain, "FusedMatMul", fused_matmul);
  // the CPU reference of a device program's oases.device.MatMulGeluGrad: the product, the GELU's
  // gradient over it, and its sums over the rows (the bias gradient)
  r.add(kDeviceFusedDomain, "MatMulGeluGrad", [](KernelContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    k::Activation act = c.attrs().get_string("approximate", "none") == "tanh" ? k::Activation::kGeluTanh : k::Activation::kGeluErf;
    with_half_as_float(c, [&](KernelContext& f) {
      dispatch_float(f, f.in[0].dtype, [&]<class T>() {
        T* dx = f.out[0].as<T>();
        const int64_t total = f.out[0].numel(), cols = f.out[0].shape.empty() ? 1 : f.out[0].shape.back();
        k::matmul<T>(f.in[0].as<T>(), f.in[0].shape, f.in[1].as<T>(), f.in[1].shape, dx, f.out[0].shape, ta, tb, k::GemmEpilogue<T>{});
        k::activation_grad<T>(act, dx, f.in[2].as<T>(), dx, total);
        if (f.out.size() > 1 && f.out[1].data) {
          T* db = f.out[1].as<T>();
          std::fill(db, db + cols, T(0));
          for (int64_t i = 0; i < total; ++i) db[i % cols] += dx[i];
        }
      });
    });
  });
  // oases.cpu.Attention (and a device program's oases.device.Attention, whose CPU reference it is)
  auto attention = [](KernelContext& c) {
    AttentionArgs a = attention_args(c, 0);
    k::AttentionLayout L;
    int64_t off[6];
    int64_t* const st[8] = {L.q, L.k, L.v, L.o};
    attention_layouts(c, false, st, off);
    float* lse = c.out.size() > 1 && c.out[1].data ? c.out[1].as<float>() : nullptr;
    dispatch_float(c, c.in[0].dtype, [&]<class T>() {
      k::attention<T>(a.shape, c.in[0].as<T>() + off[0], c.in[1].as<T>() + off[1], c.in[2].as<T>() + off[2], a.mask, a.mask_bool, a.ms,
                      c.out[0].as<T>(), lse, &L);
    });
  };
  r.add("oases.cpu", "Attention", attention);
  r.add(kDeviceFusedDomain, "Attention", attention);
  // oases.device.AttentionGrad(dO, q, k, v, O, lse[, mask]): the CPU reference of a device
  // program's strided backward; dq, dk, dv as three outputs or one packed output
  r.add(kDeviceFusedDomain, "AttentionGrad", [](KernelContext& c) {
    AttentionArgs a = attention_args(c, 1);
    k::AttentionGradLayout L;
    int64_t off[6];
    int64_t* const st[8] = {L.q, L.k, L.v, L.o, L.dout, L.dq, L.dk, L.dv};
    attention_layouts(c, true, st, off);
    int64_t* const gdst[3] = {L.dq, L.dk, L.dv};
    const int64_t* goff = off + 3;
    const bool packed = !c.attrs().get_ints("packed_shape").empty();
    if (!packed && c.out.size() < 3) c.fail("expects dq, dk and dv, or one packed output");
    dispatch_float(c, c.in[1].dtype, [&]<class T>() {
      const k::AttentionShape& s = a.shape;
      const k::AttentionLayout cont = k::AttentionLayout::contiguous(s);
      const int64_t sizes[3] = {s.batch * s.heads * s.tq * s.d, s.batch * s.kv_heads * s.tk * s.d, s.batch * s.kv_heads * s.tk * s.dv};
      const int64_t* cont_strides[3] = {cont.q, cont.k, cont.v};
      T* outs[3];
      std::vector<T> spare[3];  // a gradient nobody reads is still written somewhere, contiguous
      for (int i = 0; i < 3; ++i) {
        const TensorView& o = packed ? c.out[0] : c.out[static_cast<size_t>(i)];
        if (o.data) {
          outs[i] = o.as<T>() + goff[i];
        } else {
          spare[i].resize(static_cast<size_t>(sizes[i]));
          outs[i] = spare[i].data();
          std::copy(cont_strides[i], cont_strides[i] + 3, gdst[i]);
        }
      }
      k::attention_backward<T>(s, c.in[0].as<T>(), c.in[1].as<T>() + off[0], c.in[2].as<T>() + off[1], c.in[3].as<T>() + off[2],
                               c.in[4].as<T>(), c.in[5].as<float>(), a.mask, a.mask_bool, a.ms, outs[0], outs[1], outs[2], &L);
    });
  });
  r.add("oases.cpu", "AddGatherGrad", [](KernelContext& c) {
    int64_t axis = c.attrs().get_int("axis", 0);
    const Shape& ds = c.out[0].shape;
    int64_t outer = 1, dim = ds[axis];
    for (int64_t d = 0; d < axis; ++d) outer *= ds[d];
    int64_t inner = shape_numel(ds) / std::max<int64_t>(1, outer * dim);
    int64_t nidx = c.in[2].numel();
    // a vocabulary-split table: this rank's rows (plain names, not a structured binding: clang 14
    // cannot capture those in the lambdas below)
    const TableRows rows = table_rows(c, dim);
    const int64_t start = rows.start, total = rows.total;
    std::vector<int64_t> idx(static_cast<size_t>(nidx));
    std::vector<int64_t> by_row;  // positions whose row this rank holds
    for (int64_t i = 0; i < nidx; ++i) {
      int64_t v = load_as_int64(c.in[2].data, c.in[2].dtype, i);
      if (v < 0) v += total;
      if (v < 0 || v >= total) c.fail("index {} outside [0, {})", v, total);
      idx[static_cast<size_t>(i)] = v - start;
      if (v >= start && v < start + dim) by_row.push_back(i);
    }
    // positions grouped by index, in index order within a group
    const int64_t held = static_cast<int64_t>(by_row.size());
    std::stable_sort(by_row.begin(), by_row.end(), [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
    std::vector<int64_t> starts;
    for (int64_t j = 0; j < held; ++j) {
      if (j == 0 || idx[by_row[j]] != idx[by_row[j - 1]]) starts.push_back(j);
    }
    starts.push_back(held);
    dispatch_float(c, c.out[0].dtype, [&]<class T>() {
      T* y = c.out[0].as<T>();
      const T* x = c.in[0].as<T>();
      const T* dy = c.in[1].as<T>();
      if (y != x) {
        k::parallel_range(c.out[0].numel(), 1 << 16,
                          [&](int64_t b, int64_t e) { std::memcpy(y + b, x + b, static_cast<size_t>(e - b) * sizeof(T)); });
      }
      int64_t groups = static_cast<int64_t>(starts.size()) - 1;
      for (int64_t o = 0; o < outer; ++o) {
        // distinct rows per group: groups run in parallel
        k::parallel_range(groups, 8, [&](int64_t g0, int64_t g1) {
          std::vector<T> acc(static_cast<size_t>(inner));
          for (int64_t gi = g0; gi < g1; ++gi) {
            int64_t first = by_row[starts[gi]];
            const T* src = dy + (o * nidx + first) * inner;
            std::copy(src, src + inner, acc.begin());
            for (int64_t j = starts[gi] + 1; j < starts[gi + 1]; ++j) {
              src = dy + (o * nidx + by_row[j]) * inner;
              for (int64_t e = 0; e < inner; ++e) acc[e] += src[e];
            }
            T* dst = y + (o * dim + idx[first]) * inner;
            for (int64_t e = 0; e < inner; ++e) dst[e] += acc[e];
          }
        });
      }
    });
  });
}

}  // namespace oases
