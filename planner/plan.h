// Plans for people and programs: the partitioned training graph as versioned JSON (every value's
// spec and local shape, every op's layout, every inserted collective with its bytes per step,
// per-rank parameter memory), and reading a plan (or a plain map of initializer -> spec) back into
// a Strategy for `oases-train --plan`.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/partition.h"
#include "planner/propagation.h"
#include "planner/schedule.h"
#include "planner/strategy.h"

namespace oases {

// Version 2 adds per-part layouts ("parts": tp degree and sequence parallelism of the embedding,
// each attention and MLP, and the head), the mesh's compound axes ("mesh.parts"), the shapes and
// schedule the plan was made for ("batch", "seq", "schedule") and the predictions; version 1 files
// (one tp x dp mesh) still read.
constexpr int kPlanVersion = 2;
// A pipeline plan (a "pipeline" object: stages, micro-batches, block cuts, schedule) is version 3;
// readers take 1 to 3.
constexpr int kPlanVersionPipeline = 3;

// The most a plan may give: ranks of a mesh or of one of its axes, tp and dp degrees, pipeline
// stages; micro-batch chunks and pipeline micro-batches; sequences per batch and tokens per
// sequence. A file asking for more is refused as it is read.
constexpr int64_t kMaxPlanRanks = int64_t{1} << 20;
constexpr int64_t kMaxPlanChunks = int64_t{1} << 20;
constexpr int64_t kMaxPlanBatch = int64_t{1} << 24;
constexpr int64_t kMaxPlanSeq = int64_t{1} << 24;

// What one mesh of ranks runs: its shape, how each part of the model is laid out on it, and the
// schedule. A pipeline plan (Plan::pipeline) runs it on every stage, each stage over its own ranks,
// unless a stage has its own tp x dp and schedule (Plan::Pipeline::meshes).
struct MeshPlan {
  int64_t ranks = 0;                        // ranks of the mesh; 0: the plan does not say (the run's world)
  int64_t tp = 0, dp = 0;                   // one tp x dp grid for every part; 0: not fixed, or the parts differ
  Mesh mesh;                                // the mesh a plan file names (empty: derived from tp x dp or the parts)
  std::vector<PartLayout> parts;            // per-part layouts in chain order (empty: one tp x dp split)
  std::string schedule;                     // planner/schedule.h names; "": in line (no schedule)
  int64_t chunks = 0;                       // micro-batch chunks; 0: the schedule's default
  std::optional<CheckpointMode> recompute;  // unset: what the schedule implies

  // 2 with a schedule, else 1, unless fixed.
  int64_t chunk_count() const { return chunks > 0 ? chunks : (schedule.empty() ? 1 : 2); }
  // The recomputation this mesh runs: the field, else the schedule's (none without a schedule).
  CheckpointMode recompute_mode() const;
  bool operator==(const MeshPlan& o) const;
};

// A parallel training plan, independent of any graph: the mesh and its layouts, the schedule, the
// compute type, and optional per-parameter spec overrides by initializer name. Strategy (planner/
// strategy.h) is what a Plan becomes on one graph (ValueIds -> specs): strategy_for_plan below.
// Plan files are JSON (version 1: one tp x dp mesh and "parameters"; version 2 adds "parts",
// "batch", "seq", "schedule"; version 3 a "pipeline"); a Plan's own keys are a subset of what
// oases-plan writes.
struct Plan {
  int version = kPlanVersion;  // what the file it came from said (to_json writes 1, 2, or 3 with pipeline stages)
  MeshPlan mesh;
  bool vocab_parallel = true;
  bool sequence_parallel = false;
  // Collective matmuls (planner/collective_matmul.h) in every part (with sequence parallelism);
  // a plan with "parts" may instead ask for them per part.
  bool collective_matmul = false;
  std::string dtype = "fp32";  // compute type: fp32 | bf16 | fp16
  int64_t dp_bucket_bytes = int64_t{25} << 20;
  int64_t batch = 0, seq = 0;  // the shapes it was made for; 0: not fixed
  // Spec text per initializer ("[S(tp), R]"): overrides of the layout (a version 1 plan), or, with
  // "parts", what the layouts must give (checked).
  std::map<std::string, std::string> parameters;
  // Pipeline stages (version 3): the mesh above is one stage's; stages > 1 runs S of them.
  struct Pipeline {
    int64_t stages = 1, micro_batches = 0;
    std::string cuts;      // "0-47,48-95"
    std::string schedule;  // gpipe | 1f1b | eager-1f1b
    // Each stage's own mesh ("meshes": [{"tp": 2, "dp": 1, "schedule": "oases"}, ...]); empty: every
    // stage runs the plan's mesh. A stage's schedule "" is the plan's; the chunks are the plan's.
    struct StageMesh {
      int64_t tp = 1, dp = 1;
      std::string schedule;
      bool operator==(const StageMesh& o) const { return tp == o.tp && dp == o.dp && schedule == o.schedule; }
    };
    std::vector<StageMesh> meshes;
    bool operator==(const Pipeline& o) const {
      return stages == o.stages && micro_batches == o.micro_batches && cuts == o.cuts && schedule == o.schedule && meshes == o.meshes;
    }
    nlohmann::json to_json() const;  // the plan file's "pipeline" object
  } pipeline;

  // Megatron's split over one tp x dp mesh.
  static Plan megatron(int64_t tp, int64_t dp);
  // Per-part layouts over `ranks` ranks (the planner's choice).
  static Plan from_parts(std::vector<PartLayout> parts, int64_t ranks, std::string schedule, int64_t chunks);

  // The plan as a whole: degrees and mesh sizes within bounds and consistent with the ranks, parts
  // dividing the ranks, known schedules, recomputation and dtype, chunks (and micro-batches) that
  // split the batch, well-formed stage cuts, stage meshes and parameter specs. 0 is "not fixed"
  // where the fields say so. Messages name the field ("schedule.chunks: ...").
  Status validate() const;
  // Writes no key the reader would refuse (a 0 meaning "not fixed" is left out).
  nlohmann::json to_json() const;
  // Reads a plan file's JSON and validates it before returning: each field's type and range as it
  // is read, then validate(). Any error is one line naming `path` and the field, e.g.
  // "plan.json: schedule.chunks: 0 is not a positive integer" (planner/plan_file.cpp).
  static Expected<Plan> from_json(const nlohmann::json& j, const std::string& path);
  static Expected<Plan> read(const std::string& path);
  bool operator==(const Plan& o) const;
  bool operator!=(const Plan& o) const { return !(*this == o); }
  std::string to_string() const;  // "tp 2 x dp 2, oases x 2 chunks, fp32"
};

// The plan file's names of recomputation modes: none | block | comm_optimized.
const char* recompute_name(CheckpointMode m);
Expected<CheckpointMode> recompute_by_name(const std::string& name);

// "2x1,1x2:oases" (tp x dp[:schedule] per stage, `stages` of them) and back.
Expected<std::vector<Plan::Pipeline::StageMesh>> parse_stage_meshes(const std::string& text, int64_t stages);
std::string stage_meshes_string(const std::vector<Plan::Pipeline::StageMesh>& meshes);

// What a run's command line leaves open, filled from a plan (0 or "" is open).
struct RunShape {
  int64_t tp = 0, dp = 0, batch = 0, seq = 0, chunks = 0;
  std::string schedule;
};
// Fills what `run` leaves open from the plan; errors name a conflict with the command line, or a
// plan for another number of ranks than `world`.
Status adopt_plan(const Plan& p, const std::string& path, int64_t world, RunShape* run);

// The strategy a plan gives on the forward graph `g` (per-part layouts insert their Layout markers
// into `g`, planner/hybrid.h); `opt` carries tp x dp and the options when the plan has no parts.
// Unknown parameter names are errors naming `path`.
Expected<Strategy> strategy_for_plan(const Plan& p, const std::string& path, Graph& g, const StrategyOptions& opt);

nlohmann::json plan_to_json(const Graph& global, const PartitionedGraph& pg, const ShardingResult& sr, const Strategy& s,
                            const std::string& model_path);

// "[S(tp), R]", "[S(tp)/3, R] P(dp)" -> spec over `mesh`; errors name the text. Segments run from
// 1 to 2^20; nothing but P(axis) terms may follow the brackets.
Expected<ShardingSpec> parse_spec(const std::string& text, const Mesh& mesh);

}  // namespace oases
