// The cuDNN attention path's host-side rules (kernels/cuda/attention_rules.h), which need no GPU:
// which calls it refuses and why, where its causal diagonal sits, how the additive mask becomes
// cuDNN's bias, and the key its execution plans are cached under; and the --verbose notes that say
// which attention path ran (executor/notes.h). The numbers themselves are checked on a GPU
// (tests/gpu/cuda_kernels_test.cpp, CudnnAttentionOnGpu).
#include <gtest/gtest.h>

#include <unordered_set>

#include "executor/notes.h"
#include "kernels/cuda/attention_rules.h"

namespace oases::cuda {
namespace {

AttentionDesc desc(int64_t b, int64_t h, int64_t hkv, int64_t tq, int64_t tk, int64_t d, bool causal = false) {
  AttentionDesc a;
  a.batch = b;
  a.heads = h;
  a.kv_heads = hkv;
  a.tq = tq;
  a.tk = tk;
  a.d = a.dv = d;
  a.causal = causal;
  a.scale = 0.125f;
  return a;
}

// An fp32 mask of shape `shape` (a broadcast of [B, H, Tq, Tk]) with the strides the glue gives:
// contiguous over its own shape, 0 where it has extent 1.
void set_mask(AttentionDesc& a, std::vector<int64_t> shape, const void* data) {
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    a.mask_strides[i] = shape[static_cast<size_t>(i)] == 1 ? 0 : stride;
    stride *= shape[static_cast<size_t>(i)];
  }
  a.mask = data;
}

const float kMaskData[1] = {0.f};  // only its address is read here

TEST(CudnnAttentionRules, TakesFloat16AndBfloat16Only) {
  AttentionDesc a = desc(2, 4, 4, 128, 128, 64);
  EXPECT_EQ(cudnn_attention_refusal(a, Elem::kF16), "");
  EXPECT_EQ(cudnn_attention_refusal(a, Elem::kBF16), "");
  std::string why = cudnn_attention_refusal(a, Elem::kF32);
  EXPECT_NE(why.find("not float32"), std::string::npos) << why;
  EXPECT_NE(cudnn_attention_refusal(a, Elem::kF64), "");
}

TEST(CudnnAttentionRules, HeadSizesMultiplesOf8UpTo256AndWholeGroups) {
  for (int64_t d : {8, 64, 128, 256}) EXPECT_EQ(cudnn_attention_refusal(desc(1, 2, 2, 16, 16, d), Elem::kBF16), "") << d;
  std::string why = cudnn_attention_refusal(desc(1, 2, 2, 16, 16, 40 + 2), Elem::kBF16);
  EXPECT_NE(why.find("head size 42"), std::string::npos) << why;
  EXPECT_NE(cudnn_attention_refusal(desc(1, 2, 2, 16, 16, 264), Elem::kBF16), "");
  AttentionDesc dv = desc(1, 2, 2, 16, 16, 64);
  dv.dv = 36;
  EXPECT_NE(cudnn_attention_refusal(dv, Elem::kBF16).find("64/36"), std::string::npos);
  // grouped-query heads: cuDNN reads the shared key/value heads and sums their gradients
  EXPECT_EQ(cudnn_attention_refusal(desc(2, 8, 2, 64, 64, 64), Elem::kF16), "");
  EXPECT_EQ(cudnn_attention_refusal(desc(2, 8, 1, 64, 64, 64), Elem::kF16), "");
  EXPECT_NE(cudnn_attention_refusal(desc(2, 6, 4, 64, 64, 64), Elem::kF16).find("not a multiple"), std::string::npos);
  EXPECT_NE(cudnn_attention_refusal(desc(2, 4, 4, 1, 1, 64), Elem::kF16), "");  // cuDNN's backward refuses Tq = Tk = 1
  EXPECT_EQ(cudnn_attention_refusal(desc(2, 4, 4, 1, 64, 64), Elem::kF16), "");
}

// Strided tensors (oases.device.Attention): cuDNN moves 16-byte vectors, so every batch, head and
// time stride must be a whole number of 16 bytes.
TEST(CudnnAttentionRules, StridesInWhole16ByteUnits) {
  AttentionDesc a = desc(2, 4, 2, 64, 64, 64);
  a.strided = true;
  a.st = contiguous_attention_strides(a);
  const int64_t W = (4 + 2 * 2) * 64;  // a fused qkv [B, T, W]
  for (int64_t* st : {a.st.q, a.st.dq}) {
    st[0] = 64 * W;
    st[1] = 64;
    st[2] = W;
  }
  EXPECT_EQ(cudnn_attention_refusal(a, Elem::kBF16), "");
  a.st.o[2] = 4 * 64 + 4;  // 8 bytes over a whole row of 16-byte units
  EXPECT_NE(cudnn_attention_refusal(a, Elem::kBF16).find("16-byte units"), std::string::npos) << cudnn_attention_refusal(a, Elem::kBF16);
  a.strided = false;  // the same strides unused: contiguous
  EXPECT_EQ(cudnn_attention_refusal(a, Elem::kBF16), "");
}

TEST(CudnnAttentionRules, CausalDiagonalFollowsOurConvention) {
  // ours: key j > query i + (Tk - Tq) is masked
  EXPECT_EQ(cudnn_causal(desc(1, 1, 1, 64, 64, 64)), CudnnCausal::kNone);
  EXPECT_EQ(cudnn_causal(desc(1, 1, 1, 64, 64, 64, true)), CudnnCausal::kTopLeft);      // Tk - Tq = 0: j > i
  EXPECT_EQ(cudnn_causal(desc(1, 1, 1, 32, 96, 64, true)), CudnnCausal::kBottomRight);  // j > i + 64
  EXPECT_EQ(cudnn_attention_refusal(desc(1, 1, 1, 32, 96, 64, true), Elem::kBF16), "");
  // more queries than keys: the first Tq - Tk rows see nothing (out 0, lse +inf), cuDNN refuses
  std::string why = cudnn_attention_refusal(desc(1, 1, 1, 96, 32, 64, true), Elem::kBF16);
  EXPECT_NE(why.find("more queries (96) than keys (32)"), std::string::npos) << why;
  EXPECT_EQ(cudnn_attention_refusal(desc(1, 1, 1, 96, 32, 64, false), Elem::kBF16), "");
}

TEST(CudnnAttentionRules, MasksCuDnnTakesAndOnesItDoesNot) {
  AttentionDesc a = desc(2, 4, 2, 64, 64, 64, true);
  set_mask(a, {1, 1, 64, 64}, kMaskData);
  EXPECT_EQ(cudnn_attention_refusal(a, Elem::kBF16), "");  // causal from the top-left with a bias
  a.mask_is_bool = true;
  EXPECT_NE(cudnn_attention_refusal(a, Elem::kBF16).find("bool mask"), std::string::npos);
  // the bottom-right diagonal does not combine with a bias
  AttentionDesc b = desc(2, 4, 2, 32, 64, 64, true);
  set_mask(b, {1, 1, 32, 64}, kMaskData);
  EXPECT_NE(cudnn_attention_refusal(b, Elem::kBF16).find("bottom-right"), std::string::npos);
  b.causal = false;
  EXPECT_EQ(cudnn_attention_refusal(b, Elem::kBF16), "");
}

TEST(CudnnBiasLayouts, MaskBroadcastOverBatchAndHeadsIsReadInPlace) {
  struct Case {
    std::vector<int64_t> shape, dims, strides;
  };
  const int64_t B = 2, H = 4, Tq = 48, Tk = 64;
  for (const Case& c :
       {Case{{1, 1, Tq, Tk}, {1, 1, Tq, Tk}, {Tq * Tk, Tq * Tk, Tk, 1}}, Case{{B, 1, Tq, Tk}, {B, 1, Tq, Tk}, {Tq * Tk, Tq * Tk, Tk, 1}},
        Case{{1, H, Tq, Tk}, {1, H, Tq, Tk}, {H * Tq * Tk, Tq * Tk, Tk, 1}},
        Case{{B, H, Tq, Tk}, {B, H, Tq, Tk}, {H * Tq * Tk, Tq * Tk, Tk, 1}}}) {
    AttentionDesc a = desc(B, H, 2, Tq, Tk, 64);
    set_mask(a, c.shape, kMaskData);
    std::vector<CudnnBiasLayout> ls = cudnn_bias_layouts(a, Elem::kBF16);
    ASSERT_EQ(ls.size(), 2u);
    EXPECT_EQ(ls[0].kind, CudnnBias::kFp32);
    EXPECT_EQ(std::vector<int64_t>(ls[0].dims, ls[0].dims + 4), c.dims);
    EXPECT_EQ(std::vector<int64_t>(ls[0].strides, ls[0].strides + 4), c.strides);
    EXPECT_EQ(ls[0].bytes, 0u);
    // the converted copy, should cuDNN refuse an fp32 bias: the same dims, dense, in bf16
    EXPECT_EQ(ls[1].kind, CudnnBias::kConverted);
    EXPECT_EQ(std::vector<int64_t>(ls[1].dims, ls[1].dims + 4), c.dims);
    EXPECT_EQ(ls[1].strides[2], Tk);
    EXPECT_EQ(ls[1].bytes, static_cast<size_t>(c.dims[0] * c.dims[1] * Tq * Tk * 2));
  }
  AttentionDesc none = desc(B, H, 2, Tq, Tk, 64);
  EXPECT_TRUE(cudnn_bias_layouts(none, Elem::kBF16).empty());
}

TEST(CudnnBiasLayouts, KeyPaddingMasksAndOddRowsAreConverted) {
  // [B, 1, 1, Tk]: cuDNN's bias does not broadcast over queries, so the copy spells it out
  AttentionDesc a = desc(3, 4, 4, 20, 64, 64);
  set_mask(a, {3, 1, 1, 64}, kMaskData);
  std::vector<CudnnBiasLayout> ls = cudnn_bias_layouts(a, Elem::kF16);
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].kind, CudnnBias::kConverted);
  EXPECT_EQ(std::vector<int64_t>(ls[0].dims, ls[0].dims + 4), (std::vector<int64_t>{3, 1, 20, 64}));
  EXPECT_EQ(std::vector<int64_t>(ls[0].strides, ls[0].strides + 4), (std::vector<int64_t>{20 * 64, 20 * 64, 64, 1}));
  EXPECT_EQ(cudnn_attention_refusal(a, Elem::kF16), "");
  // 37 keys: fp32 rows of 148 bytes are not 16-byte multiples; the 16-bit copy pads rows to 40
  AttentionDesc b = desc(1, 2, 2, 37, 37, 64);
  set_mask(b, {1, 1, 37, 37}, kMaskData);
  ls = cudnn_bias_layouts(b, Elem::kBF16);
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].kind, CudnnBias::kConverted);
  EXPECT_EQ(std::vector<int64_t>(ls[0].strides, ls[0].strides + 4), (std::vector<int64_t>{37 * 40, 37 * 40, 40, 1}));
  EXPECT_EQ(ls[0].bytes, static_cast<size_t>(37 * 40 * 2));
  // a transposed mask (keys not contiguous) is converted too
  AttentionDesc c = desc(1, 2, 2, 64, 64, 64);
  c.mask = kMaskData;
  c.mask_strides[2] = 1;
  c.mask_strides[3] = 64;
  ls = cudnn_bias_layouts(c, Elem::kBF16);
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].kind, CudnnBias::kConverted);
}

TEST(CudnnBiasLayouts, ACopyOverTheBudgetIsNotMade) {
  // a per-head key mask broadcast over 8192 queries would need 8 GiB converted: refused
  AttentionDesc a = desc(8, 32, 8, 8192, 8192, 128);
  set_mask(a, {8, 32, 1, 8192}, kMaskData);
  EXPECT_TRUE(cudnn_bias_layouts(a, Elem::kBF16).empty());
  EXPECT_NE(cudnn_attention_refusal(a, Elem::kBF16).find("1 GiB"), std::string::npos);
  // read in place it needs no copy, so only the converted fallback is dropped
  AttentionDesc b = desc(8, 32, 8, 8192, 8192, 128);
  set_mask(b, {8, 32, 8192, 8192}, kMaskData);
  std::vector<CudnnBiasLayout> ls = cudnn_bias_layouts(b, Elem::kBF16);
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0].kind, CudnnBias::kFp32);
  EXPECT_EQ(cudnn_attention_refusal(b, Elem::kBF16), "");
}

TEST(CudnnPlanKey, EveryFieldThatChangesTheGraphChangesTheKey) {
  AttentionDesc a = desc(2, 8, 2, 64, 96, 64);
  set_mask(a, {1, 1, 64, 96}, kMaskData);
  CudnnBiasLayout bias = cudnn_bias_layouts(a, Elem::kBF16)[0];
  const CudnnPlanKey base = cudnn_plan_key(a, Elem::kBF16, false, true, bias, 0);

  // equal calls, equal keys: the data pointers are not part of it
  AttentionDesc same = a;
  const float other_mask[1] = {1.f};
  same.mask = other_mask;
  EXPECT_EQ(cudnn_plan_key(same, Elem::kBF16, false, true, bias, 0), base);
  EXPECT_EQ(CudnnPlanKeyHash{}(cudnn_plan_key(same, Elem::kBF16, false, true, bias, 0)), CudnnPlanKeyHash{}(base));

  std::vector<CudnnPlanKey> changed;
  auto with = [&](auto edit) {
    AttentionDesc x = a;
    Elem t = Elem::kBF16;
    bool backward = false, stats = true;
    CudnnBiasLayout l = bias;
    int device = 0;
    edit(x, t, backward, stats, l, device);
    changed.push_back(cudnn_plan_key(x, t, backward, stats, l, device));
  };
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.batch = 3; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.heads = 4; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.kv_heads = 8; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.tq = 65; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.tk = 97; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.d = 128; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.dv = 128; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.causal = true; });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) { x.scale = 0.126f; });
  with([](AttentionDesc&, Elem& t, bool&, bool&, CudnnBiasLayout&, int&) { t = Elem::kF16; });
  with([](AttentionDesc&, Elem&, bool& backward, bool&, CudnnBiasLayout&, int&) { backward = true; });
  with([](AttentionDesc&, Elem&, bool&, bool& stats, CudnnBiasLayout&, int&) { stats = false; });
  with([](AttentionDesc&, Elem&, bool&, bool&, CudnnBiasLayout& l, int&) { l = CudnnBiasLayout{}; });
  with([](AttentionDesc&, Elem&, bool&, bool&, CudnnBiasLayout& l, int&) { l.kind = CudnnBias::kConverted; });
  with([](AttentionDesc&, Elem&, bool&, bool&, CudnnBiasLayout& l, int&) { l.dims[0] = 2; });       // a per-batch mask
  with([](AttentionDesc&, Elem&, bool&, bool&, CudnnBiasLayout& l, int&) { l.strides[2] = 100; });  // another row stride
  with([](AttentionDesc&, Elem&, bool&, bool&, CudnnBiasLayout&, int& device) { device = 1; });
  // strided tensors (a device program's fused qkv: q's time stride is the projection's width)
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) {
    x.strided = true;
    x.st = contiguous_attention_strides(x);
    x.st.q[2] = 3 * x.heads * x.d;
  });
  with([](AttentionDesc& x, Elem&, bool&, bool&, CudnnBiasLayout&, int&) {
    x.strided = true;
    x.st = contiguous_attention_strides(x);
    x.st.dv[1] = x.dv;  // dV written [B, T, Hkv, Dv]
    x.st.dv[2] = x.kv_heads * x.dv;
  });
  std::unordered_set<CudnnPlanKey, CudnnPlanKeyHash> all{base};
  for (const CudnnPlanKey& k : changed) {
    EXPECT_NE(k, base) << k.to_string();
    all.insert(k);
  }
  EXPECT_EQ(all.size(), changed.size() + 1);  // pairwise distinct
  // the scale's bits: -0 and +0, or two floats that print alike, are different graphs
  AttentionDesc z = a, nz = a;
  z.scale = 0.f;
  nz.scale = -0.f;
  EXPECT_NE(cudnn_plan_key(z, Elem::kBF16, false, true, bias, 0), cudnn_plan_key(nz, Elem::kBF16, false, true, bias, 0));
  // strides spelled out as the contiguous ones are the contiguous call's graph
  AttentionDesc spelled = a;
  spelled.strided = true;
  spelled.st = contiguous_attention_strides(a);
  EXPECT_EQ(cudnn_plan_key(spelled, Elem::kBF16, false, true, bias, 0), base);
  // a backward key always reads the statistics
  EXPECT_EQ(cudnn_plan_key(a, Elem::kBF16, true, false, bias, 0), cudnn_plan_key(a, Elem::kBF16, true, true, bias, 0));

  std::string s = cudnn_plan_key(desc(2, 8, 2, 32, 96, 64, true), Elem::kBF16, false, true, CudnnBiasLayout{}, 0).to_string();
  EXPECT_NE(s.find("bfloat16 forward+lse b2 h8/2 q32 k96 d64/64 causal(bottom-right)"), std::string::npos) << s;
  EXPECT_NE(base.to_string().find("bias fp32 [1,1,64,96]"), std::string::npos) << base.to_string();
}

TEST(VerboseNotes, EachNoteOnceAndOnlyWhenVerbose) {
  set_verbose_notes(false);
  EXPECT_FALSE(note_once("attention forward: test path (cuDNN not taken: reason A)"));  // off: not printed, not remembered
  set_verbose_notes(true);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(note_once("attention forward: test path (cuDNN not taken: reason A)"));
  EXPECT_FALSE(note_once("attention forward: test path (cuDNN not taken: reason A)"));
  EXPECT_TRUE(note_once("attention forward: test path (cuDNN not taken: reason B)"));
  std::string err = ::testing::internal::GetCapturedStderr();
  set_verbose_notes(false);
  EXPECT_EQ(err,
            "note: attention forward: test path (cuDNN not taken: reason A)\n"
            "note: attention forward: test path (cuDNN not taken: reason B)\n");
}

}  // namespace
}  // namespace oases::cuda
