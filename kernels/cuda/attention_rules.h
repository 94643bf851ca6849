// The attention contract without CUDA: AttentionDesc, and the host-side rules of the cuDNN fused
// path (attention_cudnn.cpp): whether it takes a call and why not, where its causal diagonal sits,
// how the additive mask becomes cuDNN's bias, and the key its execution plans are cached under.
// Pure functions of the arguments, so the CPU unit tests check them on machines without a GPU
// (tests/unit/cudnn_attention_test.cpp). C++17 and no CUDA header: nvcc compiles attention.h,
// which includes this, and the CPU-only build compiles the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/elem.h"

namespace oases::cuda {

// q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], out [B, H, Tq, Dv], lse [B, H, Tq] (fp32),
// all contiguous unless `strided` (then through `st`; lse is always contiguous); H a multiple of
// Hkv (grouped-query heads: query head h reads key/value head h / (H / Hkv)). S = scale·q kᵀ + mask
// (+ causal limit), lse_i = ln Σ_j exp S_ij, a row that no key reaches has out 0 and lse +inf. The mask (fp32 additive, or bool keep-where-1) is read through
// element strides over [B, H, Tq, Tk] (0 where broadcast). Causal: key j > query i + (Tk − Tq) is
// masked (the diagonal ends in the bottom-right corner when Tq != Tk).
// Element strides (batch, head, time) of each tensor of a call, the last dim contiguous: a device
// program's strided attention (oases.device.Attention / AttentionGrad, graph/passes/fusion.h)
// reads q, k, v from a fused projection, writes the output [B, T, H, Dv] and the gradients into
// the projection's gradient. The gradients' regions do not overlap.
struct AttentionStrides {
  int64_t q[3], k[3], v[3], o[3], dout[3], dq[3], dk[3], dv[3];
};

struct AttentionDesc {
  int64_t batch = 0, heads = 0, kv_heads = 0, tq = 0, tk = 0, d = 0, dv = 0;
  bool causal = false;
  float scale = 1.f;
  const void* mask = nullptr;
  bool mask_is_bool = false;
  int64_t mask_strides[4] = {0, 0, 0, 0};
  // false: every tensor contiguous [B, H, T, E] (the own and batched-product kernels take only
  // that; the glue gives them contiguous copies of a strided call's tensors)
  bool strided = false;
  AttentionStrides st{};
};

// The strides of every tensor of a contiguous call.
inline AttentionStrides contiguous_attention_strides(const AttentionDesc& a) {
  auto set = [](int64_t* s, int64_t heads, int64_t t, int64_t e) {
    s[0] = heads * t * e;
    s[1] = t * e;
    s[2] = e;
  };
  AttentionStrides st{};
  set(st.q, a.heads, a.tq, a.d);
  set(st.dq, a.heads, a.tq, a.d);
  set(st.k, a.kv_heads, a.tk, a.d);
  set(st.dk, a.kv_heads, a.tk, a.d);
  set(st.v, a.kv_heads, a.tk, a.dv);
  set(st.dv, a.kv_heads, a.tk, a.dv);
  set(st.o, a.heads, a.tq, a.dv);
  set(st.dout, a.heads, a.tq, a.dv);
  return st;
}
// The call's strides: its own when strided, else the contiguous ones.
inline AttentionStrides attention_strides(const AttentionDesc& a) {
  return a.strided ? a.st : contiguous_attention_strides(a);
}

// --- the cuDNN fused path -------------------------------------------------------------------------

// cuDNN's causal limit: none, the diagonal from the top-left corner (Tq == Tk: key j > query i is
// masked), or from the bottom-right one (Tq < Tk: j > i + Tk − Tq, which is ours).
enum class CudnnCausal : uint8_t { kNone, kTopLeft, kBottomRight };

inline CudnnCausal cudnn_causal(const AttentionDesc& a) {
  if (!a.causal) return CudnnCausal::kNone;
  return a.tq == a.tk ? CudnnCausal::kTopLeft : CudnnCausal::kBottomRight;
}

// How the mask reaches cuDNN as its additive bias, dims [Bm, Hm, Tq, Tk] with Bm ∈ {1, B} and
// Hm ∈ {1, H} (cuDNN broadcasts a bias over batch and heads only):
//   kFp32       the mask itself, fp32, through its own strides (no copy);
//   kConverted  a copy in scratch in the q/k/v type (attention_bias_convert), finite values
//               saturated to that type's range so float32's lowest, a common "masked" value,
//               stays finite instead of becoming -inf; rows padded to 16 bytes. It also spells
//               out a mask broadcast over queries or keys (a key-padding mask [B, 1, 1, Tk]).
enum class CudnnBias : uint8_t { kNone, kFp32, kConverted };
struct CudnnBiasLayout {
  CudnnBias kind = CudnnBias::kNone;
  int64_t dims[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
  size_t bytes = 0;  // kConverted: the copy's scratch
};

// A converted bias larger than this is not made (the batched-product path's score budget).
constexpr size_t kCudnnBiasBudgetBytes = size_t{1} << 30;

// The bias layouts to try, in order: kFp32 where cuDNN can read the mask where it lies (keys
// contiguous, no broadcast over queries or keys, every stride a whole number of 16 bytes; the
// pointer's own alignment is checked at the call), then kConverted (within the budget). Empty
// without an additive mask.
inline std::vector<CudnnBiasLayout> cudnn_bias_layouts(const AttentionDesc& a, Elem t) {
  std::vector<CudnnBiasLayout> out;
  if (!a.mask || a.mask_is_bool) return out;
  const int64_t* ms = a.mask_strides;
  const int64_t dims[4] = {ms[0] != 0 ? a.batch : 1, ms[1] != 0 ? a.heads : 1, a.tq, a.tk};
  bool direct = true;
  for (int i = 0; i < 4; ++i) {
    if (dims[i] == 1) continue;                   // any stride will do
    if (ms[i] == 0) direct = false;               // broadcast over queries or keys
    if (i == 3 && ms[i] != 1) direct = false;     // keys contiguous
    if (i < 3 && ms[i] % 4 != 0) direct = false;  // 16-byte rows and planes
    if (i == 2 && ms[i] < a.tk) direct = false;   // rows that overlap
  }
  if (direct) {
    CudnnBiasLayout l;
    l.kind = CudnnBias::kFp32;
    for (int i = 3; i >= 0; --i) {
      l.dims[i] = dims[i];
      l.strides[i] = dims[i] != 1 ? ms[i] : i == 3 ? 1 : l.strides[i + 1] * l.dims[i + 1];
    }
    out.push_back(l);
  }
  CudnnBiasLayout c;
  c.kind = CudnnBias::kConverted;
  const int64_t per16 = 16 / static_cast<int64_t>(elem_size(t));  // elements in 16 bytes
  const int64_t ld = (a.tk + per16 - 1) / per16 * per16;
  for (int i = 0; i < 4; ++i) c.dims[i] = dims[i];
  c.strides[3] = 1;
  c.strides[2] = ld;
  c.strides[1] = a.tq * ld;
  c.strides[0] = dims[1] * a.tq * ld;
  c.bytes = static_cast<size_t>(dims[0] * c.strides[0]) * elem_size(t);
  if (c.bytes <= kCudnnBiasBudgetBytes) out.push_back(c);
  return out;
}

// Empty when the cuDNN path may take this call; else why not, in words for --verbose. The
// frontend's own checks (architecture, library version) come later, at the plan's build.
inline std::string cudnn_attention_refusal(const AttentionDesc& a, Elem t) {
  auto n = [](int64_t v) { return std::to_string(v); };
  if (t != Elem::kF16 && t != Elem::kBF16) return std::string("cuDNN's fused attention takes float16 and bfloat16, not ") + elem_name(t);
  if (a.batch <= 0 || a.heads <= 0 || a.tq <= 0 || a.tk <= 0 || a.d <= 0 || a.dv <= 0) return "an empty attention";
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0) {
    return n(a.heads) + " query heads are not a multiple of " + n(a.kv_heads) + " key/value heads";
  }
  if (a.d % 8 != 0 || a.dv % 8 != 0 || a.d > 256 || a.dv > 256) {
    std::string size = n(a.d);
    if (a.dv != a.d) size += '/' + n(a.dv);
    return "head size " + size + ": cuDNN takes multiples of 8 up to 256";
  }
  if (a.tq == 1 && a.tk == 1) return "one query and one key: cuDNN's backward pass refuses Tq = Tk = 1";
  if (a.causal && a.tq > a.tk) {
    return "causal with more queries (" + n(a.tq) + ") than keys (" + n(a.tk) + "): rows that see no key, which cuDNN does not express";
  }
  if (a.mask && a.mask_is_bool) return "a bool mask: cuDNN takes an additive bias, not a bool mask";
  if (a.mask && a.causal && a.tq != a.tk) {
    return "causal with Tq != Tk and a mask: cuDNN's bottom-right diagonal does not combine with a bias";
  }
  if (a.mask && cudnn_bias_layouts(a, t).empty()) return "the mask as a cuDNN bias would take more than 1 GiB of scratch";
  if (a.strided) {
    const int64_t per16 = 16 / static_cast<int64_t>(elem_size(t));
    const int64_t* all = &a.st.q[0];
    for (size_t i = 0; i < sizeof(AttentionStrides) / sizeof(int64_t); ++i) {
      if (all[i] % per16 != 0) return "a tensor's strides that are not whole 16-byte units (" + n(all[i]) + " elements)";
    }
  }
  return std::string();
}

// q, k, v, out, the outputs and a bias read in place must start on 16 bytes (cuDNN's kernels move
// them in 16-byte vectors and do not check).
inline bool cudnn_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Everything that changes the cuDNN graph of a call, so one execution plan serves every call with
// an equal key: the shape and heads, the type, the causal diagonal, forward (with or without the
// statistics) or backward, the bias's kind and layout, the scale's bits (baked into the graph),
// and the device the plan was built for.
struct CudnnPlanKey {
  int64_t batch = 0, heads = 0, kv_heads = 0, tq = 0, tk = 0, d = 0, dv = 0;
  Elem type = Elem::kF16;
  CudnnCausal causal = CudnnCausal::kNone;
  bool backward = false;
  bool stats = false;  // forward: lse written
  CudnnBias bias = CudnnBias::kNone;
  int64_t bias_dims[4] = {0, 0, 0, 0};
  int64_t bias_strides[4] = {0, 0, 0, 0};
  uint32_t scale_bits = 0;
  int device = 0;
  AttentionStrides strides{};  // every tensor's (contiguous ones spelled out)

  bool operator==(const CudnnPlanKey& o) const {
    return batch == o.batch && heads == o.heads && kv_heads == o.kv_heads && tq == o.tq && tk == o.tk && d == o.d && dv == o.dv &&
           type == o.type && causal == o.causal && backward == o.backward && stats == o.stats && bias == o.bias &&
           std::memcmp(bias_dims, o.bias_dims, sizeof bias_dims) == 0 &&
           std::memcmp(bias_strides, o.bias_strides, sizeof bias_strides) == 0 && scale_bits == o.scale_bits && device == o.device &&
           std::memcmp(&strides, &o.strides, sizeof strides) == 0;
  }
  bool operator!=(const CudnnPlanKey& o) const { return !(*this == o); }

  std::string to_string() const {
    auto n = [](int64_t v) { return std::to_string(v); };
    std::string s = std::string(elem_name(type)) +
                    (backward ? " backward"
                     : stats  ? " forward+lse"
                              : " forward") +
                    " b" + n(batch) + " h" + n(heads) + "/" + n(kv_heads) + " q" + n(tq) + " k" + n(tk) + " d" + n(d) + "/" + n(dv);
    s += causal == CudnnCausal::kNone ? "" : causal == CudnnCausal::kTopLeft ? " causal(top-left)" : " causal(bottom-right)";
    if (bias != CudnnBias::kNone) {
      auto list = [&n](const int64_t* v) {
        std::string l = "[";
        for (int i = 0; i < 4; ++i) {
          if (i) l += ',';
          l += n(v[i]);
        }
        return l + "]";
      };
      s += bias == CudnnBias::kFp32 ? " bias fp32 " : " bias converted ";
      s += list(bias_dims) + " strides " + list(bias_strides);
    }
    char scale[16];
    std::snprintf(scale, sizeof scale, "%08x", scale_bits);
    return s + " scale 0x" + scale + " device " + n(device);
  }
};

struct CudnnPlanKeyHash {
  size_t operator()(const CudnnPlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&h](uint64_t v) {
      for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    };
    for (int64_t v : {k.batch, k.heads, k.kv_heads, k.tq, k.tk, k.d, k.dv}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(k.type) | static_cast<uint64_t>(k.causal) << 8 | static_cast<uint64_t>(k.backward) << 16 |
        static_cast<uint64_t>(k.stats) << 24 | static_cast<uint64_t>(k.bias) << 32);
    for (int i = 0; i < 4; ++i) {
      mix(static_cast<uint64_t>(k.bias_dims[i]));
      mix(static_cast<uint64_t>(k.bias_strides[i]));
    }
    mix(static_cast<uint64_t>(k.scale_bits) | static_cast<uint64_t>(static_cast<uint32_t>(k.device)) << 32);
    const int64_t* st = &k.strides.q[0];
    for (size_t i = 0; i < sizeof(AttentionStrides) / sizeof(int64_t); ++i) mix(static_cast<uint64_t>(st[i]));
    return static_cast<size_t>(h);
  }
};

inline CudnnPlanKey cudnn_plan_key(const AttentionDesc& a, Elem t, bool backward, bool stats, const CudnnBiasLayout& bias, int device) {
  CudnnPlanKey k;
  k.batch = a.batch;
  k.heads = a.heads;
  k.kv_heads = a.kv_heads;
  k.tq = a.tq;
  k.tk = a.tk;
  k.d = a.d;
  k.dv = a.dv;
  k.type = t;
  k.causal = cudnn_causal(a);
  k.backward = backward;
  k.stats = backward || stats;
  k.bias = bias.kind;
  for (int i = 0; i < 4; ++i) {
    k.bias_dims[i] = bias.dims[i];
    k.bias_strides[i] = bias.strides[i];
  }
  std::memcpy(&k.scale_bits, &a.scale, sizeof k.scale_bits);
  k.device = device;
  k.strides = attention_strides(a);
  return k;
}

}  // namespace oases::cuda
