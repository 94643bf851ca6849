#include "planner/plan_render.h"

#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace oases {

namespace {

std::string esc(const std::string& s) {
  std::string r;
  for (char c : s) {
    switch (c) {
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '&': r += "&amp;"; break;
      case '"': r += "&quot;"; break;
      default: r += c;
    }
  }
  return r;
}

std::string bytes_str(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return fmt::format("{:.3g} {}", b, u[i]);
}

const char* color(const std::string& split) {
  if (split == "column") return "#3b82f6";
  if (split == "row") return "#f59e0b";
  if (split == "vocabulary") return "#a855f7";
  if (split == "split" || split == "plan") return "#14b8a6";
  return "#9ca3af";
}

std::string jstr(const nlohmann::json& j, const char* key, const std::string& def = "") {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : def;
}

// j[key], or null where j lacks it (a const json's operator[] on a missing key is undefined: a
// plan whose blocks lack "qkv" rendered a different label from run to run)
const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// The split of the first entry of a list of linear layers (or of one layer), else `def`.
std::string first_split(const nlohmann::json& layers, const std::string& def = "replicated") {
  const nlohmann::json* l = &layers;
  if (layers.is_array()) {
    if (layers.empty()) return def;
    l = &layers[0];
  }
  return l->is_null() ? def : jstr(*l, "split", def);
}

// Collectives of a block part ("attn"/"mlp") and phase, as "all-reduce x2 (1.5 KiB)".
std::string coll_summary(const nlohmann::json& block, const std::string& part, const std::string& phase, int* count) {
  std::map<std::string, std::pair<int, double>> by_op;
  *count = 0;
  for (const auto& c : block["collectives"]) {
    std::string scope = jstr(c, "scope");
    bool is_norm = scope.find(".norm") != std::string::npos;
    if (scope.find("." + part) == std::string::npos || (part != "norm" && is_norm) || jstr(c, "phase") != phase) continue;
    auto& e = by_op[jstr(c, "op")];
    e.first++;
    e.second += c.value("payload_bytes", 0.0);
    ++*count;
  }
  std::string s;
  for (const auto& [op, e] : by_op) s += fmt::format("{}{} ×{} ({})", s.empty() ? "" : ", ", op, e.first, bytes_str(e.second));
  return s;
}

// A plan's pipeline stages: a list of them (version 4) or their count (version 3).
int64_t stage_count(const nlohmann::json& pp) {
  if (!pp.is_object() || !pp.contains("stages")) return 1;
  const auto& st = pp["stages"];
  return st.is_array() ? static_cast<int64_t>(st.size()) : st.is_number_integer() ? st.get<int64_t>() : 1;
}

// The ranks of every stage together (version 4: each stage's own; version 3: stages x the mesh's).
int64_t ranks_in_all(const nlohmann::json& pp, int64_t first_ranks) {
  const auto& st = pp["stages"];
  if (!st.is_array()) return first_ranks * stage_count(pp);
  int64_t n = 0;
  for (const auto& m : st) n += m.value("ranks", m.value("tp", int64_t{1}) * m.value("dp", int64_t{1}));
  return n;
}

}  // namespace

// The pipeline section: a card per figure, the stages (blocks, ranks, times, memory) and the
// simulated timeline of one step (forwards light, backwards dark, transfers thin, per stage).
std::string pipeline_html(const nlohmann::json& pp) {
  std::ostringstream o;
  double step = pp.value("step_s", 0.0);
  o << "<h2>Pipeline stages</h2><div class=\"cards\">";
  o << fmt::format("<div class=\"card\">stages<b>{}</b>of {} ranks each</div>", stage_count(pp), pp.value("stage_ranks", 0));
  const int64_t V = std::max<int64_t>(1, pp.value("virtual_stages", int64_t{1}));
  o << fmt::format("<div class=\"card\">micro-batches<b>{}</b>{}{}</div>", pp.value("micro_batches", 0), esc(jstr(pp, "schedule")),
                   V > 1 ? fmt::format(", {} virtual stages a stage (interleaved)", V) : "");
  o << fmt::format("<div class=\"card\">predicted step<b>{:.4g} ms</b>bubble {:.0f}%</div>", step * 1e3, pp.value("bubble", 0.0) * 100);
  o << fmt::format("<div class=\"card\">memory per GPU<b>{}</b>the fullest stage</div>", bytes_str(pp.value("memory_bytes", 0.0)));
  o << "</div><table><tr><th>stage</th><th>blocks</th><th>ranks</th><th>mesh</th><th>holds</th><th>forward / micro-batch</th>"
       "<th>backward / micro-batch</th><th>"
    << (V > 1 ? "range steps in flight" : "micro-batches in flight") << "</th><th>memory</th></tr>";
  int i = 0;
  for (const auto& st : pp["stage"]) {
    std::string holds = st.value("embedding", false) ? "embedding" : "";
    if (st.value("head", false)) holds += std::string(holds.empty() ? "" : ", ") + "head, loss";
    // the stage's mesh: tp x dp (dp the ranks over tp), "+sp" with sequence parallelism
    std::string mesh = "-";
    int64_t tp = st.value("tp", int64_t{0}), ranks = pp.value("stage_ranks", int64_t{0});
    if (tp > 0 && ranks > 0) mesh = fmt::format("tp {} × dp {}{}", tp, ranks / tp, st.value("sequence_parallel", false) ? " +sp" : "");
    o << fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4g} ms</td><td>{:.4g} ms</td><td>{}</td><td>{}</td></tr>", i++,
                     esc(jstr(st, "blocks")), esc(jstr(st, "ranks")), esc(mesh), holds, st.value("forward_s", 0.0) * 1e3, st.value("backward_s", 0.0) * 1e3,
                     st.value("peak_in_flight", 0), bytes_str(st.value("memory_bytes", 0.0)));
  }
  o << "</table>";
  const int stages = static_cast<int>(stage_count(pp));
  double end = 0;
  for (const auto& e : pp.value("timeline", nlohmann::json::array())) end = std::max(end, e.value("end_s", 0.0));
  if (stages > 0 && end > 0) {
    const double W = 900, row = 26, left = 70;
    o << fmt::format("<div class=\"lane\"><div class=\"title\">one step, simulated</div><svg width=\"{}\" height=\"{}\">", W + left + 10,
                     row * stages + 24);
    for (int s = 0; s < stages; ++s)
      o << fmt::format("<text x=\"0\" y=\"{}\" font-size=\"11\">stage {}</text>", row * s + 17, s);
    for (const auto& e : pp["timeline"]) {
      // a model stage (with virtual stages, several a row) on its stage's row
      const int c = e.value("stage", 0), s = c % stages;
      double x = left + W * e.value("start_s", 0.0) / end, w = std::max(1.0, W * (e.value("end_s", 0.0) - e.value("start_s", 0.0)) / end);
      bool fwd = e.value("forward", true), xfer = e.value("transfer", false);
      if (xfer) {
        // a transfer on the boundary below the sending stage (forward) or above it (backward)
        double y = row * (s + 1) - 3;
        o << fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"4\" fill=\"{}\"><title>{} micro-batch {}</title></rect>", x, y, w,
                         fwd ? "#f59e0b" : "#7c3aed", fwd ? "activation" : "gradient", e.value("micro", 0));
      } else {
        o << fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\"><title>{} {}{}</title></rect>", x,
                         row * s + 4, w, row - 10, fwd ? "#93c5fd" : "#1d4ed8", fwd ? "forward" : "backward", e.value("micro", 0),
                         V > 1 ? fmt::format(" (blocks of model stage {})", c) : "");
        if (w > 14)
          o << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"9\" fill=\"{}\">{}{}</text>", x + 2, row * s + 17, fwd ? "#111" : "#fff",
                           fwd ? "F" : "B", e.value("micro", 0));
      }
    }
    o << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">{:.4g} ms</text></svg>", left + W - 50, row * stages + 18, end * 1e3);
    o << "<div class=\"notes\">light: forward, dark: backward (per micro-batch); orange: activations sent to the next stage, purple: "
         "gradients sent back</div></div>";
  }
  return o.str();
}

std::string plan_to_html(const nlohmann::json& p) {
  std::ostringstream o;
  std::string mesh;
  for (size_t i = 0; i < p["mesh"]["axes"].size(); ++i) {
    mesh += fmt::format("{}{}={}", i ? " × " : "", p["mesh"]["axes"][i].get<std::string>(), p["mesh"]["sizes"][i].get<int64_t>());
  }
  o << R"(<!doctype html><html><head><meta charset="utf-8"><title>Oases plan</title><style>
body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#111827;background:#f9fafb}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}.sub{color:#4b5563;margin-bottom:16px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:20px}.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:5px;vertical-align:middle}
.lane{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:8px 10px;margin:8px 0}
.lane .title{font-weight:bold;font-size:13px;margin-bottom:4px}.notes{font-size:12px;color:#374151;margin-top:4px}
table{border-collapse:collapse;background:#fff;font-size:12px}td,th{border:1px solid #e5e7eb;padding:3px 7px;text-align:left}th{background:#f3f4f6}
code{font-size:12px}</style></head><body>)";
  o << "<h1>Oases plan</h1><div class=\"sub\">" << esc(jstr(p, "model")) << " · mesh " << esc(mesh) << " · strategy "
    << esc(jstr(p, "strategy")) << "</div>";
  const auto& mem = p["memory"];
  o << "<div class=\"cards\">";
  bool piped = p.contains("pipeline") && stage_count(p["pipeline"]) > 1;
  o << fmt::format("<div class=\"card\">{}<b>{}</b>{}</div>", piped ? "ranks per stage" : "ranks", p["mesh"]["ranks"].get<int64_t>(),
                   piped ? fmt::format("{} in all", ranks_in_all(p["pipeline"], p["mesh"]["ranks"].get<int64_t>())) : "");
  o << fmt::format("<div class=\"card\">parameters per rank<b>{}</b>of {} in all</div>",
                   bytes_str(mem["parameter_bytes_per_rank"].get<double>()), bytes_str(mem["parameter_bytes_total"].get<double>()));
  o << fmt::format("<div class=\"card\">collectives per step<b>{}</b></div>", p["summary"]["collectives_per_step"].get<int64_t>());
  o << fmt::format("<div class=\"card\">sent per rank per step<b>{}</b>(ring algorithm)</div>",
                   bytes_str(p["summary"]["ring_bytes_per_rank_per_step"].get<double>()));
  o << "</div>";
  if (p.contains("pipeline") && p["pipeline"].is_object() && p["pipeline"].contains("stage")) o << pipeline_html(p["pipeline"]);
  o << "<h2>Transformer blocks</h2><div class=\"legend\">";
  for (const char* s : {"column", "row", "vocabulary", "replicated"}) {
    o << fmt::format("<span><i class=\"sw\" style=\"background:{}\"></i>{}-split</span>", color(s), s);
  }
  o << "<span><i class=\"sw\" style=\"background:#dc2626;transform:rotate(45deg)\"></i>collective</span></div>";

  auto box = [&](std::ostringstream& svg, double x, const std::string& label, const std::string& sub, const std::string& split, double w) {
    svg << fmt::format("<rect x=\"{}\" y=\"10\" width=\"{}\" height=\"44\" rx=\"6\" fill=\"{}\" opacity=\"0.9\"/>", x, w, color(split));
    svg << fmt::format("<text x=\"{}\" y=\"29\" font-size=\"12\" fill=\"#fff\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>",
                       x + w / 2, esc(label));
    svg << fmt::format("<text x=\"{}\" y=\"45\" font-size=\"10\" fill=\"#fff\" text-anchor=\"middle\">{}</text>", x + w / 2, esc(sub));
    return x + w;
  };
  auto arrow = [&](std::ostringstream& svg, double x) {
    svg << fmt::format("<line x1=\"{}\" y1=\"32\" x2=\"{}\" y2=\"32\" stroke=\"#6b7280\" stroke-width=\"1.5\"/>", x, x + 14);
    return x + 14;
  };
  auto diamond = [&](std::ostringstream& svg, double x, int n) {
    if (n == 0) return x;
    svg << fmt::format("<polygon points=\"{},32 {},20 {},32 {},44\" fill=\"#dc2626\"/>", x, x + 12, x + 24, x + 12);
    svg << fmt::format("<text x=\"{}\" y=\"62\" font-size=\"9\" fill=\"#dc2626\" text-anchor=\"middle\">×{}</text>", x + 12, n);
    return x + 24;
  };
  for (const auto& b : p["blocks"]) {
    std::ostringstream svg;
    double x = 4;
    int attn_f = 0, attn_b = 0, mlp_f = 0, mlp_b = 0;
    std::string af = coll_summary(b, "attn", "forward", &attn_f), ab = coll_summary(b, "attn", "backward", &attn_b);
    std::string mf = coll_summary(b, "mlp", "forward", &mlp_f), mb = coll_summary(b, "mlp", "backward", &mlp_b);
    int nf = 0, nb = 0;
    std::string normf = coll_summary(b, "norm", "forward", &nf), normb = coll_summary(b, "norm", "backward", &nb);
    if (b.contains("norms") && !b["norms"].empty()) {
      x = box(svg, x, b["norms"][0]["kind"].get<std::string>(), "replicated", "replicated", 86);
      x = arrow(svg, x);
    }
    if (b.contains("attention")) {
      const auto& a = b["attention"];
      const nlohmann::json& qkv = field(a, "qkv");
      std::string qsplit = first_split(qkv);
      x = diamond(svg, x, attn_b);
      x = box(svg, x, qkv.size() == 1 ? "QKV (fused)" : qkv.size() == 3 ? "Q, K, V" : "QKV", qsplit, qsplit, 100);
      x = arrow(svg, x);
      x = box(svg, x, "attention", fmt::format("{} of {} heads/rank", a["heads_per_rank"].get<int64_t>(), a["heads"].get<int64_t>()),
              qsplit, 130);
      x = arrow(svg, x);
      std::string osplit = first_split(field(a, "out"));
      x = box(svg, x, "out proj", osplit, osplit, 90);
      x = diamond(svg, x + 2, attn_f);
      x = arrow(svg, x);
    }
    if (b.contains("norms") && b["norms"].size() > 1) {
      x = box(svg, x, b["norms"][1]["kind"].get<std::string>(), "replicated", "replicated", 86);
      x = arrow(svg, x);
    }
    if (b.contains("mlp")) {
      const auto& m = b["mlp"];
      std::string usplit = first_split(field(m, "up"));
      x = diamond(svg, x, mlp_b);
      x = box(svg, x, field(m, "up").size() == 2 ? "gate, up" : "up proj", usplit, usplit, 90);
      x = arrow(svg, x);
      x = box(svg, x, m["activation"].get<std::string>(), usplit, usplit, 80);
      x = arrow(svg, x);
      std::string dsplit = first_split(field(m, "down"));
      x = box(svg, x, "down proj", dsplit, dsplit, 90);
      x = diamond(svg, x + 2, mlp_f);
    }
    o << "<div class=\"lane\"><div class=\"title\">block " << b["index"].get<int>() << "</div>";
    o << fmt::format("<svg width=\"{}\" height=\"68\" xmlns=\"http://www.w3.org/2000/svg\">{}</svg>", x + 10, svg.str());
    o << "<div class=\"notes\">";
    auto note = [&](const char* what, const std::string& f, const std::string& bw) {
      if (f.empty() && bw.empty()) return;
      o << "<div><b>" << what << "</b> forward: " << esc(f.empty() ? "none" : f) << "; backward: " << esc(bw.empty() ? "none" : bw)
        << "</div>";
    };
    note("attention", af, ab);
    note("MLP", mf, mb);
    note("norms", normf, normb);
    o << "</div></div>";
  }
  if (p.contains("embeddings") || p.contains("head")) {
    o << "<h2>Embeddings and head</h2><table><tr><th>weight</th><th>role</th><th>split</th><th>spec</th></tr>";
    for (const auto& e : p.value("embeddings", nlohmann::json::array())) {
      o << fmt::format("<tr><td><code>{}</code></td><td>{}</td><td><i class=\"sw\" style=\"background:{}\"></i>{}</td><td>{}</td></tr>",
                       esc(jstr(e, "weight")), esc(jstr(e, "role")), color(jstr(e, "split")), esc(jstr(e, "split")), esc(jstr(e, "spec")));
    }
    if (p.contains("head")) {
      o << fmt::format(
          "<tr><td><code>{}</code></td><td>LM head{}</td><td><i class=\"sw\" style=\"background:{}\"></i>{}</td><td></td></tr>",
          esc(jstr(p["head"], "weight")), p["head"]["tied"].get<bool>() ? " (tied)" : "", color(jstr(p["head"], "split")),
          esc(jstr(p["head"], "split")));
    }
    o << "</table>";
  }
  o << "<h2>Collectives per step</h2><table><tr><th>op</th><th>phase</th><th>scope</th><th>group</th><th>local "
       "shape</th><th>payload</th><th>sent per rank</th></tr>";
  for (const auto& c : p["collectives"]) {
    if (!c["communicates"].get<bool>()) continue;
    std::string shape;
    for (const auto& d : c["local_shape"]) shape += (shape.empty() ? "" : "×") + std::to_string(d.get<int64_t>());
    o << fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{} of {}</td><td>[{}]</td><td>{}</td><td>{}</td></tr>", esc(jstr(c, "op")),
                     esc(jstr(c, "phase")), esc(jstr(c, "scope")), esc(jstr(c, "mesh_axis")), c["group_size"].get<int64_t>(), shape,
                     bytes_str(c["payload_bytes"].get<double>()), bytes_str(c["ring_bytes_per_rank"].get<double>()));
  }
  o << "</table><h2>Parameters</h2><table><tr><th>name</th><th>shape</th><th>spec</th><th>local shape</th><th>per rank</th></tr>";
  for (const auto& q : p["parameters"]) {
    auto dims = [](const nlohmann::json& a) {
      std::string s;
      for (const auto& d : a) s += (s.empty() ? "" : "×") + std::to_string(d.get<int64_t>());
      return s;
    };
    o << fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(jstr(q, "name")),
                     dims(q["shape"]), esc(jstr(q, "spec")), dims(q["local_shape"]), bytes_str(q["bytes_per_rank"].get<double>()));
  }
  o << "</table></body></html>\n";
  return o.str();
}

std::string plan_to_dot(const nlohmann::json& p) {
  std::ostringstream o;
  o << "digraph plan {\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10, "
       "fontcolor=white];\n";
  std::string prev;
  int id = 0;
  auto node = [&](const std::string& label, const std::string& split) {
    std::string n = fmt::format("n{}", id++);
    o << fmt::format("  {} [label=\"{}\", fillcolor=\"{}\"];\n", n, label, color(split));
    if (!prev.empty()) o << fmt::format("  {} -> {};\n", prev, n);
    prev = n;
  };
  auto coll = [&](int count, const std::string& what) {
    if (count == 0) return;
    std::string n = fmt::format("n{}", id++);
    o << fmt::format("  {} [shape=diamond, label=\"{} ×{}\", fillcolor=\"#dc2626\"];\n", n, what, count);
    if (!prev.empty()) o << fmt::format("  {} -> {};\n", prev, n);
    prev = n;
  };
  for (const auto& e : p.value("embeddings", nlohmann::json::array())) node("embedding " + jstr(e, "role"), jstr(e, "split"));
  for (const auto& b : p["blocks"]) {
    int af = 0, mf = 0;
    coll_summary(b, "attn", "forward", &af);
    coll_summary(b, "mlp", "forward", &mf);
    int idx = b["index"].get<int>();
    if (b.contains("attention")) {
      const auto& a = b["attention"];
      std::string qs = first_split(field(a, "qkv"));
      node(fmt::format("block {} qkv", idx), qs);
      node(fmt::format("attention {}/{} heads", a["heads_per_rank"].get<int64_t>(), a["heads"].get<int64_t>()), qs);
      node("out proj", first_split(field(a, "out")));
      coll(af, "all-reduce");
    }
    if (b.contains("mlp")) {
      const auto& m = b["mlp"];
      node(fmt::format("block {} up", idx), first_split(field(m, "up")));
      node("down", first_split(field(m, "down")));
      coll(mf, "all-reduce");
    }
  }
  if (p.contains("head")) node("LM head", jstr(p["head"], "split"));
  o << "}\n";
  return o.str();
}

}  // namespace oases
