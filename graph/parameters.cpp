#include "graph/parameters.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/op_registry.h"

namespace oases {

namespace {

bool is_view(const Node& n) {
  return op_has_trait(n, kTraitRelayout);
}

// A module path as PyTorch writes one: dotted identifiers ("h.0.attn.c_attn.weight"); the
// exporters' generated names ("val_110", "onnx::MatMul_7", "/model/Constant_output_0") are not.
bool is_module_path(const std::string& name) {
  static const std::regex kPath(R"(^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$)");
  return std::regex_match(name, kPath);
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The last path component names a buffer transformers registers (rotary frequencies and caches,
// masks, position/type ids, ALiBi slopes).
bool is_buffer_leaf(const std::string& name) {
  std::string leaf = lower(name.substr(name.rfind('.') + 1));
  static const std::set<std::string> kLeaves = {"inv_freq", "original_inv_freq", "position_ids",          "token_type_ids", "slopes",
                                                "alibi",    "freqs_cis",         "embed_positions_cache", "embed_scale"};
  return kLeaves.count(leaf) > 0 || leaf.find("mask") != std::string::npos || leaf.find("cached") != std::string::npos ||
         leaf.find("cache") != std::string::npos;
}

class Classifier {
 public:
  explicit Classifier(const Graph& g) : g_(g), static_(g.num_values(), -1) {}

  // Known without graph inputs: a constant, or computed only from constants and shapes.
  bool is_static(ValueId v) {
    if (v == kNoId) return true;
    int8_t& s = static_[static_cast<size_t>(v)];
    if (s >= 0) return s == 1;
    // iterative: walk producers depth-first, settle a value once its inputs are settled
    std::vector<ValueId> stack{v};
    while (!stack.empty()) {
      ValueId x = stack.back();
      int8_t& sx = static_[static_cast<size_t>(x)];
      if (sx >= 0) {
        stack.pop_back();
        continue;
      }
      const Value& val = g_.value(x);
      if (val.is_constant()) {
        sx = 1;
      } else if (val.is_input || val.producer == kNoId) {
        sx = 0;
      } else {
        const Node& n = g_.node(val.producer);
        if (op_has_trait(n, kTraitShapeOnly)) {
          sx = 1;
          stack.pop_back();
          continue;
        }
        bool pending = false, all = true;
        for (ValueId in : n.inputs) {
          if (in == kNoId) continue;
          int8_t si = static_[static_cast<size_t>(in)];
          if (si < 0) {
            stack.push_back(in);
            pending = true;
          } else if (si == 0) {
            all = false;
          }
        }
        if (pending) continue;
        sx = all ? 1 : 0;
      }
      stack.pop_back();
    }
    return s == 1;
  }

  // The value `v` is a view of, walking producers back through view ops.
  ValueId source(ValueId v) const {
    while (v != kNoId && g_.value(v).producer != kNoId) {
      const Node& n = g_.node(g_.value(v).producer);
      if (!is_view(n) || !n.has_input(0)) break;
      v = n.inputs[0];
    }
    return v;
  }

  // A token embedding: the output of a Gather whose indices are data.
  bool is_embedding_output(ValueId v) {
    v = source(v);
    if (v == kNoId || g_.value(v).producer == kNoId) return false;
    const Node& n = g_.node(g_.value(v).producer);
    return is_default_domain(n.domain) && n.op_type == "Gather" && !is_static(n.input(1));
  }

  // The reason a read of `init` (seen as value `seen` at input `slot` of node `n`) makes it a
  // weight, or "" if it does not.
  std::string weight_reason(const Node& n, int slot, ValueId seen) {
    const std::string& op = n.op_type;
    auto other_dynamic = [&] {
      for (int i = 0; i < n.num_inputs(); ++i) {
        if (i != slot && n.has_input(i) && !is_static(n.inputs[i])) return true;
      }
      return false;
    };
    if (op_has_trait(n, kTraitWeightProduct) && slot <= 1 && other_dynamic()) return fmt::format("weight of {}", n.describe());
    // Gemm's and Conv's input 2 is their bias
    if ((op == "Gemm" || op == "Conv") && slot == 2 && other_dynamic()) return fmt::format("bias of {}", n.describe());
    if (op == "Gather" && slot == 0 && !is_static(n.input(1))) return fmt::format("embedding table read by {}", n.describe());
    // ViT's class token, prepended to the patch embeddings along the sequence (a copy the exporter
    // made per batch row is one token again: graph/passes/unfold_batch_copies.cpp)
    if (op == "Concat" && n.attrs.get_int("axis", 0) != 0 && other_dynamic()) {
      return fmt::format("learned token concatenated with activations at {}", n.describe());
    }
    if (op_has_trait(n, kTraitNorm) && slot >= 1) return fmt::format("scale or bias of {}", n.describe());
    if ((op == "Mul" || op == "Add" || op == "Sub" || op == "Div") && n.num_inputs() == 2 && slot <= 1) {
      ValueId other = n.inputs[1 - slot];
      if (is_static(other)) return "";
      const Shape& mine = g_.value(seen).shape;
      const Shape& theirs = g_.value(other).shape;
      // per channel: [C] or [1, .., C] against an activation [.., C]
      bool per_channel = !mine.empty() && mine.back() > 1 && theirs.size() >= 2 && theirs.back() == mine.back();
      for (size_t i = 0; i + 1 < mine.size(); ++i) per_channel = per_channel && mine[i] == 1;
      if (per_channel && !(op == "Div" && slot == 0) && !(op == "Sub" && slot == 0)) {
        return fmt::format("per-channel {} of an activation at {}", op == "Mul" || op == "Div" ? "scale" : "shift", n.describe());
      }
      if (op == "Add" && is_embedding_output(other)) return fmt::format("table added to a token embedding at {}", n.describe());
    }
    return "";
  }

  InitializerRole classify(ValueId v) {
    InitializerRole r;
    r.value = v;
    const Value& val = g_.value(v);
    if (is_module_path(val.name)) {
      if (is_buffer_leaf(val.name)) {
        r.reason = "named like a buffer";
        return r;
      }
      r.trainable = true;
      r.reason = "named like a module parameter";
      return r;
    }
    // reads of v itself or of views of it
    std::vector<std::string> readers;
    std::vector<ValueId> frontier{v};
    std::set<ValueId> seen_values{v};
    while (!frontier.empty()) {
      ValueId x = frontier.back();
      frontier.pop_back();
      for (const Use& u : g_.uses(x)) {
        const Node& n = g_.node(u.node);
        if (is_view(n) && u.slot == 0) {
          for (ValueId o : n.outputs) {
            if (o != kNoId && seen_values.insert(o).second) frontier.push_back(o);
          }
          continue;
        }
        std::string why = weight_reason(n, u.slot, x);
        if (!why.empty()) {
          r.trainable = true;
          r.reason = why;
          return r;
        }
        if (std::find(readers.begin(), readers.end(), n.op_type) == readers.end()) readers.push_back(n.op_type);
      }
    }
    if (val.numel() <= 1) {
      r.reason = "a scalar constant";
    } else if (readers.empty()) {
      r.reason = "read by no node";
    } else {
      r.reason = fmt::format("a constant table read by {} (not as a weight, embedding, norm scale or bias: positions, masks, fill values)",
                             fmt::join(readers, ", "));
    }
    return r;
  }

 private:
  const Graph& g_;
  std::vector<int8_t> static_;  // -1 unknown, 0 depends on a graph input, 1 static
};

}  // namespace

std::vector<InitializerRole> classify_initializers(const Graph& g) {
  Classifier c(g);
  std::vector<InitializerRole> roles;
  for (ValueId v : g.initializers()) {
    if (!is_floating(g.value(v).dtype)) continue;
    roles.push_back(c.classify(v));
  }
  return roles;
}

Status apply_parameter_overrides(const Graph& g, std::vector<InitializerRole>& roles, const std::string& train_regex,
                                 const std::string& freeze_regex) {
  auto compile = [](const std::string& flag, const std::string& re) -> Expected<std::regex> {
    try {
      return std::regex(re, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return error("{} '{}' is not a valid regular expression: {}", flag, re, e.what());
    }
  };
  if (!train_regex.empty()) {
    OASES_ASSIGN_OR_RETURN(std::regex re, compile("--train", train_regex));
    for (InitializerRole& r : roles) {
      if (!r.trainable && std::regex_search(g.value(r.value).name, re)) {
        r.trainable = true;
        r.reason = fmt::format("--train '{}'", train_regex);
      }
    }
  }
  if (!freeze_regex.empty()) {
    OASES_ASSIGN_OR_RETURN(std::regex re, compile("--freeze", freeze_regex));
    for (InitializerRole& r : roles) {
      if (std::regex_search(g.value(r.value).name, re)) {
        r.trainable = false;
        r.reason = fmt::format("--freeze '{}'", freeze_regex);
      }
    }
  }
  return Status::ok();
}

std::vector<std::string> describe_parameter_split(const Graph& g, const std::vector<InitializerRole>& roles) {
  int64_t np = 0, nb = 0, ep = 0, eb = 0;
  for (const InitializerRole& r : roles) {
    (r.trainable ? np : nb) += 1;
    (r.trainable ? ep : eb) += g.value(r.value).numel();
  }
  std::vector<std::string> lines;
  lines.push_back(
      fmt::format("{} parameter{} ({} elements), {} buffer{} ({} elements)", np, np == 1 ? "" : "s", ep, nb, nb == 1 ? "" : "s", eb));
  for (const InitializerRole& r : roles) {
    if (!r.trainable) lines.push_back(fmt::format("  buffer {}: {}", describe_value(g, r.value), r.reason));
  }
  return lines;
}

}  // namespace oases
