// Reading plan files (planner/plan.h Plan::from_json, Plan::read). Every field is checked as it is
// read (its JSON type, its range), then the plan as a whole (Plan::validate), before anything runs
// it. An error is one line naming the file and the field:
//   plan.json: schedule.chunks: 0 is not a positive integer
//   plan.json: mesh.sizes[0]: 0 is not a positive integer
// Keys this build does not read (what oases-plan writes for people: "ops", "values", predictions)
// are left alone.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "planner/hybrid.h"
#include "planner/plan.h"

namespace oases {

namespace {

using nlohmann::json;

const char* json_kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "not a JSON value";
  }
}

// `s` with its control characters escaped (\n, \x01): what a one-line message may quote.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

// One file's fields, read with their types and ranges checked; errors are "<path>: <field>: <why>".
class FieldReader {
 public:
  explicit FieldReader(const std::string& path) : path_(path) {}
  const std::string& path() const { return path_; }

  template <class... Args>
  Status fail(const std::string& field, fmt::format_string<Args...> f, Args&&... args) const {
    return Status::error(fmt::format("{}: {}: {}", path_, field, fmt::format(f, std::forward<Args>(args)...)));
  }

  // A whole number in [lo, hi]: a JSON integer, or a number without a fraction (1e3).
  Expected<int64_t> integer(const json& v, const std::string& field, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return too_large(field, fmt::format("{}", u), hi);
      x = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_float()) {
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) return fail(field, "{} is not an integer", d);
      // beyond ±2^62 no bound of a plan applies: say so without converting
      if (d > 0x1p62) return too_large(field, fmt::format("{}", d), hi);
      if (d < -0x1p62) return too_small(field, fmt::format("{}", d), lo);
      x = static_cast<int64_t>(d);
    } else {
      return fail(field, "{} where an integer belongs", json_kind(v));
    }
    if (x < lo) return too_small(field, std::to_string(x), lo);
    if (x > hi) return too_large(field, std::to_string(x), hi);
    return x;
  }

  Expected<bool> boolean(const json& v, const std::string& field) const {
    if (!v.is_boolean()) return fail(field, "{} where true or false belongs", json_kind(v));
    return v.get<bool>();
  }

  // A string without control characters: every name a plan gives may be quoted in a one-line
  // message, here or when the plan runs.
  Expected<std::string> text(const json& v, const std::string& field) const {
    if (!v.is_string()) return fail(field, "{} where a string belongs", json_kind(v));
    std::string s = v.get<std::string>();
    OASES_RETURN_IF_ERROR(printable_name(s, field));
    return s;
  }

  Status printable_name(const std::string& s, const std::string& field) const {
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) return fail(field, "'{}' holds a control character", printable(s));
    }
    return Status::ok();
  }

  Status object(const json& v, const std::string& field) const {
    if (!v.is_object()) return fail(field, "{} where an object belongs", json_kind(v));
    return Status::ok();
  }

  Status list(const json& v, const std::string& field) const {
    if (!v.is_array()) return fail(field, "{} where a list belongs", json_kind(v));
    return Status::ok();
  }

 private:
  Status too_small(const std::string& field, const std::string& x, int64_t lo) const {
    if (lo == 1) return fail(field, "{} is not a positive integer", x);
    if (lo == 0) return fail(field, "{} is negative", x);
    return fail(field, "{} is less than {}", x, lo);
  }
  Status too_large(const std::string& field, const std::string& x, int64_t hi) const {
    return fail(field, "{} is more than {}, the most a plan may give", x, hi);
  }

  const std::string& path_;
};

// The optional key `key` of `obj` into *out through `read` (absent: *out keeps its default).
template <class T, class Read>
Status optional_field(const json& obj, const char* key, T* out, Read read) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::ok();
  OASES_ASSIGN_OR_RETURN(*out, read(*it));
  return Status::ok();
}

Status read_mesh(const FieldReader& f, const json& mj, MeshPlan* m) {
  OASES_RETURN_IF_ERROR(f.object(mj, "mesh"));
  Mesh& mesh = m->mesh;
  if (mj.contains("axes")) {
    const json& axes = mj["axes"];
    OASES_RETURN_IF_ERROR(f.list(axes, "mesh.axes"));
    if (axes.size() > 32) return f.fail("mesh.axes", "{} axes, more than 32", axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      const std::string field = fmt::format("mesh.axes[{}]", i);
      OASES_ASSIGN_OR_RETURN(std::string name, f.text(axes[i], field));
      if (name.empty()) return f.fail(field, "an axis needs a name");
      if (mesh.axis(name) >= 0) return f.fail(field, "axis '{}' named twice", name);
      mesh.axes.push_back(name);
    }
  }
  if (mj.contains("sizes")) {
    const json& sizes = mj["sizes"];
    OASES_RETURN_IF_ERROR(f.list(sizes, "mesh.sizes"));
    for (size_t i = 0; i < sizes.size(); ++i) {
      OASES_ASSIGN_OR_RETURN(int64_t n, f.integer(sizes[i], fmt::format("mesh.sizes[{}]", i), 1, kMaxPlanRanks));
      mesh.sizes.push_back(n);
    }
  }
  if (mesh.axes.size() != mesh.sizes.size()) return f.fail("mesh", "{} axes but {} sizes", mesh.axes.size(), mesh.sizes.size());
  if (mj.contains("parts")) {
    // per axis: the base axes a compound axis spans ([] for a base axis)
    const json& parts = mj["parts"];
    OASES_RETURN_IF_ERROR(f.list(parts, "mesh.parts"));
    if (parts.size() > mesh.axes.size()) return f.fail("mesh.parts", "{} entries for {} axes", parts.size(), mesh.axes.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string field = fmt::format("mesh.parts[{}]", i);
      OASES_RETURN_IF_ERROR(f.list(parts[i], field));
      std::vector<int> spans;
      for (size_t k = 0; k < parts[i].size(); ++k) {
        const std::string at = fmt::format("{}[{}]", field, k);
        OASES_ASSIGN_OR_RETURN(int64_t b, f.integer(parts[i][k], at, 0, std::numeric_limits<int64_t>::max()));
        if (b >= static_cast<int64_t>(mesh.axes.size())) return f.fail(at, "axis {} of a {}-axis mesh", b, mesh.axes.size());
        spans.push_back(static_cast<int>(b));
      }
      mesh.parts.push_back(std::move(spans));
    }
  }
  if (Status st = mesh.validate(); !st.is_ok()) return f.fail("mesh", "{}", st.message());
  if (Status st = check_mesh_ranks(mesh, "mesh.sizes"); !st.is_ok()) return st.with_context(f.path());
  const int64_t n = mesh.size();
  m->ranks = n;
  if (mj.contains("ranks")) {
    OASES_ASSIGN_OR_RETURN(m->ranks, f.integer(mj["ranks"], "mesh.ranks", 1, kMaxPlanRanks));
    if (!mesh.axes.empty() && m->ranks != n) return f.fail("mesh.ranks", "{}, but the mesh {} has {} ranks", m->ranks, mesh.to_string(), n);
  }
  if (mesh.axes == std::vector<std::string>{"dp", "tp"}) {
    m->dp = mesh.sizes[0];
    m->tp = mesh.sizes[1];
  }
  return Status::ok();
}

Status read_schedule(const FieldReader& f, const json& sj, MeshPlan* m) {
  OASES_RETURN_IF_ERROR(f.object(sj, "schedule"));
  OASES_RETURN_IF_ERROR(optional_field(sj, "name", &m->schedule, [&](const json& v) { return f.text(v, "schedule.name"); }));
  if (!m->schedule.empty()) {
    if (Status st = schedule_by_name(m->schedule).status(); !st.is_ok()) return f.fail("schedule.name", "{}", st.message());
  }
  OASES_RETURN_IF_ERROR(
      optional_field(sj, "chunks", &m->chunks, [&](const json& v) { return f.integer(v, "schedule.chunks", 1, kMaxPlanChunks); }));
  if (sj.contains("recompute")) {
    OASES_ASSIGN_OR_RETURN(std::string name, f.text(sj["recompute"], "schedule.recompute"));
    auto r = recompute_by_name(name);
    if (!r) return f.fail("schedule.recompute", "{}", r.status().message());
    m->recompute = *r;
  }
  return Status::ok();
}

// `field`: where the list is ("parts", or a later stage's "pipeline.stages[1].parts").
Status read_parts(const FieldReader& f, const json& pj, MeshPlan* m, const std::string& field = "parts") {
  OASES_RETURN_IF_ERROR(f.list(pj, field));
  std::set<std::string> names;
  for (size_t i = 0; i < pj.size(); ++i) {
    const json& x = pj[i];
    const std::string at = fmt::format("{}[{}]", field, i);
    OASES_RETURN_IF_ERROR(f.object(x, at));
    PartLayout l;
    if (!x.contains("part")) return f.fail(at, "no \"part\" (its name, e.g. \"layer.0.attn\")");
    OASES_ASSIGN_OR_RETURN(l.part, f.text(x["part"], at + ".part"));
    if (l.part.empty()) return f.fail(at + ".part", "a part needs a name");
    if (!names.insert(l.part).second) return f.fail(at + ".part", "part '{}' is listed twice", l.part);
    if (!x.contains("tp")) return f.fail(at, "part '{}' has no \"tp\"", l.part);
    OASES_ASSIGN_OR_RETURN(l.tp, f.integer(x["tp"], at + ".tp", 1, kMaxPlanRanks));
    OASES_RETURN_IF_ERROR(optional_field(x, "sequence_parallel", &l.sequence_parallel,
                                         [&](const json& v) { return f.boolean(v, at + ".sequence_parallel"); }));
    OASES_RETURN_IF_ERROR(optional_field(x, "collective_matmul", &l.collective_matmul,
                                         [&](const json& v) { return f.boolean(v, at + ".collective_matmul"); }));
    if (m->ranks > 0 && m->ranks % l.tp != 0)
      return f.fail(at + ".tp", "part '{}' has tp {}, which does not divide {} ranks", l.part, l.tp, m->ranks);
    // "dp" is written for people (ranks / tp); where it is given it must agree
    if (x.contains("dp")) {
      OASES_ASSIGN_OR_RETURN(int64_t dp, f.integer(x["dp"], at + ".dp", 1, kMaxPlanRanks));
      if (m->ranks > 0 && l.tp * dp != m->ranks)
        return f.fail(at + ".dp", "tp {} x dp {} = {} ranks, but the mesh has {}", l.tp, dp, l.tp * dp, m->ranks);
    }
    m->parts.push_back(l);
  }
  if (m->parts.empty()) return Status::ok();
  if (m->ranks <= 0) return f.fail("mesh.ranks", "a plan with \"parts\" needs \"mesh\": {{\"ranks\": N}}");
  if (layouts_are_mixed(m->parts)) {
    m->tp = m->dp = 0;
  } else {
    m->tp = m->parts[0].tp;
    m->dp = m->ranks / m->tp;
  }
  return Status::ok();
}

// Version 3: {"stages": S, "micro_batches", "cuts": "0-1,2-3", "schedule", "meshes": [{"tp", "dp",
// "schedule"}]}.
Status read_pipeline_v3(const FieldReader& f, const json& pj, Plan* p) {
  int64_t stages = 1;
  std::string cuts;
  OASES_RETURN_IF_ERROR(optional_field(pj, "stages", &stages, [&](const json& v) { return f.integer(v, "pipeline.stages", 1, kMaxPlanRanks); }));
  OASES_RETURN_IF_ERROR(optional_field(pj, "micro_batches", &p->micro_batches,
                                       [&](const json& v) { return f.integer(v, "pipeline.micro_batches", 1, kMaxPlanChunks); }));
  OASES_RETURN_IF_ERROR(optional_field(pj, "cuts", &cuts, [&](const json& v) { return f.text(v, "pipeline.cuts"); }));
  OASES_RETURN_IF_ERROR(optional_field(pj, "schedule", &p->pipeline, [&](const json& v) { return f.text(v, "pipeline.schedule"); }));
  std::vector<MeshPlan> out;
  if (pj.contains("meshes")) {
    const json& mj = pj["meshes"];
    OASES_RETURN_IF_ERROR(f.list(mj, "pipeline.meshes"));
    if (static_cast<int64_t>(mj.size()) != stages) return f.fail("pipeline.meshes", "{} meshes for {} stages (one mesh per stage)", mj.size(), stages);
    for (size_t k = 0; k < mj.size(); ++k) {
      const std::string at = fmt::format("pipeline.meshes[{}]", k);
      OASES_RETURN_IF_ERROR(f.object(mj[k], at));
      int64_t tp = 1, dp = 1;
      std::string sched;
      OASES_RETURN_IF_ERROR(optional_field(mj[k], "tp", &tp, [&](const json& v) { return f.integer(v, at + ".tp", 1, kMaxPlanRanks); }));
      OASES_RETURN_IF_ERROR(optional_field(mj[k], "dp", &dp, [&](const json& v) { return f.integer(v, at + ".dp", 1, kMaxPlanRanks); }));
      OASES_RETURN_IF_ERROR(optional_field(mj[k], "schedule", &sched, [&](const json& v) { return f.text(v, at + ".schedule"); }));
      if (!sched.empty()) {
        if (auto known = schedule_by_name(sched); !known) return known.status().with_context(at + ".schedule").with_context(f.path());
      }
      if (k == 0 && p->mesh().tp > 0 && (tp != p->mesh().tp || dp != p->mesh().dp))
        return f.fail(at, "tp {} x dp {}, but the plan's mesh is tp {} x dp {} (the first stage's)", tp, dp, p->mesh().tp, p->mesh().dp);
      out.push_back(k == 0 ? p->mesh() : p->stage_on(tp, dp, sched));
    }
  } else {
    out.assign(static_cast<size_t>(stages), p->mesh());
  }
  if (!cuts.empty()) {
    if (Status st = check_cuts(cuts, stages); !st.is_ok()) return st.with_context(f.path());
    const std::vector<std::string> blocks = split_cuts(cuts);
    for (size_t k = 0; k < blocks.size() && k < out.size(); ++k) out[k].blocks = blocks[k];
  }
  p->stages = std::move(out);
  return Status::ok();
}

// Version 4: {"schedule", "micro_batches", "stages": [{"blocks", "tp", "dp", "ranks", "schedule",
// "chunks"}, ...]}; the first stage is the plan's top-level mesh, schedule and parts.
Status read_pipeline_v4(const FieldReader& f, const json& pj, Plan* p) {
  OASES_RETURN_IF_ERROR(optional_field(pj, "micro_batches", &p->micro_batches,
                                       [&](const json& v) { return f.integer(v, "pipeline.micro_batches", 1, kMaxPlanChunks); }));
  OASES_RETURN_IF_ERROR(optional_field(pj, "schedule", &p->pipeline, [&](const json& v) { return f.text(v, "pipeline.schedule"); }));
  OASES_RETURN_IF_ERROR(optional_field(pj, "virtual_stages", &p->virtual_stages,
                                       [&](const json& v) { return f.integer(v, "pipeline.virtual_stages", 1, kMaxPlanChunks); }));
  if (!pj.contains("stages")) return f.fail("pipeline.stages", "missing: a list of the stages");
  const json& sj = pj["stages"];
  OASES_RETURN_IF_ERROR(f.list(sj, "pipeline.stages"));
  if (sj.empty() || static_cast<int64_t>(sj.size()) > kMaxPlanRanks)
    return f.fail("pipeline.stages", "{} stages (1 to {})", sj.size(), kMaxPlanRanks);
  std::vector<MeshPlan> out;
  for (size_t k = 0; k < sj.size(); ++k) {
    const std::string at = fmt::format("pipeline.stages[{}]", k);
    OASES_RETURN_IF_ERROR(f.object(sj[k], at));
    int64_t tp = 0, dp = 0, ranks = 0, chunks = 0;
    std::string sched, blocks;
    OASES_RETURN_IF_ERROR(optional_field(sj[k], "tp", &tp, [&](const json& v) { return f.integer(v, at + ".tp", 1, kMaxPlanRanks); }));
    OASES_RETURN_IF_ERROR(optional_field(sj[k], "dp", &dp, [&](const json& v) { return f.integer(v, at + ".dp", 1, kMaxPlanRanks); }));
    OASES_RETURN_IF_ERROR(optional_field(sj[k], "ranks", &ranks, [&](const json& v) { return f.integer(v, at + ".ranks", 1, kMaxPlanRanks); }));
    OASES_RETURN_IF_ERROR(optional_field(sj[k], "chunks", &chunks, [&](const json& v) { return f.integer(v, at + ".chunks", 1, kMaxPlanChunks); }));
    OASES_RETURN_IF_ERROR(optional_field(sj[k], "schedule", &sched, [&](const json& v) { return f.text(v, at + ".schedule"); }));
    OASES_RETURN_IF_ERROR(optional_field(sj[k], "blocks", &blocks, [&](const json& v) { return f.text(v, at + ".blocks"); }));
    const MeshPlan& m0 = p->mesh();
    if (k == 0) {
      if ((tp > 0 && tp != m0.tp) || (dp > 0 && dp != m0.dp) || (ranks > 0 && ranks != m0.ranks) || (!sched.empty() && sched != m0.schedule) ||
          (chunks > 0 && chunks != m0.chunk_count()))
        return f.fail(at, "is not the plan's own mesh and schedule (the first stage is the top-level \"mesh\", \"schedule\" and \"parts\")");
      out.push_back(m0);
    } else if (tp <= 0 && dp <= 0) {
      // no mesh of its own: the first stage's mesh, layouts and schedule
      if (!sched.empty() && sched != m0.schedule)
        return f.fail(at, "schedule '{}' without \"tp\" and \"dp\" (a stage without them runs the first stage's mesh and schedule)", sched);
      if ((ranks > 0 && ranks != m0.ranks) || (chunks > 0 && chunks != m0.chunk_count()))
        return f.fail(at, "ranks or chunks without \"tp\" and \"dp\" that are not the first stage's");
      out.push_back(p->stage_on(m0.tp, m0.dp, m0.schedule));
    } else {
      if (tp <= 0 || dp <= 0) return f.fail(at, "a stage after the first needs both \"tp\" and \"dp\", or neither (the first stage's mesh)");
      MeshPlan m = p->stage_on(tp, dp, sched);
      if (chunks > 0 && chunks != m0.chunk_count())
        return f.fail(at + ".chunks", "{}, the first stage's are {} (the stages share one chunk count)", chunks, m0.chunk_count());
      if (sj[k].contains("parts")) {
        // the stage's own layouts (its tp on every part; sequence parallelism and collective
        // matmuls per part), else Megatron's split on its mesh
        m.ranks = tp * dp;
        m.parts.clear();
        OASES_RETURN_IF_ERROR(read_parts(f, sj[k]["parts"], &m, at + ".parts"));  // a part off the stage's tp: Plan::validate
        m.tp = tp;
        m.dp = dp;
      }
      out.push_back(std::move(m));
    }
    out.back().blocks = blocks;
  }
  p->stages = std::move(out);
  return Status::ok();
}

// A map {"name": "spec"} (version 1 by hand) or a list [{"name": ..., "spec": ...}] (what the
// writers emit, with shapes for people).
Status read_parameters(const FieldReader& f, const json& pj, std::map<std::string, std::string>* out) {
  if (pj.is_object()) {
    for (const auto& [name, spec] : pj.items()) {
      const std::string field = fmt::format("parameters['{}']", printable(name));
      OASES_RETURN_IF_ERROR(f.printable_name(name, field));
      OASES_ASSIGN_OR_RETURN((*out)[name], f.text(spec, field));
    }
    return Status::ok();
  }
  if (!pj.is_array()) return f.fail("parameters", "{} where a list or an object belongs", json_kind(pj));
  for (size_t i = 0; i < pj.size(); ++i) {
    const std::string at = fmt::format("parameters[{}]", i);
    OASES_RETURN_IF_ERROR(f.object(pj[i], at));
    if (!pj[i].contains("name") || !pj[i].contains("spec")) return f.fail(at, "a parameter has a \"name\" and a \"spec\"");
    OASES_ASSIGN_OR_RETURN(std::string name, f.text(pj[i]["name"], at + ".name"));
    OASES_ASSIGN_OR_RETURN(std::string spec, f.text(pj[i]["spec"], at + ".spec"));
    if (!out->emplace(name, spec).second) return f.fail(at + ".name", "'{}' is listed twice", name);
  }
  return Status::ok();
}

Expected<json> read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return error("{}: no such plan file", path);
  json j = json::parse(f, nullptr, false);
  if (j.is_discarded()) return error("{}: not valid JSON", path);
  return j;
}

}  // namespace

Expected<Plan> Plan::from_json(const json& j, const std::string& path) {
  const FieldReader f(path);
  if (!j.is_object()) return error("{}: a plan is a JSON object, not {}", path, json_kind(j));
  Plan p;
  MeshPlan& m = p.mesh();
  if (j.contains("format")) {
    OASES_ASSIGN_OR_RETURN(std::string format, f.text(j["format"], "format"));
    if (format != "oases-plan") return f.fail("format", "'{}' is not \"oases-plan\"", format);
  }
  p.version = 1;
  if (j.contains("version")) {
    OASES_ASSIGN_OR_RETURN(int64_t v,
                           f.integer(j["version"], "version", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    if (v < 1 || v > kPlanVersionStages) return error("{}: plan version {} (this build reads 1 to {})", path, v, kPlanVersionStages);
    p.version = static_cast<int>(v);
  }
  if (j.contains("mesh")) OASES_RETURN_IF_ERROR(read_mesh(f, j["mesh"], &m));
  OASES_RETURN_IF_ERROR(optional_field(j, "batch", &p.batch, [&](const json& v) { return f.integer(v, "batch", 1, kMaxPlanBatch); }));
  OASES_RETURN_IF_ERROR(optional_field(j, "seq", &p.seq, [&](const json& v) { return f.integer(v, "seq", 1, kMaxPlanSeq); }));
  OASES_RETURN_IF_ERROR(
      optional_field(j, "vocab_parallel", &p.vocab_parallel, [&](const json& v) { return f.boolean(v, "vocab_parallel"); }));
  OASES_RETURN_IF_ERROR(
      optional_field(j, "sequence_parallel", &p.sequence_parallel, [&](const json& v) { return f.boolean(v, "sequence_parallel"); }));
  OASES_RETURN_IF_ERROR(
      optional_field(j, "collective_matmul", &p.collective_matmul, [&](const json& v) { return f.boolean(v, "collective_matmul"); }));
  OASES_RETURN_IF_ERROR(optional_field(j, "dtype", &p.dtype, [&](const json& v) { return f.text(v, "dtype"); }));
  OASES_RETURN_IF_ERROR(optional_field(j, "zero", &p.zero, [&](const json& v) { return f.integer(v, "zero", 0, 1); }));
  OASES_RETURN_IF_ERROR(optional_field(j, "dp_bucket_bytes", &p.dp_bucket_bytes,
                                       [&](const json& v) { return f.integer(v, "dp_bucket_bytes", 0, int64_t{1} << 40); }));
  if (j.contains("schedule")) OASES_RETURN_IF_ERROR(read_schedule(f, j["schedule"], &m));
  if (j.contains("parts")) OASES_RETURN_IF_ERROR(read_parts(f, j["parts"], &m));
  if (j.contains("parameters")) OASES_RETURN_IF_ERROR(read_parameters(f, j["parameters"], &p.parameters));
  // the stages last: those on the first stage's mesh take its layouts
  if (j.contains("pipeline")) {
    OASES_RETURN_IF_ERROR(f.object(j["pipeline"], "pipeline"));
    OASES_RETURN_IF_ERROR(p.version >= kPlanVersionStages ? read_pipeline_v4(f, j["pipeline"], &p) : read_pipeline_v3(f, j["pipeline"], &p));
  }
  // the fields together (bounds again, schedules, cuts, specs, the batch's split)
  if (Status st = p.validate(); !st.is_ok()) return st.with_context(path);
  return p;
}

Expected<Plan> Plan::read(const std::string& path) {
  OASES_ASSIGN_OR_RETURN(json j, read_json_file(path));
  return from_json(j, path);
}

}  // namespace oases
