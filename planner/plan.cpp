#include "planner/plan.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "graph/blocks.h"
#include "graph/op_registry.h"
#include "planner/hybrid.h"
#include "planner/pipeline.h"

namespace oases {

namespace {

const char* phase_name(Node::Phase p) {
  switch (p) {
    case Node::Phase::kForward: return "forward";
    case Node::Phase::kBackward: return "backward";
    case Node::Phase::kLoss: return "loss";
    case Node::Phase::kRecompute: return "recompute";
  }
  return "?";
}

}  // namespace

nlohmann::json plan_to_json(const Graph& global, const PartitionedGraph& pg, const ShardingResult& sr, const Strategy& s,
                            const std::string& model_path) {
  const Mesh& m = pg.mesh;
  nlohmann::json j;
  j["format"] = "oases-plan";
  // version 1 unless the plan needs what version 2 added (compound mesh axes; the planner's
  // 'parts', whose writer sets 2): a given Megatron split stays readable by version-1 readers
  j["version"] = m.has_compound_axes() ? kPlanVersion : 1;
  j["model"] = model_path;
  j["mesh"] = {{"axes", m.axes}, {"sizes", m.sizes}, {"ranks", m.size()}};
  if (m.has_compound_axes()) {
    nlohmann::json parts = nlohmann::json::array();
    for (int a = 0; a < m.num_axes(); ++a) parts.push_back(m.is_base(a) ? std::vector<int>{} : m.parts[static_cast<size_t>(a)]);
    j["mesh"]["parts"] = parts;
  }
  j["strategy"] = "megatron";
  int64_t param_bytes_rank = 0, param_bytes_total = 0;
  j["parameters"] = nlohmann::json::array();
  for (ValueId v : global.initializers()) {
    const Value& val = global.value(v);
    if (!is_floating(val.dtype)) continue;
    const ShardingSpec& sp = sr.specs[static_cast<size_t>(v)];
    Shape local = sp.local_shape(val.shape, m);
    int64_t lb = shape_numel(local) * static_cast<int64_t>(dtype_size(val.dtype));
    param_bytes_rank += lb;
    param_bytes_total += static_cast<int64_t>(val.nbytes());
    j["parameters"].push_back(
        {{"name", val.name}, {"shape", val.shape}, {"spec", sp.to_string(&m)}, {"local_shape", local}, {"bytes_per_rank", lb}});
  }
  for (const LayerSplit& l : s.layers) {
    nlohmann::json w = nlohmann::json::array();
    for (ValueId v : l.weights) w.push_back(global.value(v).name);
    j["layers"].push_back({{"what", l.what}, {"split", l.split}, {"weights", w}});
  }
  j["values"] = nlohmann::json::array();
  for (size_t v = 0; v < global.num_values(); ++v) {
    const Value& val = global.value(static_cast<ValueId>(v));
    if (val.producer == kNoId && !val.is_input && !val.is_initializer) continue;
    if (val.producer != kNoId && !global.alive(val.producer)) continue;
    const ShardingSpec& sp = sr.specs[v];
    j["values"].push_back({{"name", val.name},
                           {"dtype", dtype_name(val.dtype)},
                           {"shape", val.shape},
                           {"spec", sp.to_string(&m)},
                           {"local_shape", sp.local_shape(val.shape, m)}});
  }
  j["ops"] = nlohmann::json::array();
  auto order = global.topo_order();
  if (order) {
    for (NodeId id : *order) {
      const Node& n = global.node(id);
      nlohmann::json ins = nlohmann::json::array(), outs = nlohmann::json::array();
      for (ValueId v : n.inputs) ins.push_back(v == kNoId ? "" : sr.specs[static_cast<size_t>(v)].to_string(&m));
      for (ValueId v : n.outputs) outs.push_back(v == kNoId ? "" : sr.specs[static_cast<size_t>(v)].to_string(&m));
      std::string split = "replicated";
      for (ValueId v : n.outputs) {
        if (v == kNoId) continue;
        const ShardingSpec& sp = sr.specs[static_cast<size_t>(v)];
        if (sp.any_partial())
          split = "partial";
        else if (!sp.is_replicated() && split == "replicated")
          split = "split";
      }
      j["ops"].push_back({{"name", n.name},
                          {"op", n.domain.empty() ? n.op_type : n.domain + "." + n.op_type},
                          {"scope", n.scope},
                          {"phase", phase_name(n.phase)},
                          {"inputs", ins},
                          {"outputs", outs},
                          {"layout", split}});
    }
  }
  j["collectives"] = nlohmann::json::array();
  int64_t comm_bytes = 0;
  int64_t count = 0;
  auto lorder = pg.local.topo_order();
  const OpRegistry& reg = OpRegistry::global();
  if (lorder) {
    for (NodeId id : *lorder) {
      const Node& n = pg.local.node(id);
      if (!is_collective(n) && n.op_type != "ShardSlice") continue;
      if (n.domain != kOasesDomain) continue;
      const Value& in = pg.local.value(n.inputs[0]);
      const OpSchema* sc = reg.find(n.domain, n.op_type);
      double ring = sc && sc->cost ? sc->cost(pg.local, n).bytes : 0;
      int64_t axis = n.attrs.get_int("mesh_axis", 0);
      bool communicates = n.op_type != "ShardSlice";
      if (communicates) {
        comm_bytes += static_cast<int64_t>(ring);
        ++count;
      }
      j["collectives"].push_back({{"name", n.name},
                                  {"op", n.op_type},
                                  {"mesh_axis", m.axes.at(static_cast<size_t>(axis))},
                                  {"group_size", n.attrs.get_int("group_size", 1)},
                                  {"value", in.name},
                                  {"local_shape", in.shape},
                                  {"payload_bytes", in.nbytes()},
                                  {"ring_bytes_per_rank", static_cast<int64_t>(ring)},
                                  {"phase", phase_name(n.phase)},
                                  {"scope", n.scope},
                                  {"communicates", communicates}});
    }
  }
  // transformer blocks with the split of each layer and the collectives issued in the block
  ModelStructure ms = find_transformer_structure(global);
  auto split_of = [&](ValueId w) -> std::string {
    if (w == kNoId) return "";
    const ShardingSpec& sp = sr.specs[static_cast<size_t>(w)];
    for (const LayerSplit& l : s.layers) {
      for (ValueId x : l.weights) {
        if (x == w) return l.split;
      }
    }
    return sp.is_replicated() ? "replicated" : "split";
  };
  auto linear_json = [&](const LinearInfo& l) -> nlohmann::json {
    if (l.matmul == kNoId) return nullptr;
    return {{"weight", global.value(l.weight).name},
            {"split", split_of(l.weight)},
            {"spec", sr.specs[static_cast<size_t>(l.weight)].to_string(&m)},
            {"in", l.in_features},
            {"out", l.out_features}};
  };
  std::map<std::string, std::vector<nlohmann::json>> coll_by_scope;
  for (const auto& c : j["collectives"]) {
    if (c["communicates"].get<bool>()) coll_by_scope[c["scope"].get<std::string>()].push_back(c);
  }
  int tp_axis = m.axis("tp");
  int64_t tp = tp_axis >= 0 ? m.sizes[static_cast<size_t>(tp_axis)] : 1;
  j["blocks"] = nlohmann::json::array();
  for (const BlockInfo& b : ms.blocks) {
    nlohmann::json bj{{"index", b.index}};
    std::string base = fmt::format("layer.{}", b.index);
    if (b.has_attn) {
      nlohmann::json a{{"heads", b.attn.heads}, {"kv_heads", b.attn.kv_heads}, {"head_dim", b.attn.head_dim}, {"causal", b.attn.causal}};
      bool split = false;
      for (const auto& l : b.attn.qkv) {
        a["qkv"].push_back(linear_json(l));
        split |= !sr.specs[static_cast<size_t>(l.weight)].is_replicated();
      }
      a["heads_per_rank"] = split ? b.attn.heads / tp : b.attn.heads;
      a["out"] = linear_json(b.attn.out);
      bj["attention"] = a;
    }
    if (b.has_mlp) {
      nlohmann::json mj{{"activation", b.mlp.kind}};
      for (const auto& l : b.mlp.up) mj["up"].push_back(linear_json(l));
      mj["down"] = linear_json(b.mlp.down);
      bj["mlp"] = mj;
    }
    for (const auto& nrm : b.norms)
      bj["norms"].push_back({{"kind", nrm.kind}, {"spec", sr.specs[static_cast<size_t>(nrm.scale)].to_string(&m)}});
    nlohmann::json cs = nlohmann::json::array();
    for (const auto& [scope, list] : coll_by_scope) {
      if (scope.rfind(base + ".", 0) != 0) continue;
      for (const auto& c : list) cs.push_back(c);
    }
    bj["collectives"] = cs;
    j["blocks"].push_back(bj);
  }
  nlohmann::json other = nlohmann::json::array();
  for (const auto& [scope, list] : coll_by_scope) {
    if (scope.rfind("layer.", 0) == 0) continue;
    for (const auto& c : list) other.push_back(c);
  }
  j["collectives_outside_blocks"] = other;
  for (const EmbeddingInfo& e : ms.embeddings) {
    j["embeddings"].push_back({{"weight", global.value(e.weight).name},
                               {"role", e.role},
                               {"rows", e.rows},
                               {"dim", e.dim},
                               {"split", split_of(e.weight)},
                               {"spec", sr.specs[static_cast<size_t>(e.weight)].to_string(&m)}});
  }
  if (ms.has_head) j["head"] = {{"weight", global.value(ms.head.weight).name}, {"tied", ms.tied_head}, {"split", split_of(ms.head.weight)}};
  j["memory"] = {{"parameter_bytes_per_rank", param_bytes_rank}, {"parameter_bytes_total", param_bytes_total}};
  j["summary"] = {{"collectives_per_step", count}, {"ring_bytes_per_rank_per_step", comm_bytes}};
  return j;
}

const char* recompute_name(CheckpointMode m) {
  switch (m) {
    case CheckpointMode::kNone: return "none";
    case CheckpointMode::kBlock: return "block";
    case CheckpointMode::kCommOptimized: return "comm_optimized";
  }
  return "?";
}

Expected<CheckpointMode> recompute_by_name(const std::string& name) {
  if (name == "none") return CheckpointMode::kNone;
  if (name == "block") return CheckpointMode::kBlock;
  if (name == "comm_optimized") return CheckpointMode::kCommOptimized;
  return error("unknown recompute '{}' (none, block, comm_optimized)", name);
}

namespace {

bool same_mesh(const Mesh& a, const Mesh& b) {
  return a.axes == b.axes && a.sizes == b.sizes && a.parts == b.parts;
}

}  // namespace

CheckpointMode MeshPlan::recompute_mode() const {
  if (recompute) return *recompute;
  if (schedule.empty()) return CheckpointMode::kNone;
  auto s = schedule_by_name(schedule);
  return s ? s->checkpoint : CheckpointMode::kNone;
}

bool MeshPlan::operator==(const MeshPlan& o) const {
  return ranks == o.ranks && tp == o.tp && dp == o.dp && same_mesh(mesh, o.mesh) && parts == o.parts && schedule == o.schedule &&
         chunks == o.chunks && recompute == o.recompute && blocks == o.blocks;
}

bool same_stage_layout(const MeshPlan& a, const MeshPlan& b) {
  return a.ranks == b.ranks && a.tp == b.tp && a.dp == b.dp && same_mesh(a.mesh, b.mesh) && a.parts == b.parts && a.schedule == b.schedule &&
         a.recompute == b.recompute;
}

MeshPlan Plan::stage_on(int64_t tp, int64_t dp, const std::string& schedule) const {
  const MeshPlan& m0 = mesh();
  const std::string s = schedule.empty() ? m0.schedule : schedule;
  if ((tp == m0.tp || (tp <= 0 && m0.tp <= 0)) && (dp == m0.dp || (dp <= 0 && m0.dp <= 0)) && s == m0.schedule) {
    MeshPlan same = m0;
    same.blocks.clear();
    return same;
  }
  MeshPlan m;
  m.tp = tp;
  m.dp = dp;
  m.ranks = tp * dp;
  m.schedule = s;
  m.chunks = m0.chunks;
  return m;
}

Expected<Plan> with_stages(const Plan& first, int64_t stages, int64_t micro_batches, const std::string& schedule, const std::string& cuts,
                           const std::vector<MeshPlan>& meshes, int64_t virtual_stages) {
  Plan staged = first;
  staged.pipeline = schedule;
  staged.micro_batches = micro_batches;
  staged.virtual_stages = virtual_stages;
  const std::vector<std::string> blocks = split_cuts(cuts);
  const int64_t V = std::max<int64_t>(virtual_stages, 1);
  if (!blocks.empty() && static_cast<int64_t>(blocks.size()) != stages * V)
    return V > 1 ? error("--stages '{}' gives {} block ranges; --pp {} x --virtual-stages {} needs {}", cuts, blocks.size(), stages, V, stages * V)
                 : error("--stages '{}' gives {} stages, --pp {}", cuts, blocks.size(), stages);
  staged.stages.clear();
  for (int64_t k = 0; k < stages; ++k) {
    const auto i = static_cast<size_t>(k);
    MeshPlan m = k == 0 || meshes.empty() ? first.mesh() : first.stage_on(meshes[i].tp, meshes[i].dp, meshes[i].schedule);
    m.blocks = blocks.empty() ? "" : stage_blocks(blocks, stages, k);
    staged.stages.push_back(std::move(m));
  }
  return staged;
}

std::string stage_blocks(const std::vector<std::string>& model_ranges, int64_t stages, int64_t stage) {
  std::vector<std::string> mine;
  for (size_t c = static_cast<size_t>(stage); stages > 0 && c < model_ranges.size(); c += static_cast<size_t>(stages)) mine.push_back(model_ranges[c]);
  return fmt::format("{}", fmt::join(mine, ","));
}

std::string Plan::cuts() const {
  std::vector<std::vector<std::string>> per_stage;
  for (const MeshPlan& st : stages) {
    if (st.blocks.empty()) return "";
    per_stage.push_back(split_cuts(st.blocks));
  }
  // model stage c: stage c mod S's range c / S (a stage short of ranges ends the list: validate says so)
  std::vector<std::string> b;
  const size_t S = per_stage.size();
  for (size_t c = 0;; ++c) {
    const auto& mine = per_stage[c % S];
    if (c / S >= mine.size()) break;
    b.push_back(mine[c / S]);
  }
  return fmt::format("{}", fmt::join(b, ","));
}

int64_t Plan::stage_ranks(int64_t stage) const {
  const MeshPlan& m = stages.at(static_cast<size_t>(stage));
  return m.ranks > 0 ? m.ranks : std::max<int64_t>(m.tp, 1) * std::max<int64_t>(m.dp, 1);
}

int64_t Plan::world() const { return first_rank(num_stages()); }

int64_t Plan::first_rank(int64_t stage) const {
  int64_t first = 0;
  for (int64_t s = 0; s < stage; ++s) first += stage_ranks(s);
  return first;
}

int Plan::stage_of_rank(int64_t world_rank) const {
  int64_t first = 0;
  for (int64_t s = 0; s < num_stages(); ++s) {
    const int64_t n = stage_ranks(s);
    if (world_rank >= first && world_rank < first + n) return static_cast<int>(s);
    first += n;
  }
  return -1;
}

Plan Plan::megatron(int64_t tp, int64_t dp) {
  Plan p;
  p.version = 1;
  p.mesh().tp = tp;
  p.mesh().dp = dp;
  p.mesh().ranks = tp * dp;
  return p;
}

Plan Plan::from_parts(std::vector<PartLayout> parts, int64_t ranks, std::string schedule, int64_t chunks) {
  Plan p;
  p.version = kPlanVersion;
  p.mesh().ranks = ranks;
  p.mesh().parts = std::move(parts);
  if (!p.mesh().parts.empty() && !layouts_are_mixed(p.mesh().parts)) {
    p.mesh().tp = p.mesh().parts[0].tp;
    p.mesh().dp = ranks / p.mesh().tp;
  }
  p.mesh().schedule = std::move(schedule);
  p.mesh().chunks = chunks;
  return p;
}

std::vector<std::string> split_cuts(const std::string& cuts) {
  std::vector<std::string> out;
  for (size_t start = 0; !cuts.empty();) {
    size_t comma = cuts.find(',', start);
    out.push_back(cuts.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Status check_cuts(const std::string& cuts, int64_t stages) {
  std::regex item_re("([0-9]{1,9})-([0-9]{1,9})");
  int64_t count = 0, next = 0;
  size_t start = 0;
  while (true) {
    size_t comma = cuts.find(',', start);
    std::string item = cuts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::smatch mm;
    if (!std::regex_match(item, mm, item_re))
      return error("pipeline.cuts: '{}' is not a list of FIRST-LAST block ranges (e.g. 0-5,6-11)", cuts);
    int64_t first = std::stoll(mm[1]), last = std::stoll(mm[2]);
    if (first != next) return error("pipeline.cuts: stage {} starts at block {}, not {} (every block once, in order)", count, first, next);
    if (last < first) return error("pipeline.cuts: stage {} ({}) is empty", count, item);
    next = last + 1;
    ++count;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (count != stages) return error("pipeline.cuts: '{}' cuts {} stages, the plan has {}", cuts, count, stages);
  return Status::ok();
}

namespace {

// The mesh the plan's parameter specs name axes of: the file's mesh, else a tp x dp one.
std::optional<Mesh> spec_mesh(const MeshPlan& m) {
  if (!m.mesh.axes.empty()) return m.mesh;
  if (!m.parts.empty()) return std::nullopt;  // the layouts' mesh: known once applied to a model
  return Mesh::data_tensor(std::max<int64_t>(m.dp, 1), std::max<int64_t>(m.tp, 1));
}

}  // namespace

Status Plan::validate() const {
  const MeshPlan& m = mesh();
  if (m.ranks < 0 || m.ranks > kMaxPlanRanks) return error("mesh.ranks: {} ranks (1 to {})", m.ranks, kMaxPlanRanks);
  if (m.tp < 0 || m.dp < 0 || m.tp > kMaxPlanRanks || m.dp > kMaxPlanRanks)
    return error("mesh: tp {} x dp {}: degrees must be positive, at most {}", m.tp, m.dp, kMaxPlanRanks);
  if (m.tp > 0 && m.dp > 0 && m.ranks > 0 && m.tp * m.dp != m.ranks) {
    return error("mesh: tp {} x dp {} = {} ranks, but the mesh has {}", m.tp, m.dp, m.tp * m.dp, m.ranks);
  }
  if (!m.mesh.axes.empty() || !m.mesh.sizes.empty()) {
    OASES_RETURN_IF_ERROR(check_mesh_ranks(m.mesh, "mesh.sizes"));
    OASES_RETURN_IF_ERROR(m.mesh.validate().with_context("mesh"));
    const int64_t n = m.mesh.size();  // the base axes' sizes multiplied: at most kMaxPlanRanks
    if (m.ranks > 0 && n != m.ranks) return error("mesh.ranks: {}, but the mesh {} has {} ranks", m.ranks, m.mesh.to_string(), n);
  }
  std::set<std::string> part_names;
  for (size_t i = 0; i < m.parts.size(); ++i) {
    const PartLayout& l = m.parts[i];
    if (l.part.empty()) return error("parts[{}].part: a part needs a name", i);
    if (!part_names.insert(l.part).second) return error("parts[{}].part: part '{}' is listed twice", i, l.part);
    if (l.tp < 1 || l.tp > kMaxPlanRanks) return error("parts[{}].tp: part '{}' has tp {}", i, l.part, l.tp);
    if (m.ranks > 0 && m.ranks % l.tp != 0)
      return error("parts[{}].tp: part '{}' has tp {}, which does not divide {} ranks", i, l.part, l.tp, m.ranks);
  }
  if (!m.parts.empty() && m.ranks <= 0) return Status::error("mesh.ranks: a plan with \"parts\" needs \"mesh\": {\"ranks\": N}");
  if (!m.schedule.empty()) OASES_RETURN_IF_ERROR(schedule_by_name(m.schedule).status().with_context("schedule.name"));
  if (m.chunks < 0) return error("schedule.chunks: {} is not a positive integer", m.chunks);
  if (m.chunks > kMaxPlanChunks) return error("schedule.chunks: {} is more than {}", m.chunks, kMaxPlanChunks);
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") return error("dtype: unknown dtype '{}' (fp32, bf16, fp16)", dtype);
  if (dp_bucket_bytes < 0) return error("dp_bucket_bytes: {} is negative", dp_bucket_bytes);
  if (zero < 0 || zero > 1) return error("zero: {} is not a ZeRO stage this build runs (0 or 1)", zero);
  if (batch < 0 || batch > kMaxPlanBatch) return error("batch: {} sequences (1 to {})", batch, kMaxPlanBatch);
  if (seq < 0 || seq > kMaxPlanSeq) return error("seq: {} tokens (1 to {})", seq, kMaxPlanSeq);
  const int64_t S = num_stages();
  if (S < 1 || S > kMaxPlanRanks) return error("pipeline.stages: {} stages (1 to {})", S, kMaxPlanRanks);
  if (micro_batches < 0 || micro_batches > kMaxPlanChunks)
    return error("pipeline.micro_batches: {} micro-batches (1 to {})", micro_batches, kMaxPlanChunks);
  if (S > 1 && !parse_pipeline(pipeline))
    return error("pipeline.schedule: unknown pipeline schedule '{}' (gpipe, 1f1b, eager-1f1b, zb-h1)", pipeline);
  int64_t with_blocks = 0;
  for (int64_t k = 1; k < S; ++k) {
    const MeshPlan& st = stages[static_cast<size_t>(k)];
    const std::string at = fmt::format("pipeline.stages[{}]", k);
    if (same_stage_layout(st, m)) continue;  // the first stage's mesh, checked above
    if (st.tp < 1 || st.dp < 1 || st.tp > kMaxPlanRanks || st.dp > kMaxPlanRanks)
      return error("{}: tp {} x dp {} (each 1 to {})", at, st.tp, st.dp, kMaxPlanRanks);
    if (st.ranks > 0 && st.ranks != st.tp * st.dp) return error("{}: tp {} x dp {} on {} ranks", at, st.tp, st.dp, st.ranks);
    if (!st.schedule.empty()) OASES_RETURN_IF_ERROR(schedule_by_name(st.schedule).status().with_context(at + ".schedule"));
    if (st.chunks < 0 || st.chunks > kMaxPlanChunks) return error("{}.chunks: {} is not 1 to {}", at, st.chunks, kMaxPlanChunks);
    for (size_t i = 0; i < st.parts.size(); ++i) {
      if (st.parts[i].tp != st.tp) return error("{}.parts[{}].tp: {}, the stage's tp is {} (a stage's parts share its tp)", at, i, st.parts[i].tp, st.tp);
    }
  }
  for (const MeshPlan& st : stages) with_blocks += !st.blocks.empty();
  if (with_blocks > 0 && with_blocks < S) return Status::error("pipeline.stages: every stage names its blocks, or none does");
  if (virtual_stages < 1 || virtual_stages > kMaxPlanChunks)
    return error("pipeline.virtual_stages: {} (1 to {})", virtual_stages, kMaxPlanChunks);
  if (virtual_stages > 1) {
    auto sched = parse_pipeline(pipeline);
    const int64_t micro = micro_batches > 0 ? micro_batches : S;
    if (S < 2 || !sched || micro > std::numeric_limits<int>::max() || S * virtual_stages > kMaxPlanChunks)
      return error("pipeline.virtual_stages: {} with {} stage(s); interleaving needs at least 2", virtual_stages, S);
    OASES_RETURN_IF_ERROR(check_virtual_stages(*sched, static_cast<int>(S), static_cast<int>(micro), static_cast<int>(virtual_stages))
                              .with_context("pipeline.virtual_stages"));
  }
  for (int64_t k = 0; k < S && with_blocks == S; ++k) {
    const int64_t ranges = static_cast<int64_t>(split_cuts(stages[static_cast<size_t>(k)].blocks).size());
    if (ranges != virtual_stages)
      return error("pipeline.stages[{}].blocks: '{}' names {} block range(s); each stage names {} (its virtual stages)", k,
                   stages[static_cast<size_t>(k)].blocks, ranges, virtual_stages);
  }
  if (with_blocks == S && S > 1) OASES_RETURN_IF_ERROR(check_cuts(cuts(), S * virtual_stages));
  // every sequence of the batch in one piece: dp x micro-batches x chunks divide it (on each
  // stage's mesh; dp where the plan fixes one)
  if (batch > 0) {
    const bool piped = S > 1 && micro_batches > 0;
    const int64_t micro = piped ? micro_batches : 1, chunks = m.chunk_count();
    std::vector<int64_t> dps;  // each stage's dp; a stage of per-part layouts: each part's
    for (const MeshPlan& st : stages) {
      if (st.dp > 0 || st.parts.empty() || st.ranks <= 0) dps.push_back(st.dp);
      for (const PartLayout& l : st.parts) {
        if (st.dp <= 0 && st.ranks > 0 && l.tp > 0) dps.push_back(st.ranks / l.tp);
      }
    }
    for (const int64_t dp : dps) {
      // each factor is at most 2^20: the product fits
      if (batch % (std::max<int64_t>(dp, 1) * micro * chunks) == 0) continue;
      std::string pieces = dp > 0 ? fmt::format("dp {} x ", dp) : "";
      if (piped) pieces += fmt::format("{} micro-batches x ", micro);
      return error("{}: {}{} chunks do not divide the batch of {}", piped ? "pipeline.micro_batches" : "schedule.chunks", pieces, chunks,
                   batch);
    }
  }
  if (std::optional<Mesh> sm = spec_mesh(m)) {
    for (const auto& [name, text] : parameters) {
      if (name.empty()) return Status::error("parameters: a parameter without a name");
      OASES_RETURN_IF_ERROR(parse_spec(text, *sm).status().with_context(fmt::format("parameters['{}']", name)));
    }
  }
  return Status::ok();
}

Expected<std::vector<MeshPlan>> parse_stage_meshes(const std::string& text, int64_t stages) {
  std::vector<MeshPlan> out;
  std::regex re("([0-9]+)x([0-9]+)(:([a-z_]+))?");
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::smatch m;
    if (!std::regex_match(item, m, re))
      return error("--stage-meshes {}: '{}' is not TPxDP or TPxDP:SCHEDULE (e.g. 2x1,1x2:oases)", text, item);
    MeshPlan sm;
    try {
      sm.tp = std::stoll(m[1]);
      sm.dp = std::stoll(m[2]);
    } catch (const std::exception&) {
      return error("--stage-meshes {}: '{}' is out of range", text, item);
    }
    if (sm.tp < 1 || sm.dp < 1 || sm.tp > kMaxPlanRanks || sm.dp > kMaxPlanRanks)
      return error("--stage-meshes {}: '{}' needs tp and dp from 1 to 2^20", text, item);
    sm.ranks = sm.tp * sm.dp;
    sm.schedule = m[4];
    if (!sm.schedule.empty() && !schedule_by_name(sm.schedule)) return error("--stage-meshes {}: schedule '{}' is unknown", text, sm.schedule);
    out.push_back(sm);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int64_t>(out.size()) != stages) return error("--stage-meshes {} names {} meshes for {} stages", text, out.size(), stages);
  return out;
}

std::string stage_meshes_string(const std::vector<MeshPlan>& meshes) {
  std::string s;
  for (const auto& m : meshes) {
    if (!s.empty()) s += ",";
    s += fmt::format("{}x{}", m.tp, m.dp);
    if (!m.schedule.empty()) s += ":" + m.schedule;
  }
  return s;
}

namespace {

// A mesh's per-part layouts as plan files list them.
nlohmann::json parts_json(const MeshPlan& m) {
  nlohmann::json parts = nlohmann::json::array();
  for (const PartLayout& l : m.parts) {
    nlohmann::json x = {{"part", l.part}, {"tp", l.tp}, {"sequence_parallel", l.sequence_parallel}};
    if (l.collective_matmul) x["collective_matmul"] = true;
    if (m.ranks > 0) x["dp"] = m.ranks / l.tp;
    parts.push_back(x);
  }
  return parts;
}

}  // namespace

nlohmann::json Plan::pipeline_json() const {
  // what is not fixed (0 or "") is left out: the reader takes the run's default
  nlohmann::json j{{"schedule", pipeline}};
  if (micro_batches > 0) j["micro_batches"] = micro_batches;
  if (virtual_stages > 1) j["virtual_stages"] = virtual_stages;
  j["stages"] = nlohmann::json::array();
  for (const MeshPlan& m : stages) {
    nlohmann::json sj = nlohmann::json::object();
    if (!m.blocks.empty()) sj["blocks"] = m.blocks;
    if (m.tp > 0) sj["tp"] = m.tp;
    if (m.dp > 0) sj["dp"] = m.dp;
    if (m.ranks > 0) sj["ranks"] = m.ranks;
    if (!m.schedule.empty()) sj["schedule"] = m.schedule;
    if (m.chunks > 0) sj["chunks"] = m.chunks;
    // a later stage's own layouts (the first stage's are the plan's top-level "parts")
    if (&m != &stages.front() && !m.parts.empty() && m.parts != stages.front().parts) sj["parts"] = parts_json(m);
    j["stages"].push_back(sj);
  }
  return j;
}

nlohmann::json Plan::to_json() const {
  const MeshPlan& m = mesh();
  nlohmann::json j;
  j["format"] = "oases-plan";
  // version 1 unless the plan needs what version 2 added
  bool v2 = !m.parts.empty() || batch > 0 || seq > 0 || !m.schedule.empty() || m.mesh.has_compound_axes();
  j["version"] = v2 ? kPlanVersion : 1;
  if (!m.mesh.axes.empty()) {
    j["mesh"] = {{"axes", m.mesh.axes}, {"sizes", m.mesh.sizes}};
    if (m.mesh.has_compound_axes()) {
      nlohmann::json parts = nlohmann::json::array();
      for (int a = 0; a < m.mesh.num_axes(); ++a)
        parts.push_back(m.mesh.is_base(a) ? std::vector<int>{} : m.mesh.parts[static_cast<size_t>(a)]);
      j["mesh"]["parts"] = parts;
    }
  } else if (m.tp > 0 && m.dp > 0 && m.parts.empty()) {
    j["mesh"] = {{"axes", {"dp", "tp"}}, {"sizes", {m.dp, m.tp}}};
  }
  if (m.ranks > 0) j["mesh"]["ranks"] = m.ranks;
  if (batch > 0) j["batch"] = batch;
  if (seq > 0) j["seq"] = seq;
  j["vocab_parallel"] = vocab_parallel;
  // keys newer builds read; written only when they differ from the default, so older readers
  // (which ignore them) see the same plan
  if (sequence_parallel) j["sequence_parallel"] = true;
  if (collective_matmul) j["collective_matmul"] = true;
  if (dtype != "fp32") j["dtype"] = dtype;
  if (dp_bucket_bytes != (int64_t{25} << 20)) j["dp_bucket_bytes"] = dp_bucket_bytes;
  if (zero > 0) j["zero"] = zero;
  if (!m.schedule.empty() || m.chunks > 0 || m.recompute) {
    j["schedule"] = {{"name", m.schedule}};
    if (m.chunks > 0) j["schedule"]["chunks"] = m.chunks;  // 0: the schedule's default
    if (m.recompute) j["schedule"]["recompute"] = recompute_name(*m.recompute);
  }
  if (!m.parts.empty()) j["parts"] = parts_json(m);
  if (num_stages() > 1) {
    j["version"] = kPlanVersionStages;
    j["pipeline"] = pipeline_json();
  }
  if (!parameters.empty()) {
    j["parameters"] = nlohmann::json::array();
    for (const auto& [name, spec] : parameters) j["parameters"].push_back({{"name", name}, {"spec", spec}});
  }
  return j;
}

bool Plan::operator==(const Plan& o) const {
  return stages == o.stages && vocab_parallel == o.vocab_parallel && sequence_parallel == o.sequence_parallel &&
         collective_matmul == o.collective_matmul && dtype == o.dtype && dp_bucket_bytes == o.dp_bucket_bytes && zero == o.zero && batch == o.batch &&
         seq == o.seq && parameters == o.parameters &&
         (num_stages() == 1 || (pipeline == o.pipeline && micro_batches == o.micro_batches && virtual_stages == o.virtual_stages));
}

std::string Plan::to_string() const {
  const MeshPlan& m = mesh();
  std::string out;
  if (!m.parts.empty() && m.tp == 0) {
    std::vector<std::string> degrees;
    for (const PartLayout& l : m.parts)
      degrees.push_back(fmt::format("{}{}{}", l.tp, l.sequence_parallel ? "sp" : "", l.collective_matmul ? "cm" : ""));
    out = fmt::format("{} ranks, parts tp {}", m.ranks, fmt::join(degrees, "/"));
  } else if (m.tp > 0 || m.dp > 0) {
    out = fmt::format("tp {} x dp {}", m.tp, m.dp);
  } else if (m.ranks > 0) {
    out = fmt::format("{} ranks", m.ranks);
  } else {
    out = "any mesh";
  }
  out += fmt::format(", {} x {} chunks", m.schedule.empty() ? "in line" : m.schedule, m.chunk_count());
  if (m.recompute) out += fmt::format(", recompute {}", recompute_name(*m.recompute));
  out += ", " + dtype;
  if (!vocab_parallel) out += ", vocabulary replicated";
  if (sequence_parallel) out += ", sequence parallel";
  if (collective_matmul) out += ", collective matmuls";
  if (zero > 0) out += fmt::format(", ZeRO-{}", zero);
  if (batch > 0 || seq > 0) out += fmt::format(", batch {} x {}", batch, seq);
  if (!parameters.empty()) out += fmt::format(", {} parameter specs", parameters.size());
  if (num_stages() > 1) {
    out += fmt::format(", pipeline of {} stages{} ({}, {} micro-batches{})", num_stages(),
                       virtual_stages > 1 ? fmt::format(" x {} virtual", virtual_stages) : "", pipeline,
                       micro_batches > 0 ? std::to_string(micro_batches) : "default", cuts().empty() ? "" : ", blocks " + cuts());
  }
  return out;
}

Status adopt_plan(const Plan& p, const std::string& path, int64_t world, RunShape* run) {
  const MeshPlan& m = p.mesh();
  if (m.ranks > 0 && m.ranks != world) {
    return error("{}: the plan is for {} ranks, this run has {} (run it with --local-ranks {} or mpirun -np {})", path, m.ranks, world,
                 m.ranks, m.ranks);
  }
  auto adopt = [&](int64_t* mine, int64_t plan, const char* flag) -> Status {
    if (plan <= 0) return Status::ok();
    if (*mine > 0 && *mine != plan)
      return error("{}: the plan has {} {}, the command line {} (leave {} out)", path, flag, plan, *mine, flag);
    *mine = plan;
    return Status::ok();
  };
  if (m.tp > 0) {
    OASES_RETURN_IF_ERROR(adopt(&run->tp, m.tp, "--tp"));
    OASES_RETURN_IF_ERROR(adopt(&run->dp, m.dp, "--dp"));
  } else if (!m.parts.empty()) {
    if (run->tp > 0 || run->dp > 0) return error("{}: the plan's parts use different tp degrees; leave --tp and --dp out", path);
    // one rank grid for every part: the run's tp x dp are a placeholder the mesh replaces
    run->tp = 1;
    run->dp = world;
  }
  OASES_RETURN_IF_ERROR(adopt(&run->batch, p.batch, "--batch"));
  OASES_RETURN_IF_ERROR(adopt(&run->seq, p.seq, "--seq"));
  if (!m.schedule.empty()) {
    if (!run->schedule.empty() && run->schedule != m.schedule) {
      return error("{}: the plan has --schedule {}, the command line {} (leave --schedule out)", path, m.schedule, run->schedule);
    }
    run->schedule = m.schedule;
    OASES_RETURN_IF_ERROR(adopt(&run->chunks, m.chunks, "--chunks"));
  }
  return Status::ok();
}

Expected<Strategy> strategy_for_plan(const Plan& p, const std::string& path, Graph& g, const StrategyOptions& opt) {
  const MeshPlan& m = p.mesh();
  if (p.version >= 2 && !m.parts.empty()) {
    StrategyOptions so = opt;
    so.vocab_parallel = p.vocab_parallel;
    std::vector<PartLayout> parts = m.parts;
    for (PartLayout& l : parts) l.collective_matmul = l.collective_matmul || p.collective_matmul;
    auto st = apply_part_layouts(g, parts, m.ranks, so);
    if (!st) return st.status().with_context(path);
    // the plan's own list of specs must be what the layouts give on this model
    for (const auto& [name, text] : p.parameters) {
      ValueId v = g.find_value(name);
      if (v == kNoId || !g.value(v).is_initializer) return error("{}: the model has no initializer '{}'", path, name);
      auto it = st->specs.find(v);
      std::string mine =
          it != st->specs.end() ? it->second.to_string(&st->mesh) : ShardingSpec::replicated(g.value(v).shape.size()).to_string(&st->mesh);
      if (mine != text) return error("{}: parameter '{}' is {} in the plan but its part's layout gives {}", path, name, text, mine);
    }
    return st;
  }
  Strategy st;
  st.mesh = Mesh::data_tensor(opt.dp, opt.tp);
  st.dp_bucket_bytes = opt.dp_bucket_bytes;
  if (!m.mesh.axes.empty()) {
    Mesh pm{m.mesh.axes, m.mesh.sizes};
    if (!(pm == st.mesh)) {
      return error("{}: the plan is for the mesh {}, this run has {} (give matching --tp/--dp or ranks)", path, pm.to_string(),
                   st.mesh.to_string());
    }
  }
  if (p.parameters.empty()) return error("{}: the plan has no \"parameters\"", path);
  for (const auto& [name, text] : p.parameters) {
    ValueId v = g.find_value(name);
    if (v == kNoId || !g.value(v).is_initializer) return error("{}: the model has no initializer '{}'", path, name);
    auto sp = parse_spec(text, st.mesh);
    if (!sp) return sp.status().with_context(path);
    Status ok = sp->validate(g.value(v).shape, st.mesh);
    if (!ok.is_ok()) return error("{}: '{}' {}: {}", path, name, shape_str(g.value(v).shape), ok.message());
    if (!sp->is_replicated()) st.specs[v] = *sp;
  }
  st.layers.push_back(LayerSplit{"from " + path, "plan", {}});
  return st;
}

}  // namespace oases
