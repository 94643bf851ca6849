// cuDNN's fused flash attention through the cuDNN frontend's graph API (header-only; fetched by
// scripts/setup_cudnn_frontend.sh, found by cmake/oases_cuda.cmake: OASES_WITH_CUDNN_FRONTEND).
// One graph per call shape (CudnnPlanKey, attention_rules.h):
//   forward   sdpa(Q, K, V; scale, causal diagonal, bias) -> O, Stats
//   backward  sdpa_backward(Q, K, V, O, dO, Stats; the same options) -> dQ, dK, dV
// Stats is cuDNN's log-sum-exp of the scaled, biased scores, natural log, fp32 [B, H, Tq, 1]: the
// lse of attention.cu and attention_gemm.cu, so each backward pass can follow each forward pass.
// With grouped-query heads cuDNN reads K/V [B, Hkv, Tk, D] and sums dK/dV over each group.
// A graph is validated, lowered, planned (heuristics A), checked and built the first time its key
// is seen on a thread, then only executed, with the caller's stream-ordered scratch as workspace.
// Every refusal or failure becomes a reason and a `false`, never an exception: the glue falls back
// to the batched products (attention_gemm.cu) and --verbose says why.
#include <cudnn.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/attention.h"

#if OASES_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#endif

namespace oases::cuda {

namespace {

std::atomic<uint64_t> forward_calls{0}, backward_calls{0};

}  // namespace

CudnnAttentionCalls cudnn_attention_calls() {
  CudnnAttentionCalls c;
  c.forward = forward_calls.load();
  c.backward = backward_calls.load();
  return c;
}

#if !OASES_WITH_CUDNN_FRONTEND

namespace {
const char* const kNoFrontend = "built without the cuDNN frontend (bash scripts/setup_cudnn_frontend.sh, then configure again)";
}  // namespace

const char* cudnn_frontend_version() {
  return "";
}
bool cudnn_attention_forward(void*, const AttentionDesc&, Elem, const void*, const void*, const void*, void*, float*, const ScratchFn&,
                             cudaStream_t, std::string* why) {
  *why = kNoFrontend;
  return false;
}
bool cudnn_attention_backward(void*, const AttentionDesc&, Elem, const void*, const void*, const void*, const void*, const void*,
                              const float*, void*, void*, void*, const ScratchFn&, cudaStream_t, std::string* why) {
  *why = kNoFrontend;
  return false;
}

#else

namespace fe = cudnn_frontend;

#define OASES_STR2(x) #x
#define OASES_STR(x) OASES_STR2(x)
const char* cudnn_frontend_version() {
  return OASES_STR(CUDNN_FRONTEND_MAJOR_VERSION) "." OASES_STR(CUDNN_FRONTEND_MINOR_VERSION) "." OASES_STR(CUDNN_FRONTEND_PATCH_VERSION);
}
#undef OASES_STR
#undef OASES_STR2

namespace {

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using VariantPack = std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*>;

// The graph's tensors, by uid (the variant pack's keys).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kDO, kDQ, kDK, kDV };

// A built graph ready to execute, or why there is none (then `graph` is null).
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string why;
};

// Per thread: cuDNN does not promise that one execution plan may run on two threads at once, and
// thread ranks each drive their own executor. A run sees a handful of keys; the bound only guards
// a run whose shapes never repeat.
using PlanCache = std::unordered_map<CudnnPlanKey, Plan, CudnnPlanKeyHash>;
constexpr size_t kMaxPlans = 256;
PlanCache& plan_cache() {
  thread_local PlanCache cache;
  return cache;
}

std::vector<int64_t> contiguous(const std::vector<int64_t>& dims) {
  std::vector<int64_t> st(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) st[i] = st[i + 1] * dims[i + 1];
  return st;
}

// The strides of a [B, H, T, E] tensor: (batch, head, time) from the call, the last dim 1.
std::vector<int64_t> strides_of(const int64_t* bht) {
  return {bht[0], bht[1], bht[2], 1};
}

TensorPtr input(fe::graph::Graph& g, const char* name, Uid uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

void output(const TensorPtr& t, Uid uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  t->set_output(true).set_uid(uid).set_dim(dims).set_stride(strides);
}

template <class Options>
void set_causal(Options& o, CudnnCausal c) {
  if (c == CudnnCausal::kNone) return;
  o.set_diagonal_alignment(c == CudnnCausal::kTopLeft ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
      .set_diagonal_band_right_bound(0);
}

std::string failure(const char* stage, const fe::error_t& e) {
  std::string msg = e.err_msg.empty() ? "error code " + std::to_string(static_cast<int>(e.code)) : e.err_msg;
  return std::string("cuDNN frontend ") + stage + " failed: " + msg;
}

// The graph of key k, built for the device of handle h.
Plan build_plan(cudnnHandle_t h, const CudnnPlanKey& k) {
  Plan p;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(k.type == Elem::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> q_dims{k.batch, k.heads, k.tq, k.d}, k_dims{k.batch, k.kv_heads, k.tk, k.d},
      v_dims{k.batch, k.kv_heads, k.tk, k.dv}, o_dims{k.batch, k.heads, k.tq, k.dv}, lse_dims{k.batch, k.heads, k.tq, 1};
  const AttentionStrides& st = k.strides;  // q, k, v, the output and the gradients may lie strided
  TensorPtr q = input(*g, "q", kQ, q_dims, strides_of(st.q)), kt = input(*g, "k", kK, k_dims, strides_of(st.k)),
            v = input(*g, "v", kV, v_dims, strides_of(st.v));
  TensorPtr bias;
  if (k.bias != CudnnBias::kNone) {
    bias = g->tensor(fe::graph::Tensor_attributes()
                         .set_name("bias")
                         .set_uid(kBias)
                         .set_dim(std::vector<int64_t>(k.bias_dims, k.bias_dims + 4))
                         .set_stride(std::vector<int64_t>(k.bias_strides, k.bias_strides + 4)));
    if (k.bias == CudnnBias::kFp32) bias->set_data_type(fe::DataType_t::FLOAT);  // else the q/k/v type
  }
  float scale = 0;
  std::memcpy(&scale, &k.scale_bits, sizeof scale);
  if (!k.backward) {
    auto o = fe::graph::SDPA_attributes().set_name("oases_attention").set_generate_stats(k.stats).set_attn_scale(scale);
    set_causal(o, k.causal);
    if (bias) o.set_bias(bias);
    auto [out, stats] = g->sdpa(q, kt, v, o);
    output(out, kO, o_dims, strides_of(st.o));
    if (k.stats) {
      output(stats, kStats, lse_dims, contiguous(lse_dims));
      stats->set_data_type(fe::DataType_t::FLOAT);
    }
  } else {
    TensorPtr out = input(*g, "out", kO, o_dims, strides_of(st.o)), dout = input(*g, "dout", kDO, o_dims, strides_of(st.dout));
    TensorPtr lse = input(*g, "lse", kStats, lse_dims, contiguous(lse_dims));
    lse->set_data_type(fe::DataType_t::FLOAT);
    auto o = fe::graph::SDPA_backward_attributes().set_name("oases_attention_backward").set_attn_scale(scale);
    set_causal(o, k.causal);
    if (bias) o.set_bias(bias);
    auto [dq, dk, dv] = g->sdpa_backward(q, kt, v, out, dout, lse, o);
    output(dq, kDQ, q_dims, strides_of(st.dq));
    output(dk, kDK, k_dims, strides_of(st.dk));
    output(dv, kDV, v_dims, strides_of(st.dv));
  }
  // each stage's failure is the reason this key falls back
  std::pair<const char*, std::function<fe::error_t()>> stages[] = {
      {"validate", [&] { return g->validate(); }},
      {"build_operation_graph", [&] { return g->build_operation_graph(h); }},
      {"create_execution_plans", [&] { return g->create_execution_plans({fe::HeurMode_t::A}); }},
      {"check_support", [&] { return g->check_support(h); }},
      {"build_plans", [&] { return g->build_plans(h); }},
      {"get_workspace_size", [&] { return g->get_workspace_size(p.workspace); }},
  };
  for (auto& [stage, call] : stages) {
    if (fe::error_t e = call(); e.is_bad()) {
      p.why = failure(stage, e);
      p.workspace = 0;
      return p;
    }
  }
  p.graph = std::move(g);
  return p;
}

// The cached plan of k, built (or refused) now if this thread has not seen k.
Plan& plan_for(cudnnHandle_t h, const CudnnPlanKey& k) {
  PlanCache& cache = plan_cache();
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxPlans) cache.clear();
  Plan p;
  try {
    p = build_plan(h, k);
  } catch (const std::exception& e) {
    p = Plan{};
    p.why = std::string("cuDNN frontend threw while building the graph: ") + e.what();
  }
  return cache.emplace(k, std::move(p)).first->second;
}

// Runs the forward or backward graph of (a, t) over the tensors of `pack` (q, k, v, ... by uid):
// the first bias layout whose plan builds, its workspace and converted bias from `scratch`. False
// with the reasons in *why; true with *why empty, or saying that the mask went as a converted copy
// and why not as it lies.
bool run(cudnnHandle_t h, const AttentionDesc& a, Elem t, bool backward, bool stats, VariantPack pack, const ScratchFn& scratch,
         cudaStream_t s, std::string* why) {
  if (std::string no = cudnn_attention_refusal(a, t); !no.empty()) {
    *why = no;
    return false;
  }
  if (!h) {
    *why = "no cuDNN handle on this stream";
    return false;
  }
  for (const auto& [uid, ptr] : pack) {
    if (!cudnn_aligned(ptr)) {
      *why = "a tensor that does not start on 16 bytes (cuDNN loads 16-byte vectors)";
      return false;
    }
  }
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    *why = std::string("cudaGetDevice failed: ") + cudaGetErrorString(e);
    return false;
  }
  std::vector<CudnnBiasLayout> layouts = cudnn_bias_layouts(a, t);
  if (!a.mask) layouts.assign(1, CudnnBiasLayout{});
  std::string reasons;  // of the layouts passed over
  auto note = [&reasons](const std::string& r) {
    if (!reasons.empty()) reasons += "; ";
    reasons += r;
  };
  try {
    for (const CudnnBiasLayout& l : layouts) {
      if (l.kind == CudnnBias::kFp32 && !cudnn_aligned(a.mask)) {
        note("the fp32 mask does not start on 16 bytes");
        continue;
      }
      Plan& p = plan_for(h, cudnn_plan_key(a, t, backward, stats, l, device));
      if (!p.graph) {
        note(p.why);
        continue;
      }
      void* workspace = p.workspace > 0 ? scratch(static_cast<size_t>(p.workspace)) : nullptr;
      if (l.kind == CudnnBias::kFp32) pack[kBias] = const_cast<void*>(a.mask);
      if (l.kind == CudnnBias::kConverted) {
        void* b = scratch(l.bytes);
        attention_bias_convert(t, static_cast<const float*>(a.mask), a.mask_strides, l, b, s);
        pack[kBias] = b;
      }
      if (cudnnStatus_t st = cudnnSetStream(h, s); st != CUDNN_STATUS_SUCCESS) {
        *why = std::string("cudnnSetStream failed: ") + cudnnGetErrorString(st);
        return false;
      }
      if (fe::error_t e = p.graph->execute(h, pack, workspace); e.is_bad()) {
        // not retried with this key: the next call takes the next layout or the fallback at once
        p.why = failure("execute", e);
        p.graph.reset();
        *why = p.why;
        return false;
      }
      ++(backward ? backward_calls : forward_calls);
      // on success *why says how the mask went, when not as it lies
      why->clear();
      if (l.kind == CudnnBias::kConverted) {
        *why = std::string("the mask as a ") + elem_name(t) + " bias" + (reasons.empty() ? "" : " (" + reasons + ")");
      }
      return true;
    }
  } catch (const std::exception& e) {
    *why = std::string("cuDNN attention threw: ") + e.what();
    return false;
  }
  *why = reasons.empty() ? "no cuDNN graph for this call" : reasons;
  return false;
}

}  // namespace

bool cudnn_attention_forward(void* handle, const AttentionDesc& a, Elem t, const void* q, const void* k, const void* v, void* out,
                             float* lse, const ScratchFn& scratch, cudaStream_t s, std::string* why) {
  VariantPack pack{{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, out}};
  if (lse) pack[kStats] = lse;
  return run(static_cast<cudnnHandle_t>(handle), a, t, false, lse != nullptr, std::move(pack), scratch, s, why);
}

bool cudnn_attention_backward(void* handle, const AttentionDesc& a, Elem t, const void* dout, const void* q, const void* k, const void* v,
                              const void* out, const float* lse, void* dq, void* dk, void* dv, const ScratchFn& scratch, cudaStream_t s,
                              std::string* why) {
  VariantPack pack{{kQ, const_cast<void*>(q)},
                   {kK, const_cast<void*>(k)},
                   {kV, const_cast<void*>(v)},
                   {kO, const_cast<void*>(out)},
                   {kDO, const_cast<void*>(dout)},
                   {kStats, const_cast<float*>(lse)},
                   {kDQ, dq},
                   {kDK, dk},
                   {kDV, dv}};
  return run(static_cast<cudnnHandle_t>(handle), a, t, true, true, std::move(pack), scratch, s, why);
}

#endif  // OASES_WITH_CUDNN_FRONTEND

}  // namespace oases::cuda
