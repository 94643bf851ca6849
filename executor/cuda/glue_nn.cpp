// CUDA glue for matrix products, reductions, softmax, normalisations, attention and losses, with
// their backward ops (the CPU glue is executor/cpu/glue_nn.cpp).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "executor/cpu/common.h"
#include "graph/passes/fusion.h"
#include "executor/cuda/cuda_context.h"
#include "executor/notes.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/reduce.h"

namespace oases::cuda {

namespace {

int64_t numel_of(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= s[i];
  return n;
}

// A device product as one cuBLASLt matrix (its epilogues take no batches): a's batch folds into
// the rows where b is one matrix and a is not transposed (as matmul() does). Row-major, result
// contiguous.
struct OneMatrix {
  bool applies = false;
  GemmDesc d;
};
OneMatrix one_matrix(const CudaContext& c, std::vector<int64_t> sa, std::vector<int64_t> sb, const std::vector<int64_t>& so, bool ta,
                     bool tb) {
  OneMatrix o;
  while (sa.size() < so.size()) sa.insert(sa.begin(), 1);
  while (sb.size() < so.size()) sb.insert(sb.begin(), 1);
  const size_t r = sa.size();
  if (r < 2 || !c.blas || ta || numel_of(sb, 0, r - 2) != 1) return o;
  const int64_t M = sa[r - 2], K = sa[r - 1];
  o.d.trans_a = ta;
  o.d.trans_b = tb;
  o.d.m = numel_of(sa, 0, r - 2) * M;
  o.d.n = so.back();
  o.d.k = K;
  o.d.lda = K;
  o.d.ldb = tb ? K : so.back();
  o.d.ldc = so.back();
  o.applies = true;
  return o;
}

// Scratch one padded product may take (gemm_plan.h): blocks of the result's rows keep it there.
// OASES_GEMM_PAD_SCRATCH (bytes; read per launch, the GPU tests shrink it to make blocks) sets it;
// 0 turns padding off.
size_t pad_scratch_limit() {
  const char* e = std::getenv("OASES_GEMM_PAD_SCRATCH");
  return e && *e ? static_cast<size_t>(std::strtoull(e, nullptr, 10)) : size_t(384) << 20;
}

// One product (batch 1) on the compute stream; rows not 16-byte aligned (an odd vocabulary's
// logits in bf16) go through padded copies in scratch, so cuBLASLt keeps its fast kernels.
void single_gemm(CudaContext& c, Elem t, const GemmDesc& d, const void* a, const void* b, void* out) {
  auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  const size_t limit = pad_scratch_limit();
  PaddedGemm p = limit ? plan_padded_gemm(elem_size(t), d, addr(a), addr(b), addr(out), limit) : PaddedGemm{};
  if (!p.used()) {
    gemm(*c.blas, t, d, a, b, out);
    return;
  }
  if (verbose_notes()) {
    note_once(fmt::format("matrix product [{} x {}] x [{} x {}] with rows not 16-byte aligned: through padded copies ({}{}{}in blocks of {} rows)",
                          d.m, d.k, d.k, d.n, p.pad_a ? "a, " : "", p.pad_b ? "b, " : "", p.pad_c ? "the result, " : "", p.block));
  }
  gemm_padded(*c.blas, t, d, p, a, b, out, c.scratch(p.scratch_bytes()));
}

// Row-major batched product with numpy batch broadcasting; a, b stored as sa, sb (already
// transposed per ta/tb), out [..., M, N].
void matmul(CudaContext& c, Elem t, const void* a, std::vector<int64_t> sa, const void* b, std::vector<int64_t> sb, void* out,
            std::vector<int64_t> so, bool ta, bool tb) {
  if (!c.blas) c.k.fail("matrix products run on the compute stream only");
  size_t ra = sa.size(), rb = sb.size(), ro = so.size();
  int64_t M = ta ? sa[ra - 1] : sa[ra - 2], K = ta ? sa[ra - 2] : sa[ra - 1], N = tb ? sb[rb - 2] : sb[rb - 1];
  int64_t ba = numel_of(sa, 0, ra - 2), bb = numel_of(sb, 0, rb - 2), bo = numel_of(so, 0, ro - 2);
  GemmDesc d;
  d.trans_a = ta;
  d.trans_b = tb;
  d.n = N;
  d.k = K;
  d.lda = ta ? M : K;
  d.ldb = tb ? K : N;
  d.ldc = N;
  size_t es = elem_size(t);
  if (bb == 1 && !ta) {  // a weight: fold the batch of a into rows
    d.m = ba * M;
    single_gemm(c, t, d, a, b, out);
    return;
  }
  d.m = M;
  if (bo == 1) {
    single_gemm(c, t, d, a, b, out);
    return;
  }
  if ((ba == bo || ba == 1) && (bb == bo || bb == 1)) {
    d.batch = bo;
    d.stride_a = ba == 1 ? 0 : M * K;
    d.stride_b = bb == 1 ? 0 : K * N;
    d.stride_c = M * N;
    gemm(*c.blas, t, d, a, b, out);
    return;
  }
  // general broadcasting: one product per output batch
  std::vector<int64_t> obatch(so.begin(), so.end() - 2);
  std::vector<int64_t> sta = broadcast_strides(std::vector<int64_t>(sa.begin(), sa.end() - 2), obatch);
  std::vector<int64_t> stb = broadcast_strides(std::vector<int64_t>(sb.begin(), sb.end() - 2), obatch);
  for (int64_t i = 0; i < bo; ++i) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int64_t dd = static_cast<int64_t>(obatch.size()) - 1; dd >= 0; --dd) {
      int64_t coord = rem % obatch[static_cast<size_t>(dd)];
      rem /= obatch[static_cast<size_t>(dd)];
      oa += coord * sta[static_cast<size_t>(dd)];
      ob += coord * stb[static_cast<size_t>(dd)];
    }
    gemm(*c.blas, t, d, static_cast<const char*>(a) + oa * M * K * static_cast<int64_t>(es),
         static_cast<const char*>(b) + ob * K * N * static_cast<int64_t>(es),
         static_cast<char*>(out) + i * M * N * static_cast<int64_t>(es));
  }
}

ReduceKind reduce_kind(const std::string& op) {
  if (op == "ReduceSum") return ReduceKind::kSum;
  if (op == "ReduceMean") return ReduceKind::kMean;
  if (op == "ReduceMax") return ReduceKind::kMax;
  if (op == "ReduceMin") return ReduceKind::kMin;
  if (op == "ReduceProd") return ReduceKind::kProd;
  if (op == "ReduceL1") return ReduceKind::kL1;
  if (op == "ReduceL2") return ReduceKind::kL2;
  if (op == "ReduceSumSquare") return ReduceKind::kSumSquare;
  if (op == "ReduceLogSum") return ReduceKind::kLogSum;
  return ReduceKind::kLogSumExp;
}

void outer_inner(const Shape& s, int64_t axis, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int64_t d = 0; d < axis; ++d) *outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) *inner *= s[d];
}

// scale (and bias) broadcast to the normalised shape [n]: the tensor itself when it has n elements.
const void* normalised_param(CudaContext& c, int slot, const Shape& x, int64_t axis, int64_t n) {
  const TensorView& p = c.in(slot);
  if (p.numel() == n) return p.data;
  std::vector<int64_t> ns(x.begin() + axis, x.end());
  void* buf = c.scratch(static_cast<size_t>(n) * dtype_size(p.dtype));
  copy(p.data, buf, dtype_size(p.dtype), broadcast_plan(ns, {dims(p.shape)}), c.stream);
  return buf;
}

AttentionDesc attention_desc(CudaContext& c, int q_slot) {
  cpu::AttentionArgs a = cpu::attention_args(c.k, q_slot);
  AttentionDesc d;
  d.batch = a.shape.batch;
  d.heads = a.shape.heads;
  d.kv_heads = a.shape.kv_heads;
  d.tq = a.shape.tq;
  d.tk = a.shape.tk;
  d.d = a.shape.d;
  d.dv = a.shape.dv;
  d.causal = a.shape.causal;
  d.scale = a.shape.scale;
  d.mask = a.mask;
  d.mask_is_bool = a.mask_bool;
  for (int i = 0; i < 4; ++i) d.mask_strides[i] = a.ms[i];
  return d;
}

// The attention path: cuDNN's fused kernels where they take the call, else the batched products
// where they apply (on the compute stream, which has the cuBLAS handle), else the own fused
// kernels. OASES_CUDA_ATTENTION=gemm skips cuDNN, =own takes the own kernels (read per launch:
// tests switch it).
std::string attention_choice() {
  const char* e = std::getenv("OASES_CUDA_ATTENTION");
  return e ? e : "";
}

bool use_attention_gemm(const CudaContext& c, const AttentionDesc& d, Elem t, const std::string& choice) {
  return choice != "own" && c.blas && attention_gemm_applies(d, t);
}

// Why cuDNN cannot be tried at all on this launch ("" when it can).
std::string cudnn_attention_skipped(const CudaContext& c, const std::string& choice) {
  if (choice == "gemm" || choice == "own") return "OASES_CUDA_ATTENTION=" + choice;
  if (!c.cudnn) return "no cuDNN handle on this stream";
  return "";
}

// --verbose: which path ran and, when it was not cuDNN, why; once per distinct note.
void note_attention(const char* pass, const std::string& path, const std::string& why_not_cudnn) {
  if (!verbose_notes()) return;
  note_once(std::string("attention ") + pass + ": " + path + (why_not_cudnn.empty() ? "" : " (cuDNN not taken: " + why_not_cudnn + ")"));
}

// p advanced by `elements` of `es` bytes.
template <class P>
P* at(P* p, int64_t elements, size_t es) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(p) + static_cast<size_t>(elements) * es);
}

// The strides of a strided attention's tensors from its layout attributes (graph/ops/fused.cpp);
// off[0..2]: q, k, v's offsets into their buffers; off[3..5] (backward): dq, dk, dv's into theirs.
void set_strides(CudaContext& c, AttentionDesc* d, int64_t off[6], bool backward) {
  d->strided = true;
  d->st = contiguous_attention_strides(*d);
  int64_t* const st[8] = {d->st.q, d->st.k, d->st.v, d->st.o, d->st.dout, d->st.dq, d->st.dk, d->st.dv};
  cpu::attention_layouts(c.k, backward, st, off);
}

// The paths that read contiguous tensors only (batched products, own kernels) take a strided
// call through contiguous copies in scratch: `in` copies a tensor there, `out` gives the
// contiguous buffer of a result and `finish` copies every result back where the call wants it.
class ContiguousCopies {
 public:
  ContiguousCopies(CudaContext& c, const AttentionDesc& d, Elem t) : c_(c), d_(d), t_(t), cs_(contiguous_attention_strides(d)) {}
  const void* in(const void* src, const int64_t* st, const int64_t* cst, int64_t heads, int64_t time, int64_t width) {
    if (!d_.strided) return src;
    void* dst = c_.scratch(bytes(heads, time, width));
    attention_copy_heads(t_, src, st, dst, cst, d_.batch, heads, time, width, c_.stream);
    return dst;
  }
  void* out(void* dst, const int64_t* st, const int64_t* cst, int64_t heads, int64_t time, int64_t width) {
    if (!d_.strided) return dst;
    void* tmp = c_.scratch(bytes(heads, time, width));
    results_.push_back(Result{tmp, dst, {st[0], st[1], st[2]}, {cst[0], cst[1], cst[2]}, heads, time, width});
    return tmp;
  }
  void finish() {
    for (const Result& r : results_) attention_copy_heads(t_, r.tmp, r.cst, r.dst, r.st, d_.batch, r.heads, r.time, r.width, c_.stream);
  }
  const AttentionStrides& contiguous() const { return cs_; }
  AttentionDesc desc() const {
    AttentionDesc cd = d_;
    cd.strided = false;
    return cd;
  }

 private:
  struct Result {
    void* tmp;
    void* dst;
    int64_t st[3], cst[3];
    int64_t heads, time, width;
  };
  size_t bytes(int64_t heads, int64_t time, int64_t width) const {
    return static_cast<size_t>(d_.batch * heads * time * width) * elem_size(t_);
  }
  CudaContext& c_;
  const AttentionDesc& d_;
  Elem t_;
  AttentionStrides cs_;
  std::vector<Result> results_;
};

// One attention call's way down its paths: cuDNN's fused kernels where they take it (strides and
// all; `cudnn` runs them and says whether they did), else the batched products where they apply,
// else the own kernels, both on the contiguous copies of a strided call's q, k, v (`q`, `k`, `v`).
struct AttentionPaths {
  AttentionPaths(CudaContext& ctx, const AttentionDesc& desc, Elem type, const char* which)
      : c(ctx), d(desc), t(type), pass(which), cp(ctx, desc, type), cd(cp.desc()) {}
  CudaContext& c;
  const AttentionDesc& d;
  Elem t;
  const char* pass;  // "forward" or "backward", for --verbose
  std::string choice = attention_choice(), why;
  ContiguousCopies cp;
  AttentionDesc cd;
  const void *q = nullptr, *k = nullptr, *v = nullptr;

  template <class RunCudnn>
  bool cudnn_ran(RunCudnn&& run) {
    why = cudnn_attention_skipped(c, choice);
    auto scratch = [this](size_t bytes) { return c.scratch(bytes); };
    if (!why.empty() || !run(scratch, &why)) return false;
    note_attention(pass, why.empty() ? "cuDNN fused attention" : "cuDNN fused attention, " + why, "");
    return true;
  }
  void copy_qkv(const void* q0, const void* k0, const void* v0) {
    const AttentionStrides& cs = cp.contiguous();
    q = cp.in(q0, d.st.q, cs.q, d.heads, d.tq, d.d);
    k = cp.in(k0, d.st.k, cs.k, d.kv_heads, d.tk, d.d);
    v = cp.in(v0, d.st.v, cs.v, d.kv_heads, d.tk, d.dv);
  }
  // true: the batched products (else the own kernels), noted for --verbose
  bool gemm() {
    bool g = use_attention_gemm(c, cd, t, choice);
    note_attention(pass, std::string(g ? "batched products" : "own kernels") + (d.strided ? " on contiguous copies" : ""), why);
    return g;
  }
};

void attention_forward_call(CudaContext& c, const AttentionDesc& d, Elem t, const void* q, const void* k, const void* v, void* out,
                            float* lse) {
  AttentionPaths p(c, d, t, "forward");
  if (p.cudnn_ran([&](const ScratchFn& scratch, std::string* why) {
        return cudnn_attention_forward(c.cudnn, d, t, q, k, v, out, lse, scratch, c.stream, why);
      })) {
    return;
  }
  p.copy_qkv(q, k, v);
  const AttentionStrides& cs = p.cp.contiguous();
  void* co = p.cp.out(out, d.st.o, cs.o, d.heads, d.tq, d.dv);
  if (p.gemm()) {
    attention_gemm_forward(*c.blas, p.cd, t, p.q, p.k, p.v, co, lse, c.scratch(attention_gemm_scratch_bytes(p.cd, t, false)));
  } else {
    attention_forward(p.cd, t, p.q, p.k, p.v, co, lse, c.stream);
  }
  p.cp.finish();
}

void attention_backward_call(CudaContext& c, const AttentionDesc& d, Elem t, const void* dout, const void* q, const void* k, const void* v,
                             const void* out, const float* lse, void* dq, void* dk, void* dv) {
  AttentionPaths p(c, d, t, "backward");
  if (p.cudnn_ran([&](const ScratchFn& scratch, std::string* why) {
        return cudnn_attention_backward(c.cudnn, d, t, dout, q, k, v, out, lse, dq, dk, dv, scratch, c.stream, why);
      })) {
    return;
  }
  p.copy_qkv(q, k, v);
  const AttentionStrides& cs = p.cp.contiguous();
  const void* cdo = p.cp.in(dout, d.st.dout, cs.dout, d.heads, d.tq, d.dv);
  const void* co = p.cp.in(out, d.st.o, cs.o, d.heads, d.tq, d.dv);
  void* cdq = p.cp.out(dq, d.st.dq, cs.dq, d.heads, d.tq, d.d);
  void* cdk = p.cp.out(dk, d.st.dk, cs.dk, d.kv_heads, d.tk, d.d);
  void* cdv = p.cp.out(dv, d.st.dv, cs.dv, d.kv_heads, d.tk, d.dv);
  if (p.gemm()) {
    attention_gemm_backward(*c.blas, p.cd, t, cdo, p.q, p.k, p.v, co, lse, cdq, cdk, cdv,
                            c.scratch(attention_gemm_scratch_bytes(p.cd, t, true)));
  } else {
    attention_backward(p.cd, t, cdo, p.q, p.k, p.v, co, lse, cdq, cdk, cdv, c.scratch_floats(attention_scratch_floats(p.cd)), c.stream);
  }
  p.cp.finish();
}

LossDesc loss_desc(CudaContext& c, int scores_slot) {
  const Shape& s = c.in(scores_slot).shape;
  LossDesc l;
  l.n = s[0];
  l.c = s[1];
  l.d = 1;
  for (size_t i = 2; i < s.size(); ++i) l.d *= s[i];
  if (c.attrs().has("ignore_index")) l.ignore_index = c.attrs().get_int("ignore_index", 0);
  std::string red = c.attrs().get_string("reduction", "mean");
  l.reduction = red == "none" ? 0 : red == "sum" ? 2 : 1;
  l.idx64 = c.in(scores_slot + 1).dtype == DType::kI64;
  if (!l.idx64 && c.in(scores_slot + 1).dtype != DType::kI32) c.k.fail("labels must be int64 or int32 on CUDA");
  return l;
}

}  // namespace

void register_cuda_nn(CudaKernelRegistry& r) {
  r.add("", "MatMul", [](CudaContext& c) {
    auto sa = cpu::promote_matrix(c.in(0).shape, true), sb = cpu::promote_matrix(c.in(1).shape, false);
    std::vector<int64_t> so = c.out(0).shape;
    if (c.in(0).shape.size() == 1) so.insert(so.end() - (c.in(1).shape.size() == 1 ? 0 : 1), 1);
    if (c.in(1).shape.size() == 1) so.push_back(1);
    // numpy: the shorter operand's batch dims are padded on the left
    while (sa.size() < so.size()) sa.insert(sa.begin(), 1);
    while (sb.size() < so.size()) sb.insert(sb.begin(), 1);
    matmul(c, elem(c.in(0).dtype), c.in(0).data, sa, c.in(1).data, sb, c.out(0).data, so, false, false);
  });
  r.add("oases", "MatMulT", [](CudaContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    std::vector<int64_t> sa = dims(c.in(0).shape), sb = dims(c.in(1).shape), so = dims(c.out(0).shape);
    while (sa.size() < so.size()) sa.insert(sa.begin(), 1);
    while (sb.size() < so.size()) sb.insert(sb.begin(), 1);
    matmul(c, elem(c.in(0).dtype), c.in(0).data, sa, c.in(1).data, sb, c.out(0).data, so, ta, tb);
  });
  // the device programs' fused products (graph/passes/fusion.h fuse_for_device): one cuBLASLt call
  // with its bias/activation epilogue where the product is one matrix and cuBLASLt has the
  // activation; else the product, then one kernel for bias, residual and activation
  r.add(kDeviceFusedDomain, "FusedMatMul", [](CudaContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    std::string act = c.attrs().get_string("activation", "");
    EpilogueAct ea = EpilogueAct::kNone;
    if (act == "relu") {
      ea = EpilogueAct::kRelu;
    } else if (act == "gelu") {
      ea = EpilogueAct::kGeluErf;
    } else if (act == "gelu_tanh") {
      ea = EpilogueAct::kGeluTanh;
    } else if (!act.empty() && act != "none") {
      c.k.fail("unknown activation '{}'", act);
    }
    const void* bias = c.has_input(2) ? c.in(2).data : nullptr;
    const void* res = c.has_input(3) ? c.in(3).data : nullptr;
    // output 1: the activation's input, which its gradient reads (a training step's GELU)
    void* preact = c.has_output(1) ? c.out(1).data : nullptr;
    if (preact && ea != EpilogueAct::kGeluTanh && ea != EpilogueAct::kGeluErf) c.k.fail("a pre-activation output needs a GELU, not '{}'", act);
    Elem t = elem(c.in(0).dtype);
    std::vector<int64_t> sa = dims(c.in(0).shape), sb = dims(c.in(1).shape), so = dims(c.out(0).shape);
    const int64_t cols = so.back(), rows = c.out(0).numel() / std::max<int64_t>(cols, 1);
    OneMatrix one = one_matrix(c, sa, sb, so, ta, tb);
    if (preact) {
      if (one.applies && ea == EpilogueAct::kGeluTanh && gemm_gelu_aux(*c.blas, t, one.d, c.in(0).data, c.in(1).data, c.out(0).data, bias, preact)) {
        return;
      }
      // the product and bias into the pre-activation, the GELU from it
      matmul(c, t, c.in(0).data, sa, c.in(1).data, sb, preact, so, ta, tb);
      if (bias) bias_activation(t, preact, rows, cols, bias, EpilogueAct::kNone, nullptr, c.stream);
      gelu_forward(ea == EpilogueAct::kGeluTanh, t, preact, c.out(0).data, c.out(0).numel(), c.stream);
      return;
    }
    if (bias && !res && ea != EpilogueAct::kGeluErf && one.applies) {
      GemmEpilogue e = ea == EpilogueAct::kRelu ? GemmEpilogue::kBiasRelu : ea == EpilogueAct::kGeluTanh ? GemmEpilogue::kBiasGeluTanh
                                                                                                          : GemmEpilogue::kBias;
      if (gemm_epilogue(*c.blas, t, one.d, c.in(0).data, c.in(1).data, c.out(0).data, bias, e)) return;
    }
    matmul(c, t, c.in(0).data, sa, c.in(1).data, sb, c.out(0).data, so, ta, tb);
    if (bias || res || ea != EpilogueAct::kNone) bias_activation(t, c.out(0).data, rows, cols, bias, ea, res, c.stream);
  });
  // a training step's backward product into the GELU's gradient, and the bias gradient of the
  // product that made the GELU's input: cuBLASLt's DGELU(_BGRAD) epilogue where it applies; else
  // the product, the GELU's gradient over it in place, and the column sums
  r.add(kDeviceFusedDomain, "MatMulGeluGrad", [](CudaContext& c) {
    bool ta = c.attrs().get_int("trans_a", 0) != 0, tb = c.attrs().get_int("trans_b", 0) != 0;
    bool tanh_form = c.attrs().get_string("approximate", "none") == "tanh";
    Elem t = elem(c.in(0).dtype);
    std::vector<int64_t> sa = dims(c.in(0).shape), sb = dims(c.in(1).shape), so = dims(c.out(0).shape);
    void* dbias = c.has_output(1) ? c.out(1).data : nullptr;
    OneMatrix one = one_matrix(c, sa, sb, so, ta, tb);
    if (tanh_form && one.applies && gemm_gelu_grad(*c.blas, t, one.d, c.in(0).data, c.in(1).data, c.out(0).data, c.in(2).data, dbias)) return;
    matmul(c, t, c.in(0).data, sa, c.in(1).data, sb, c.out(0).data, so, ta, tb);
    gelu_backward(tanh_form, t, c.out(0).data, c.in(2).data, c.out(0).data, c.out(0).numel(), c.stream);
    if (dbias) {
      std::vector<int64_t> axes(so.size() - 1);
      for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
      reduce(ReduceKind::kSum, t, c.out(0).data, so, axes, dbias, c.stream);
    }
  });
  r.add("", "Gemm", [](CudaContext& c) {
    bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
    float alpha = c.attrs().get_float("alpha", 1.f), beta = c.attrs().get_float("beta", 1.f);
    Elem t = elem(c.in(0).dtype);
    GemmDesc d;
    d.trans_a = ta;
    d.trans_b = tb;
    d.m = c.out(0).shape[0];
    d.n = c.out(0).shape[1];
    d.k = ta ? c.in(0).shape[0] : c.in(0).shape[1];
    d.lda = c.in(0).shape[1];
    d.ldb = c.in(1).shape[1];
    d.ldc = d.n;
    d.alpha = alpha;
    d.beta = 0.f;
    if (c.has_input(2) && beta != 0.f) {
      copy(c.in(2).data, c.out(0).data, dtype_size(c.out(0).dtype), broadcast_plan(dims(c.out(0).shape), {dims(c.in(2).shape)}), c.stream);
      d.beta = beta;
    }
    if (!c.blas) c.k.fail("matrix products run on the compute stream only");
    gemm(*c.blas, t, d, c.in(0).data, c.in(1).data, c.out(0).data);
  });
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                         "ReduceLogSum", "ReduceLogSumExp"}) {
    ReduceKind kind = reduce_kind(op);
    r.add("", op, [kind](CudaContext& c) {
      std::vector<int64_t> axes = c.attrs().get_ints("axes");
      if (c.in(0).shape == c.out(0).shape && axes.empty()) {  // noop_with_empty_axes
        copy_bytes(c.in(0).data, c.out(0).data, c.in(0).nbytes(), c.stream);
        return;
      }
      if (axes.empty()) {
        for (size_t d = 0; d < c.in(0).shape.size(); ++d) axes.push_back(static_cast<int64_t>(d));
      }
      reduce(kind, elem(c.in(0).dtype), c.in(0).data, dims(c.in(0).shape), axes, c.out(0).data, c.stream);
    });
  }
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    bool log = std::string(op) == "LogSoftmax";
    r.add("", op, [log](CudaContext& c) {
      const Shape& s = c.in(0).shape;
      int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size())), outer, inner;
      outer_inner(s, axis, &outer, &inner);
      softmax_forward(log, elem(c.in(0).dtype), c.in(0).data, c.out(0).data, outer, s[static_cast<size_t>(axis)], inner, c.stream);
    });
  }
  r.add("oases", "SoftmaxGrad", [](CudaContext& c) {
    const Shape& s = c.in(0).shape;
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size())), outer, inner;
    outer_inner(s, axis, &outer, &inner);
    softmax_backward(c.attrs().get_int("log", 0) != 0, elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.out(0).data, outer,
                     s[static_cast<size_t>(axis)], inner, c.stream);
  });
  auto norm = [](CudaContext& c, bool rms) {
    const Shape& s = c.in(0).shape;
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
    float eps = c.attrs().get_float("epsilon", rms ? 1e-6f : 1e-5f);
    int64_t rows = 1, n = 1;
    for (int64_t d = 0; d < axis; ++d) rows *= s[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(axis); d < s.size(); ++d) n *= s[d];
    const void* scale = normalised_param(c, 1, s, axis, n);
    Elem t = elem(c.in(0).dtype);
    if (rms) {
      float* rstd = c.has_output(1) ? c.out(1).as<float>() : nullptr;
      rmsnorm_forward(t, c.in(0).data, scale, c.out(0).data, rstd, rows, n, eps, c.stream);
    } else {
      const void* bias = c.has_input(2) ? normalised_param(c, 2, s, axis, n) : nullptr;
      float* mean = c.has_output(1) ? c.out(1).as<float>() : nullptr;
      float* rstd = c.has_output(2) ? c.out(2).as<float>() : nullptr;
      layernorm_forward(t, c.in(0).data, scale, bias, c.out(0).data, mean, rstd, rows, n, eps, c.stream);
    }
  };
  r.add("", "LayerNormalization", [norm](CudaContext& c) { norm(c, false); });
  r.add("oases", "RMSNormalization", [norm](CudaContext& c) { norm(c, true); });
  auto norm_grad = [](CudaContext& c, bool rms) {
    const Shape& s = c.in(1).shape;
    int64_t axis = normalize_axis(c.attrs().get_int("axis", -1), static_cast<int64_t>(s.size()));
    int64_t rows = 1;
    for (int64_t d = 0; d < axis; ++d) rows *= s[static_cast<size_t>(d)];
    int64_t n = shape_numel(s) / std::max<int64_t>(1, rows);
    const void* scale = normalised_param(c, 2, s, axis, n);
    Elem t = elem(c.in(1).dtype);
    // parameter gradients of a broadcast scale/bias would need a reduction back to its shape
    void* ds = c.has_output(1) ? c.out(1).data : nullptr;
    if (ds && c.out(1).numel() != n) c.k.fail("a scale broadcast inside the normalised shape is not supported on CUDA");
    float* scratch = c.scratch_floats(norm_backward_scratch_floats(rows, n));
    if (rms) {
      rmsnorm_backward(t, c.in(0).data, c.in(1).data, scale, c.in(3).as<float>(), c.out(0).data, ds, rows, n, scratch, c.stream);
    } else {
      void* db = c.has_output(2) ? c.out(2).data : nullptr;
      if (db && c.out(2).numel() != n) c.k.fail("a bias broadcast inside the normalised shape is not supported on CUDA");
      layernorm_backward(t, c.in(0).data, c.in(1).data, scale, c.in(3).as<float>(), c.in(4).as<float>(), c.out(0).data, ds, db, rows, n,
                         scratch, c.stream);
    }
  };
  r.add("oases", "LayerNormGrad", [norm_grad](CudaContext& c) { norm_grad(c, false); });
  r.add("oases", "RMSNormGrad", [norm_grad](CudaContext& c) { norm_grad(c, true); });
  r.add("oases", "Attention", [](CudaContext& c) {
    AttentionDesc d = attention_desc(c, 0);
    float* lse = c.has_output(1) ? c.out(1).as<float>() : nullptr;
    attention_forward_call(c, d, elem(c.in(0).dtype), c.in(0).data, c.in(1).data, c.in(2).data, c.out(0).data, lse);
  });
  r.add("oases", "AttentionGrad", [](CudaContext& c) {
    AttentionDesc d = attention_desc(c, 1);
    attention_backward_call(c, d, elem(c.in(1).dtype), c.in(0).data, c.in(1).data, c.in(2).data, c.in(3).data, c.in(4).data,
                            c.in(5).as<float>(), c.out(0).data, c.out(1).data, c.out(2).data);
  });
  // a device program's strided attention (graph/passes/fusion.h): q, k, v read where the
  // projections left them, the output written [B, T, H, Dv], the gradients into the projections'
  r.add(kDeviceFusedDomain, "Attention", [](CudaContext& c) {
    AttentionDesc d = attention_desc(c, 0);
    Elem t = elem(c.in(0).dtype);
    int64_t off[6];
    set_strides(c, &d, off, false);
    const size_t es = elem_size(t);
    float* lse = c.has_output(1) ? c.out(1).as<float>() : nullptr;
    attention_forward_call(c, d, t, at(c.in(0).data, off[0], es), at(c.in(1).data, off[1], es), at(c.in(2).data, off[2], es), c.out(0).data,
                           lse);
  });
  r.add(kDeviceFusedDomain, "AttentionGrad", [](CudaContext& c) {
    AttentionDesc d = attention_desc(c, 1);
    Elem t = elem(c.in(1).dtype);
    int64_t off[6];
    set_strides(c, &d, off, true);
    const int64_t* goff = off + 3;
    const size_t es = elem_size(t);
    const bool packed = !c.attrs().get_ints("packed_shape").empty();
    void* grads[3];
    int64_t* gst[3] = {d.st.dq, d.st.dk, d.st.dv};
    const AttentionStrides cs = contiguous_attention_strides(d);
    const int64_t* cst[3] = {cs.dq, cs.dk, cs.dv};
    const int64_t sizes[3] = {d.batch * d.heads * d.tq * d.d, d.batch * d.kv_heads * d.tk * d.d, d.batch * d.kv_heads * d.tk * d.dv};
    for (int i = 0; i < 3; ++i) {
      int slot = packed ? 0 : i;
      if (c.has_output(slot)) {
        grads[i] = at(c.out(slot).data, goff[i], es);
      } else {  // a gradient nobody reads: written to scratch, contiguous
        grads[i] = c.scratch(static_cast<size_t>(sizes[i]) * es);
        std::copy(cst[i], cst[i] + 3, gst[i]);
      }
    }
    attention_backward_call(c, d, t, c.in(0).data, at(c.in(1).data, off[0], es), at(c.in(2).data, off[1], es),
                            at(c.in(3).data, off[2], es), c.in(4).data, c.in(5).as<float>(), grads[0], grads[1], grads[2]);
  });
  r.add("", "SoftmaxCrossEntropyLoss", [](CudaContext& c) {
    LossDesc l = loss_desc(c, 0);
    void* logp = c.has_output(1) ? c.out(1).data : nullptr;
    const void* w = c.has_input(2) ? c.in(2).data : nullptr;
    softmax_cross_entropy_forward(l, elem(c.in(0).dtype), c.in(0).data, c.in(1).data, w, c.out(0).data, logp,
                                  c.scratch_floats(loss_scratch_floats(l)), c.fault, c.stream);
  });
  r.add("", "NegativeLogLikelihoodLoss", [](CudaContext& c) {
    LossDesc l = loss_desc(c, 0);
    const void* w = c.has_input(2) ? c.in(2).data : nullptr;
    nll_forward(l, elem(c.in(0).dtype), c.in(0).data, c.in(1).data, w, c.out(0).data, c.scratch_floats(loss_scratch_floats(l)), c.fault,
                c.stream);
  });
  r.add("oases", "SoftmaxCrossEntropyGrad", [](CudaContext& c) {
    LossDesc l = loss_desc(c, 1);
    const void* w = c.has_input(3) ? c.in(3).data : nullptr;
    softmax_cross_entropy_backward(l, elem(c.in(1).dtype), c.in(0).data, c.in(1).data, c.in(2).data, w, c.out(0).data,
                                   c.scratch_floats(loss_scratch_floats(l)), c.fault, c.stream);
  });
  // the device programs' losses on 16-bit logits (graph/passes/fusion.h fuse_for_device): the
  // scores widened per element, the gradient written in its own type (float32 or the scores')
  r.add(kDeviceFusedDomain, "SoftmaxCrossEntropyLoss", [](CudaContext& c) {
    LossDesc l = loss_desc(c, 0);
    const void* w = c.has_input(2) ? c.in(2).data : nullptr;
    softmax_cross_entropy_forward(l, elem(c.out(0).dtype), elem(c.in(0).dtype), c.in(0).data, c.in(1).data, w, c.out(0).data, nullptr,
                                  c.scratch_floats(loss_scratch_floats(l)), c.fault, c.stream);
  });
  r.add(kDeviceFusedDomain, "SoftmaxCrossEntropyGrad", [](CudaContext& c) {
    LossDesc l = loss_desc(c, 1);
    const void* w = c.has_input(3) ? c.in(3).data : nullptr;
    softmax_cross_entropy_backward(l, elem(c.in(0).dtype), elem(c.in(1).dtype), elem(c.out(0).dtype), c.in(0).data, c.in(1).data,
                                   c.in(2).data, w, c.out(0).data, c.scratch_floats(loss_scratch_floats(l)), c.fault, c.stream);
  });
  r.add("oases", "NLLLossGrad", [](CudaContext& c) {
    LossDesc l = loss_desc(c, 1);
    const void* w = c.has_input(3) ? c.in(3).data : nullptr;
    nll_backward(l, elem(c.in(1).dtype), c.in(0).data, c.in(2).data, w, c.out(0).data, c.scratch_floats(loss_scratch_floats(l)), c.fault,
                 c.stream);
  });
}

}  // namespace oases::cuda
