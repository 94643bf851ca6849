// Ops with a CPU kernel and no CUDA kernel, with the reason. The unit test "CudaCoverage" checks
// (in a build with the CUDA backend) that every CPU op is either here or has a CUDA kernel, and
// (in every build) that the training graphs of the committed models use none of these ops.
#include "executor/device.h"

namespace oases {

const std::map<std::string, std::string>& cuda_exempt_ops() {
  static const std::map<std::string, std::string> m = {
      {"Shape", "folded into a constant by shape inference before execution"},
      {"Size", "folded into a constant by shape inference before execution"},
      {"Constant", "folded into a constant by shape inference before execution"},
      {"Range", "computed from constants and folded before execution in the supported models"},
      {"EyeLike", "not used by transformer training graphs"},
      {"OneHot", "not used by transformer training graphs (losses take class indices)"},
      {"Trilu", "causal masks are folded into constants or expressed as Attention(causal=1)"},
      {"TopK", "inference-only op"},
      {"ArgMax", "inference-only op"},
      {"ArgMin", "inference-only op"},
      {"Einsum", "no canonical training graph keeps one (attention is fused; matmuls are MatMul)"},
      // ViT's patch embedding: one small product per step on CPU so far; a CUDA version (cuDNN or
      // im2col + cuBLAS) is to come
      {"Conv", "no CUDA kernel yet (vision patch embeddings run on the CPU backend)"},
      {"oases.ConvGradInput", "no CUDA kernel yet (Conv's backward, CPU backend only)"},
      {"oases.ConvGradWeight", "no CUDA kernel yet (Conv's backward, CPU backend only)"},
      // executor-level CPU fusion (graph/passes/fusion.h): compile_program makes these only for
      // --device cpu; a CUDA program runs the canonical graph's MatMul, Add, Gelu, Attention, ...
      {"oases.cpu.FusedMatMul", "CPU executor fusion only; never made for a CUDA program"},
      {"oases.cpu.Attention", "CPU executor fusion only; never made for a CUDA program"},
      {"oases.cpu.AddGatherGrad", "CPU executor fusion only; never made for a CUDA program"},
      {"oases.FlatReduceScatter", "the distributed optimizer's gradient pieces (--zero 1): CPU ranks only so far, refused with --device cuda"},
  };
  return m;
}

}  // namespace oases
