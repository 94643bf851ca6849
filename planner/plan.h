// Plans for people and programs: the partitioned training graph as versioned JSON (every value's
// spec and local shape, every op's layout, every inserted collective with its bytes per step,
// per-rank parameter memory), and reading a plan (or a plain map of initializer -> spec) back into
// a Strategy for `oases-train --plan`.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "graph/mesh.h"
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
// Version 3: a "pipeline" object of S stages sharing one layout (stages, micro-batches, block cuts,
// schedule, optionally each stage's tp x dp and schedule as "meshes"). Read, no longer written.
constexpr int kPlanVersionPipeline = 3;
// Version 4: the plan is a list of stages ("pipeline": {"schedule", "micro_batches", "stages":
// [one object per stage: its blocks, tp x dp or ranks, schedule and chunks]}), the top-level mesh,
// schedule and parts being the first stage's. Readers take 1 to 4; a plan of one stage is written
// as version 1 or 2.
constexpr int kPlanVersionStages = 4;

// The most a plan may give: ranks of a mesh or of one of its axes, tp and dp degrees, pipeline
// stages; micro-batch chunks and pipeline micro-batches; sequences per batch and tokens per
// sequence. A file asking for more is refused as it is read. The ranks' bound is every mesh's
// (graph/mesh.h check_mesh_ranks).
constexpr int64_t kMaxPlanRanks = kMaxMeshRanks;
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
  std::string blocks;                       // a pipeline stage's transformer blocks "FIRST-LAST" ("": cut evenly)

  // 2 with a schedule, else 1, unless fixed.
  int64_t chunk_count() const { return chunks > 0 ? chunks : (schedule.empty() ? 1 : 2); }
  // The recomputation this mesh runs: the field, else the schedule's (none without a schedule).
  CheckpointMode recompute_mode() const;
  bool operator==(const MeshPlan& o) const;
};

// A parallel training plan, independent of any graph: a list of stages, each a range of the
// model's blocks on its own mesh of ranks with its layouts, schedule and chunks (one mesh is one
// stage; the world's ranks are the stages' meshes one after another), the pipeline schedule and
// micro-batches when there are several, the compute type, and optional per-parameter spec
// overrides by initializer name (for the first stage's mesh). Strategy (planner/
// strategy.h) is what a Plan becomes on one graph (ValueIds -> specs): strategy_for_plan below.
// Plan files are JSON (version 1: one tp x dp mesh and "parameters"; version 2 adds "parts",
// "batch", "seq", "schedule"; version 3 a "pipeline" of counts and cuts; version 4 the stages
// listed); a Plan's own keys are a subset of what oases-plan writes.
struct Plan {
  int version = kPlanVersion;  // what the file it came from said (to_json writes 1, 2 or 4)
  // Never empty. A later stage runs the first stage's layouts where its tp x dp and schedule are
  // the first's, else Megatron's split on its mesh (stage_on).
  std::vector<MeshPlan> stages = std::vector<MeshPlan>(1);
  std::string pipeline = "1f1b";  // with several stages: gpipe | 1f1b | eager-1f1b
  int64_t micro_batches = 0;      // with several stages: micro-batches a step (0: as many as stages)
  // Interleaved 1F1B (planner/pipeline.h): each stage holds this many block ranges, model stage c
  // on stage c mod S; each stage's "blocks" then lists its V ranges ("0-1,8-9").
  int64_t virtual_stages = 1;
  bool vocab_parallel = true;
  bool sequence_parallel = false;
  // Collective matmuls (planner/collective_matmul.h) in every part (with sequence parallelism);
  // a plan with "parts" may instead ask for them per part.
  bool collective_matmul = false;
  std::string dtype = "fp32";  // compute type: fp32 | bf16 | fp16
  int64_t dp_bucket_bytes = int64_t{25} << 20;
  // The distributed optimizer (ZeRO stage 1): 1 shards the optimizer state over the ranks that
  // sum each gradient (the dp group), gradients reduce-scattered, parameters all-gathered after
  // the update (planner/partition.h shard_gradient_reductions, executor/zero.h); 0: replicated.
  int64_t zero = 0;
  int64_t batch = 0, seq = 0;  // the shapes it was made for; 0: not fixed
  // Spec text per initializer ("[S(tp), R]"): overrides of the layout (a version 1 plan), or, with
  // "parts", what the layouts must give (checked).
  std::map<std::string, std::string> parameters;

  // The first stage's mesh (the only one without a pipeline).
  MeshPlan& mesh() { return stages.front(); }
  const MeshPlan& mesh() const { return stages.front(); }
  int64_t num_stages() const { return static_cast<int64_t>(stages.size()); }
  // The stages' block ranges "0-5,6-11" ("" when the stages do not fix them: cut evenly); with
  // virtual stages, the S·V model stages' in model order (stage c mod S's range c / S).
  std::string cuts() const;
  int64_t model_stages() const { return num_stages() * std::max<int64_t>(virtual_stages, 1); }
  // The world's ranks, the stages' meshes one after another: stage s's ranks (its "ranks", else
  // tp x dp with an open degree counted as 1), their sum, the first of them, and the stage a world
  // rank belongs to (-1 past the world).
  int64_t stage_ranks(int64_t stage) const;
  int64_t world() const;
  int64_t first_rank(int64_t stage) const;
  int stage_of_rank(int64_t world_rank) const;
  // A stage on tp x dp ranks running `schedule` ("": the first stage's): the first stage itself
  // (its layouts, no blocks) where these are its own, else Megatron's split on that mesh with the
  // first stage's chunks. What the plan's later stages are made of.
  MeshPlan stage_on(int64_t tp, int64_t dp, const std::string& schedule) const;
  // The plan file's "pipeline" object (version 4), for several stages.
  nlohmann::json pipeline_json() const;

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
Expected<std::vector<MeshPlan>> parse_stage_meshes(const std::string& text, int64_t stages);
std::string stage_meshes_string(const std::vector<MeshPlan>& meshes);
// "0-5,6-11": `stages` ranges FIRST-LAST, each starting where the one before ended (the model's
// block count is checked when the stages are cut, planner/pipeline.h cut_stages); errors name
// "pipeline.cuts".
Status check_cuts(const std::string& cuts, int64_t stages);
// The ranges of "0-5,6-11" as written ({"0-5", "6-11"}; "" gives none), unchecked.
std::vector<std::string> split_cuts(const std::string& cuts);
// `first`'s mesh as the first of `stages` stages running the pipeline `schedule` with
// `micro_batches`, cut at `cuts` ("0-5,6-11"; "": evenly), the others on `meshes` (empty: the
// first's; else each stage's tp x dp and schedule, Plan::stage_on). What oases-train's --pp,
// --stages and --stage-meshes make; an error names a cuts list of another stage count.
// With `virtual_stages` V > 1, `cuts` lists the S·V model stages and stage s holds ranges s, s + S, ….
Expected<Plan> with_stages(const Plan& first, int64_t stages, int64_t micro_batches, const std::string& schedule, const std::string& cuts,
                           const std::vector<MeshPlan>& meshes, int64_t virtual_stages = 1);
// Stage `stage`'s blocks ("0-1,8-9") of S = `stages` stages from the model stages' ranges in model
// order: ranges stage, stage + S, ….
std::string stage_blocks(const std::vector<std::string>& model_ranges, int64_t stages, int64_t stage);
// Whether two stages run the same program: the same mesh, layouts and schedule (their blocks and
// chunks aside: a pipeline's stages share the first stage's chunks).
bool same_stage_layout(const MeshPlan& a, const MeshPlan& b);

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

}  // namespace oases
