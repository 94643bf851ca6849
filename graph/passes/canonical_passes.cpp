#include "graph/passes/pass.h"

namespace oases {

Expected<std::vector<PassReport>> run_canonical_passes(Graph& g, const FoldOptions& fold) {
  std::vector<PassReport> reports;
  OASES_RETURN_IF_ERROR(check_supported(g));
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(make_retie_pass());
  passes.push_back(std::make_unique<InferShapesPass>(fold));
  passes.push_back(make_unfold_batch_copies_pass());  // reads the Concats' shapes and axes
  passes.push_back(std::make_unique<DeadCodePass>());
  passes.push_back(make_simplify_pass());
  passes.push_back(make_batch_gather_pass());
  passes.push_back(make_fuse_layernorm_pass());
  passes.push_back(make_fuse_rmsnorm_pass());
  passes.push_back(make_fuse_gelu_pass());
  passes.push_back(make_fuse_swiglu_pass());
  passes.push_back(make_fuse_attention_pass());
  passes.push_back(make_simplify_pass());
  passes.push_back(std::make_unique<InferShapesPass>(fold));
  passes.push_back(std::make_unique<DeadCodePass>());
  passes.push_back(make_find_blocks_pass());
  for (auto& p : passes) {
    auto r = p->run(g);
    if (!r) return r.status();
    reports.push_back(*r);
  }
  OASES_RETURN_IF_ERROR(g.validate());
  return reports;
}

}  // namespace oases
