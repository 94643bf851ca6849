// Finds the transformer structure of a canonical graph: embeddings, per-block attention (its
// q/k/v projections, fused or separate, and the output projection), MLP (up/gate and down
// projections around the activation), norms, and the LM head (tied to the embedding or not).
// Found structurally, never from node names, so it works for any exporter's naming.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace oases {

struct LinearInfo {
  NodeId matmul = kNoId;     // MatMul or Gemm
  ValueId weight = kNoId;    // the initializer (rank 2)
  bool transposed = false;   // weight stored [out, in] (Gemm transB, or a Transpose node before MatMul)
  NodeId transpose = kNoId;  // that Transpose node, if any
  ValueId bias = kNoId;      // initializer added after the product, if any
  NodeId bias_add = kNoId;
  int64_t in_features = 0, out_features = 0;
};

struct AttentionInfo {
  NodeId attention = kNoId;
  std::vector<LinearInfo> qkv;  // 1 (fused, e.g. GPT-2 c_attn) or 3 (q, k, v)
  LinearInfo out;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  // A fused projection laid out per head, [.., H, 3, D] (Bloom), rather than as [q | k | v] (GPT-2):
  // a plain column split then gives each rank whole heads.
  bool qkv_per_head = false;
  // ALiBi: the constant per-head slopes [H, 1] (or any shape with one dimension of H) the mask
  // input is made from, and that dimension; kNoId without ALiBi.
  ValueId alibi_slopes = kNoId;
  int alibi_heads_dim = -1;
};

struct MlpInfo {
  NodeId activation = kNoId;
  std::string kind;            // "gelu", "gelu_tanh", "swiglu", "relu", "silu", ...
  std::vector<LinearInfo> up;  // [up] or [gate, up] for SwiGLU
  LinearInfo down;
};

struct NormInfo {
  NodeId node = kNoId;
  std::string kind;  // "layernorm" | "rmsnorm"
  ValueId scale = kNoId, bias = kNoId;
  std::string feeds;  // "attn" or "mlp": the sub-layer whose projection reads it ("" after the blocks)
};

struct BlockInfo {
  int index = 0;
  AttentionInfo attn;
  bool has_attn = false;
  MlpInfo mlp;
  bool has_mlp = false;
  std::vector<NormInfo> norms;
};

struct EmbeddingInfo {
  NodeId gather = kNoId;
  ValueId weight = kNoId;
  int64_t rows = 0, dim = 0;
  std::string role;  // "token" | "position" | "other"
};

struct ModelStructure {
  std::vector<EmbeddingInfo> embeddings;
  std::vector<BlockInfo> blocks;
  std::vector<NormInfo> final_norms;  // norms after the last block
  bool has_head = false;
  LinearInfo head;
  bool tied_head = false;  // the head multiplies the token embedding's weight
  int64_t hidden = 0, vocab = 0;
};

// Never fails: a graph without transformer parts gives an empty structure.
ModelStructure find_transformer_structure(const Graph& g);

// Recognises a linear layer around a MatMul/Gemm node (weight = rank-2 float initializer, maybe via
// Transpose; bias = an initializer added right after). Returns false for activation×activation.
bool match_linear(const Graph& g, NodeId matmul, LinearInfo* out);

// The block index of a node scope the block finder wrote ("layer.3", "layer.3.attn" -> 3), or -1
// for scopes outside the blocks (embedding, head, loss).
int block_of_scope(const std::string& scope);

}  // namespace oases
