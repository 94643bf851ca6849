// One interface for every pass: run(graph) -> report, where the report says whether anything
// changed and, in a line for people, what the pass found ("fused 12 LayerNorm (ReduceMean/Sub/
// Pow/Sqrt/Div)"). A rewrite that finds nothing returns an unchanged report, never an error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/evaluator.h"
#include "graph/graph.h"

namespace oases {

struct PassReport {
  std::string pass;
  bool changed = false;
  int count = 0;      // rewrites made (nodes folded, patterns fused, ...)
  std::string found = {};  // one line for `oases-import --verbose`
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  virtual Expected<PassReport> run(Graph& g) = 0;
};

// Every node's op is registered and its input/output counts fit the schema; otherwise one
// error listing every offending node ("unsupported: [com.microsoft.Foo] node 'a', ...").
Status check_supported(const Graph& g);

struct FoldOptions {
  const Evaluator* evaluator = nullptr;     // nullptr: fold Shape/Size/Constant only
  int64_t max_elements = int64_t{1} << 22;  // larger results stay computed at run time
};

// Normalises each node to canonical form, infers every output's dtype and shape in topological
// order, and folds nodes whose inputs are all constant (never through a floating initializer, so
// parameters keep their names and stay trainable; single-element float initializers, which the
// dynamo exporter writes for every scalar constant, do fold).
class InferShapesPass : public Pass {
 public:
  explicit InferShapesPass(FoldOptions opts = {}) : opts_(opts) {}
  std::string name() const override { return "infer-shapes-and-fold"; }
  Expected<PassReport> run(Graph& g) override;

 private:
  FoldOptions opts_;
};

// Removes nodes whose outputs reach no graph output, and initializers nothing reads.
class DeadCodePass : public Pass {
 public:
  std::string name() const override { return "dead-code-elimination"; }
  Expected<PassReport> run(Graph& g) override;
};

// Removes no-op nodes (identity casts, inference Dropout, same-shape Reshape) and merges Transposes.
std::unique_ptr<Pass> make_simplify_pass();
// Gather(Flatten(x [B, T]), b·T + j) -> per-row Gather(x, j, axis 1) (graph/passes/batch_gather.cpp).
std::unique_ptr<Pass> make_batch_gather_pass();
// An exporter-named initializer equal to the transpose of a named one (a tied head the exporter
// folded) -> Transpose(the named one) (graph/passes/retie.cpp).
std::unique_ptr<Pass> make_retie_pass();
// An initializer of B equal slices read by Concats beside activations of batch B (a learned token
// the exporter copied across a static batch) -> Expand(one slice) (graph/passes/unfold_batch_copies.cpp).
std::unique_ptr<Pass> make_unfold_batch_copies_pass();
// The canonicalising fusions (graph/passes/fuse_*.cpp).
std::unique_ptr<Pass> make_fuse_layernorm_pass();
std::unique_ptr<Pass> make_fuse_rmsnorm_pass();
std::unique_ptr<Pass> make_fuse_gelu_pass();
std::unique_ptr<Pass> make_fuse_swiglu_pass();
std::unique_ptr<Pass> make_fuse_attention_pass();
// Mean-reduced cross-entropy -> sum / count of kept labels (splits over data-parallel ranks).
std::unique_ptr<Pass> make_loss_sum_over_count_pass();
// Tags nodes with the transformer block they belong to (Node::scope), see graph/blocks.h.
std::unique_ptr<Pass> make_find_blocks_pass();

// The standard import passes, in order (graph/passes/canonical_passes.cpp): check, infer+fold,
// DCE, fusions, infer+fold, DCE, blocks. ("pipeline" in this project means pipeline stages.)
Expected<std::vector<PassReport>> run_canonical_passes(Graph& g, const FoldOptions& fold);

}  // namespace oases
