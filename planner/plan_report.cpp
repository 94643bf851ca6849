#include "planner/plan_report.h"

#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/atomic_file.h"
#include "planner/hybrid.h"
#include "planner/plan_render.h"
#include "planner/rank_program.h"

namespace oases {

Status write_text_file(const std::string& path, const std::string& text) {
  return write_file_atomically(path, text);
}

// Writes the plan wherever asked: JSON, HTML page, Graphviz DOT (an empty path is skipped).
Status write_plan_files(const nlohmann::json& plan, const std::string& out, const std::string& html, const std::string& dot) {
  if (!out.empty()) {
    if (Status s = write_text_file(out, plan.dump(2) + "\n"); !s.is_ok()) return s;
  }
  if (!html.empty()) {
    if (Status s = write_text_file(html, plan_to_html(plan)); !s.is_ok()) return s;
  }
  if (!dot.empty()) {
    if (Status s = write_text_file(dot, plan_to_dot(plan)); !s.is_ok()) return s;
  }
  return Status::ok();
}

// "embedding tp4 | layers 0-11 attn tp4 mlp tp2+sp | head tp4"
std::string describe_layouts(const ModelAnalysis& a, const std::vector<Layout>& ls) {
  std::vector<std::string> groups;
  size_t i = 0;
  auto block_of = [&](size_t k) { return a.parts[k].rfind("layer.", 0) == 0 ? std::atoi(a.parts[k].c_str() + 6) : -1; };
  while (i < ls.size()) {
    int b = block_of(i);
    if (b < 0) {
      groups.push_back(fmt::format("{} {}", a.parts[i], ls[i].to_string()));
      ++i;
      continue;
    }
    // a run of blocks laid out alike
    auto block_text = [&](size_t k, size_t* next) {
      std::string t;
      int bb = block_of(k);
      while (k < ls.size() && block_of(k) == bb) {
        std::string sub = a.parts[k].substr(a.parts[k].rfind('.') + 1);
        t += fmt::format("{}{} {}", t.empty() ? "" : " ", sub, ls[k].to_string());
        ++k;
      }
      *next = k;
      return t;
    };
    size_t next = 0;
    std::string t = block_text(i, &next);
    int first = b, last = b;
    size_t j = next;
    while (j < ls.size() && block_of(j) >= 0) {
      size_t n2 = 0;
      if (block_text(j, &n2) != t) break;
      last = block_of(j);
      j = n2;
    }
    groups.push_back(first == last ? fmt::format("layer {}: {}", first, t) : fmt::format("layers {}-{}: {}", first, last, t));
    i = j;
  }
  return fmt::format("{}", fmt::join(groups, " | "));
}

nlohmann::json estimate_json(const PlanEstimate& e) {
  return {{"step_ms", e.step_s * 1e3},           {"compute_ms", e.compute_s * 1e3}, {"comm_ms", e.comm_s * 1e3},
          {"hidden_ms", e.hidden_s() * 1e3},     {"exposed_ms", e.exposed_s * 1e3}, {"optimizer_ms", e.optimizer_s * 1e3},
          {"memory_bytes", e.memory_bytes},      {"static_bytes", e.static_bytes},  {"saved_activation_bytes", e.saved_bytes},
          {"transient_bytes", e.transient_bytes}, {"gradient_activation_shared_bytes", e.shared_bytes}};
}

nlohmann::json simulation_json(const SimResult& sim, double memory_bytes) {
  return {{"step_ms", sim.step_s * 1e3},         {"compute_ms", sim.compute_s * 1e3}, {"comm_ms", sim.comm_s * 1e3},
          {"hidden_ms", sim.hidden_s() * 1e3},   {"exposed_ms", sim.exposed_s * 1e3}, {"optimizer_ms", sim.optimizer_s * 1e3},
          {"executor_ms", sim.overhead_s * 1e3}, {"memory_bytes", memory_bytes},      {"collectives", sim.collectives}};
}

nlohmann::json choice_json(const ModelAnalysis& a, const PlanChoice& p, int64_t ranks) {
  nlohmann::json parts = nlohmann::json::array();
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    nlohmann::json x = {{"part", a.parts[i]},
                        {"tp", p.layouts[i].tp},
                        {"dp", ranks / p.layouts[i].tp},
                        {"sequence_parallel", p.layouts[i].sequence_parallel}};
    if (p.layouts[i].collective_matmul) x["collective_matmul"] = true;
    parts.push_back(x);
  }
  return {{"parts", parts}, {"schedule", {{"name", p.schedule}, {"chunks", p.chunks}}}};
}

// The plan file of a choice: the partitioned training graph (one chunk) in the version 1 layout,
// plus the plan's own keys (parts, schedule, shapes) and, by the caller, the predictions.
Expected<nlohmann::json> plan_report(const Graph& forward, const Plan& plan, const std::string& model_path) {
  Plan one_chunk = plan;
  one_chunk.mesh().chunks = 1;  // the report shows the model's own graph
  one_chunk.mesh().schedule.clear();
  GlobalProgramOptions go;
  go.model_path = model_path;
  go.partition = true;
  OASES_ASSIGN_OR_RETURN(GlobalProgram gp, build_global_program(forward, TrainingSpec{}, one_chunk, plan.mesh().ranks, go));
  nlohmann::json j = plan_to_json(gp.train.graph, *gp.partitioned, gp.sharding, gp.strategy, model_path);
  if (plan.dtype != "fp32") j["dtype"] = plan.dtype;  // the compute type the plan was made for
  if (plan.zero > 0) j["zero"] = plan.zero;            // the distributed optimizer
  if (plan.mesh().parts.empty()) return j;  // one Megatron split: the version 1 report as it is
  nlohmann::json own = plan.to_json();
  j["strategy"] = "oases-planner";
  j["version"] = kPlanVersion;  // the per-part layouts are version 2
  for (const char* key : {"batch", "seq", "vocab_parallel", "parts", "schedule"}) {
    if (own.contains(key)) j[key] = own[key];
  }
  std::set<int64_t> degrees;
  for (const PartLayout& l : plan.mesh().parts) degrees.insert(l.tp);
  std::map<int64_t, PartAxes> axes;
  if (auto mesh = mesh_for_degrees(plan.mesh().ranks, degrees, &axes); mesh) {
    for (auto& part : j["parts"]) {
      const PartAxes& ax = axes[part["tp"].get<int64_t>()];
      part["tp_axis"] = ax.tp >= 0 ? mesh->axes[static_cast<size_t>(ax.tp)] : "";
      part["dp_axis"] = ax.dp >= 0 ? mesh->axes[static_cast<size_t>(ax.dp)] : "";
    }
  }
  return j;
}

nlohmann::json predicted_trace(const SimResult& sim, const nlohmann::json& about) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "rank 0 (predicted; every rank alike)"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "compute"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 1}, {"args", {{"name", "communication"}}}});
  for (const auto& e : sim.trace) events.push_back(e);
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", about}};
}

}  // namespace oases
