// CPU glue for the executor's fused ops (executor/fusion.h), domain "oases.cpu":
//   FusedMatMul(A, B[, bias[, residual]]) trans_a, trans_b, activation:
//     Y = act(op(A) · op(B) + bias) or (op(A) · op(B) + bias) + residual, A [..., M, K] (or [..., K, M]
//     with trans_a), B [..., K, N] (or [..., N, K] with trans_b), bias [N], residual shaped as Y;
//     batch dims broadcast as in MatMul.
#include "executor/cpu/common.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"

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
  r.add("oases.cpu", "FusedMatMul", [](KernelContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    k::Activation act = activation_of(c);
    with_half_as_float(c, [&](KernelContext& f) {
      auto run = [&]<class T>() {
        const T* bias = f.has_input(2) ? f.in[2].as<T>() : nullptr;
        const T* res = f.has_input(3) ? f.in[3].as<T>() : nullptr;
        const int64_t n = f.out[0].shape.back();
        k::GemmEpilogue<T> ep;
        if constexpr (std::is_floating_point_v<T>) {
          if (bias || res || act != k::Activation::kNone) {
            ep = [&](T* y, int64_t rows, int64_t cols, int64_t ldy, int64_t row0, int64_t col0) {
              k::bias_activation<T>(y, rows, cols, ldy, bias ? bias + col0 : nullptr, act, res ? res + row0 * n + col0 : nullptr, n);
            };
          }
        } else if (bias || res || act != k::Activation::kNone) {
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
  });
}

}  // namespace oases
