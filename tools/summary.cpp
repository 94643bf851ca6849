#include "tools/summary.h"

#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "graph/blocks.h"
#include "graph/op_registry.h"

namespace oases {

namespace {

std::string op_key(const Node& n) {
  return is_default_domain(n.domain) ? n.op_type : n.domain + "." + n.op_type;
}

nlohmann::json value_json(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  nlohmann::json j{{"name", val.name}, {"dtype", dtype_name(val.dtype)}, {"shape", val.shape}};
  bool any_sym = false;
  for (const auto& d : val.dim_names) any_sym |= !d.empty();
  if (any_sym) j["dim_names"] = val.dim_names;
  return j;
}

nlohmann::json linear_json(const Graph& g, const LinearInfo& l) {
  if (l.matmul == kNoId) return nullptr;
  nlohmann::json j{{"node", g.node(l.matmul).name},
                   {"weight", g.value(l.weight).name},
                   {"in", l.in_features},
                   {"out", l.out_features},
                   {"transposed", l.transposed}};
  if (l.bias != kNoId) j["bias"] = g.value(l.bias).name;
  return j;
}

std::string human(double x, const char* unit) {
  const char* pre[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (x >= 1000 && i < 5) {
    x /= 1000;
    ++i;
  }
  return fmt::format("{:.3g} {}{}", x, pre[i], unit);
}

}  // namespace

nlohmann::json model_summary_json(const LoadedModel& m, const std::string& path) {
  const Graph& raw = m.raw;
  const Graph& g = m.graph;
  nlohmann::json s;
  s["model"] = path;
  s["producer"] = {{"name", raw.producer_name}, {"version", raw.producer_version}};
  s["ir_version"] = raw.ir_version;
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [d, v] : raw.opset_imports) ops[d.empty() ? "ai.onnx" : d] = v;
  s["opsets"] = ops;
  for (ValueId v : g.inputs()) s["inputs"].push_back(value_json(g, v));
  for (ValueId v : g.outputs()) s["outputs"].push_back(value_json(g, v));
  std::map<std::string, int> hist_raw, hist;
  for (NodeId id : raw.nodes()) hist_raw[op_key(raw.node(id))]++;
  for (NodeId id : g.nodes()) hist[op_key(g.node(id))]++;
  s["ops_as_exported"] = hist_raw;
  s["ops_canonical"] = hist;
  s["nodes_as_exported"] = raw.num_nodes();
  s["nodes_canonical"] = g.num_nodes();
  int64_t params = 0, param_bytes = 0, n_init = 0;
  for (ValueId v : g.initializers()) {
    const Value& val = g.value(v);
    ++n_init;
    if (is_floating(val.dtype)) {
      params += val.numel();
      param_bytes += static_cast<int64_t>(val.nbytes());
    }
  }
  s["parameters"] = {{"count", params}, {"bytes", param_bytes}, {"initializers", n_init}};
  double flops = 0, bytes = 0;
  const OpRegistry& reg = OpRegistry::global();
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    const OpSchema* sc = reg.find(n.domain, n.op_type);
    if (sc && sc->cost) {
      OpCost c = sc->cost(g, n);
      flops += c.flops;
      bytes += c.bytes;
    }
  }
  s["forward_flops"] = flops;
  s["forward_bytes"] = bytes;

  ModelStructure ms = find_transformer_structure(g);
  nlohmann::json tr;
  tr["hidden"] = ms.hidden;
  tr["vocab"] = ms.vocab;
  for (const auto& e : ms.embeddings) {
    tr["embeddings"].push_back(
        {{"node", g.node(e.gather).name}, {"weight", g.value(e.weight).name}, {"rows", e.rows}, {"dim", e.dim}, {"role", e.role}});
  }
  for (const BlockInfo& b : ms.blocks) {
    nlohmann::json bj{{"index", b.index}};
    if (b.has_attn) {
      nlohmann::json aj{{"node", g.node(b.attn.attention).name},
                        {"heads", b.attn.heads},
                        {"kv_heads", b.attn.kv_heads},
                        {"head_dim", b.attn.head_dim},
                        {"causal", b.attn.causal}};
      for (const auto& l : b.attn.qkv) aj["qkv"].push_back(linear_json(g, l));
      aj["qkv_fused"] = b.attn.qkv.size() == 1;
      aj["out"] = linear_json(g, b.attn.out);
      bj["attention"] = aj;
    }
    if (b.has_mlp) {
      nlohmann::json mj{{"activation", b.mlp.kind}, {"node", g.node(b.mlp.activation).name}};
      for (const auto& l : b.mlp.up) mj["up"].push_back(linear_json(g, l));
      mj["down"] = linear_json(g, b.mlp.down);
      bj["mlp"] = mj;
    }
    for (const auto& nrm : b.norms) {
      nlohmann::json nj{{"kind", nrm.kind}, {"node", g.node(nrm.node).name}, {"scale", g.value(nrm.scale).name}};
      if (nrm.bias != kNoId) nj["bias"] = g.value(nrm.bias).name;
      bj["norms"].push_back(nj);
    }
    tr["blocks"].push_back(bj);
  }
  if (tr.find("blocks") == tr.end()) tr["blocks"] = nlohmann::json::array();
  for (const auto& nrm : ms.final_norms) tr["final_norms"].push_back({{"kind", nrm.kind}, {"node", g.node(nrm.node).name}});
  if (ms.has_head) {
    tr["head"] = linear_json(g, ms.head);
    tr["tied_head"] = ms.tied_head;
  }
  s["transformer"] = tr;
  for (const auto& r : m.reports) s["passes"].push_back({{"pass", r.pass}, {"changed", r.changed}, {"count", r.count}, {"found", r.found}});
  s["unsupported_nodes"] = nlohmann::json::array();
  return s;
}

std::string model_summary_text(const nlohmann::json& s, bool verbose) {
  std::ostringstream o;
  o << fmt::format("model      {}\n", s["model"].get<std::string>());
  o << fmt::format("producer   {} {}\n", s["producer"]["name"].get<std::string>(), s["producer"]["version"].get<std::string>());
  std::vector<std::string> ops;
  for (auto& [k, v] : s["opsets"].items()) ops.push_back(fmt::format("{} {}", k, v.get<int64_t>()));
  o << fmt::format("IR         {}; opsets: {}\n", s["ir_version"].get<int64_t>(), fmt::join(ops, ", "));
  auto vals = [&](const char* key, const char* label) {
    if (!s.contains(key)) return;
    for (auto& v : s[key]) {
      std::vector<std::string> dims;
      for (size_t i = 0; i < v["shape"].size(); ++i) {
        std::string d = std::to_string(v["shape"][i].get<int64_t>());
        if (v.contains("dim_names") && !v["dim_names"][i].get<std::string>().empty()) d = v["dim_names"][i].get<std::string>() + "=" + d;
        dims.push_back(d);
      }
      o << fmt::format("{:<10} {}: {}[{}]\n", label, v["name"].get<std::string>(), v["dtype"].get<std::string>(), fmt::join(dims, ", "));
    }
  };
  vals("inputs", "input");
  vals("outputs", "output");
  const auto& p = s["parameters"];
  o << fmt::format("parameters {} ({}) in {} initializers\n", human(p["count"].get<double>(), ""), human(p["bytes"].get<double>(), "B"),
                   p["initializers"].get<int64_t>());
  o << fmt::format("forward    {} FLOPs, {} moved at these shapes\n", human(s["forward_flops"].get<double>(), ""),
                   human(s["forward_bytes"].get<double>(), "B"));
  o << fmt::format("nodes      {} as exported, {} canonical\n", s["nodes_as_exported"].get<int64_t>(), s["nodes_canonical"].get<int64_t>());
  std::vector<std::pair<int, std::string>> hist;
  for (auto& [k, v] : s["ops_canonical"].items()) hist.push_back({v.get<int>(), k});
  std::sort(hist.rbegin(), hist.rend());
  std::vector<std::string> hs;
  for (auto& [c, k] : hist) hs.push_back(fmt::format("{} {}", k, c));
  o << fmt::format("ops        {}\n", fmt::join(hs, ", "));
  const auto& t = s["transformer"];
  o << fmt::format("blocks     {} (hidden {}, vocabulary {})\n", t["blocks"].size(), t["hidden"].get<int64_t>(), t["vocab"].get<int64_t>());
  if (t.contains("embeddings")) {
    for (auto& e : t["embeddings"]) {
      o << fmt::format("  embedding ({}) {} [{} x {}]\n", e["role"].get<std::string>(), e["weight"].get<std::string>(),
                       e["rows"].get<int64_t>(), e["dim"].get<int64_t>());
    }
  }
  for (auto& b : t["blocks"]) {
    std::string line = fmt::format("  block {:>3}:", b["index"].get<int>());
    if (b.contains("attention")) {
      const auto& a = b["attention"];
      line += fmt::format(" attention {} heads x {}{}{}, qkv {}", a["heads"].get<int64_t>(), a["head_dim"].get<int64_t>(),
                          a["kv_heads"] != a["heads"] ? fmt::format(" ({} kv)", a["kv_heads"].get<int64_t>()) : "",
                          a["causal"].get<bool>() ? " causal" : "", a["qkv_fused"].get<bool>() ? "fused" : "separate");
    }
    if (b.contains("mlp")) {
      const auto& m = b["mlp"];
      int64_t inner = m["up"][0]["out"].get<int64_t>();
      line += fmt::format("; mlp {} {}", m["activation"].get<std::string>(), inner);
    }
    if (b.contains("norms")) {
      std::vector<std::string> ns;
      for (auto& n : b["norms"]) ns.push_back(n["kind"].get<std::string>());
      line += fmt::format("; norms {}", fmt::join(ns, ", "));
    }
    o << line << "\n";
    if (verbose) {
      if (b.contains("attention")) {
        for (auto& l : b["attention"]["qkv"])
          o << fmt::format("      qkv  {} [{} -> {}]\n", l["weight"].get<std::string>(), l["in"].get<int64_t>(), l["out"].get<int64_t>());
        if (!b["attention"]["out"].is_null()) {
          auto& l = b["attention"]["out"];
          o << fmt::format("      out  {} [{} -> {}]\n", l["weight"].get<std::string>(), l["in"].get<int64_t>(), l["out"].get<int64_t>());
        }
      }
      if (b.contains("mlp")) {
        for (auto& l : b["mlp"]["up"])
          o << fmt::format("      up   {} [{} -> {}]\n", l["weight"].get<std::string>(), l["in"].get<int64_t>(), l["out"].get<int64_t>());
        if (!b["mlp"]["down"].is_null()) {
          auto& l = b["mlp"]["down"];
          o << fmt::format("      down {} [{} -> {}]\n", l["weight"].get<std::string>(), l["in"].get<int64_t>(), l["out"].get<int64_t>());
        }
      }
    }
  }
  if (t.contains("head")) {
    o << fmt::format("  head {} [{} -> {}]{}\n", t["head"]["weight"].get<std::string>(), t["head"]["in"].get<int64_t>(),
                     t["head"]["out"].get<int64_t>(), t["tied_head"].get<bool>() ? " (tied to the token embedding)" : "");
  }
  if (verbose && s.contains("passes")) {
    o << "passes\n";
    for (auto& r : s["passes"]) o << fmt::format("  {:<26} {}\n", r["pass"].get<std::string>(), r["found"].get<std::string>());
  }
  return o.str();
}

std::string graph_to_dot(const Graph& g) {
  std::ostringstream o;
  o << "digraph oases {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n";
  auto color = [](const std::string& scope) {
    if (scope.find(".attn") != std::string::npos) return "#cfe2ff";
    if (scope.find(".mlp") != std::string::npos) return "#d1f0d8";
    if (scope.find(".norm") != std::string::npos) return "#fff3cd";
    if (scope == "embedding" || scope == "head") return "#f8d7da";
    return "#eeeeee";
  };
  auto esc = [](std::string s) {
    std::string r;
    for (char c : s) {
      if (c == '"' || c == '\\') r += '\\';
      r += c;
    }
    return r;
  };
  for (ValueId v : g.inputs()) {
    o << fmt::format("  \"v{}\" [shape=ellipse, fillcolor=\"#ffffff\", label=\"{}\\n{}\"];\n", v, esc(g.value(v).name),
                     shape_str(g.value(v).shape));
  }
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    o << fmt::format("  \"n{}\" [fillcolor=\"{}\", label=\"{}\\n{}{}\"];\n", id, color(n.scope), esc(op_key(n)), esc(n.name),
                     n.scope.empty() ? "" : "\\n[" + n.scope + "]");
  }
  for (NodeId id : g.nodes()) {
    const Node& n = g.node(id);
    for (ValueId v : n.inputs) {
      if (v == kNoId) continue;
      const Value& val = g.value(v);
      if (val.producer != kNoId) {
        o << fmt::format("  \"n{}\" -> \"n{}\" [label=\"{}\", fontsize=8];\n", val.producer, id, shape_str(val.shape));
      } else if (val.is_input) {
        o << fmt::format("  \"v{}\" -> \"n{}\";\n", v, id);
      }
    }
  }
  for (ValueId v : g.outputs()) {
    o << fmt::format("  \"out{}\" [shape=ellipse, fillcolor=\"#ffffff\", label=\"{}\\n{}\"];\n", v, esc(g.value(v).name),
                     shape_str(g.value(v).shape));
    if (g.value(v).producer != kNoId) o << fmt::format("  \"n{}\" -> \"out{}\";\n", g.value(v).producer, v);
  }
  o << "}\n";
  return o.str();
}

}  // namespace oases
