// Pipeline schedules over stages (issue 15 groundwork): the order of forward and backward
// micro-batch steps on each stage for GPipe, 1F1B and eager 1F1B, the cross-stage transfers they
// imply (checked deadlock-free with planner/reshard.h's channel checker), the peak number of
// micro-batches in flight per stage, and a discrete-event simulator of the whole pipeline (stage
// compute, transfers through the links between stages) giving the step time and the bubble.
//
// The rules, for stage s of S (0-based) and M micro-batches:
//   GPipe       all M forwards, then all M backwards: M in flight.
//   1F1B        w = min(M, S - s - 1) warm-up forwards, then one forward and one backward in
//               turn, then the remaining backwards: at most min(M, S - s) in flight.
//   eager 1F1B  w = min(M, 2 (S - s) - 1) warm-up forwards (Zhuang et al. 2023), then as 1F1B:
//               at most min(M, 2 (S - s)) in flight, so every activation is produced a slot
//               before its consumer needs it and its transfer overlaps both stages' compute.
//   ZB-H1       zero-bubble (Qi et al., ICLR 2024): each backward split into B, the input gradient
//               (what the stage before waits for), and W, the weight gradients. The forwards and
//               B's in 1F1B's order; the W's where the stage would wait: in a pipeline of unit
//               steps (F = B = W, transfers free) each stage, when free, runs its next F or B if
//               its input is there, else its oldest pending W, else waits; stage s defers at most
//               s W's past a forward (it runs the oldest first); the W's left run at the end. A
//               micro-batch is held from its forward to its W: at most min(M, S) on every stage,
//               1F1B's first-stage peak. The gradient leaves after B alone, crossing the stages
//               at B's pace, and the W's fill the waits: with F = B = W and free transfers the
//               bubble is (S - 1) F, a third of 1F1B's (S - 1)(F + 2 W) (Qi et al.'s ZB-H1).
// Backwards run in micro-batch order on every stage; a stage sends an activation right after the
// forward that makes it and a gradient right after the backward that makes it.
//
// Virtual stages (interleaved 1F1B, Narayanan et al. 2021): with V > 1 the model is cut into
// C = S·V block ranges ("model stages"), and pipeline rank s holds model stages s, s + S, …,
// s + (V − 1)·S (its chunks 0 … V − 1): an activation goes round the ranks V times. Each step is
// one chunk of one micro-batch. With k counting a rank's forwards (and, apart, its backwards),
// forward k runs chunk (k / S) mod V of micro-batch (k / (S·V))·S + k mod S, backward k the same
// micro-batch of chunk V − 1 − (k / S) mod V: S micro-batches through one chunk, then through the
// next. Rank s runs w = min(M·V, 2 (S − s − 1) + (V − 1)·S) warm-up forwards, then one forward
// and one backward in turn, then the remaining backwards: at most min(M·V, w + 1) chunk steps in
// flight (each holds about 1/V of a micro-batch's activations on the rank). M must be a multiple
// of S; 1F1B only. The bubble shrinks to (S − 1)/(V·M) of the step, for V times the transfers.
#pragma once

#include <string>
#include <vector>

#include "graph/status.h"

namespace oases {

// --- stages: contiguous block ranges -----------------------------------------------------------
// (with virtual stages, each of the C = S·V model stages is one range, model stage c on pipeline
// rank c mod S)

// Blocks first … last (inclusive) of a stage; stage 0 also holds the embeddings, the last stage the
// final norm, the head and the loss.
struct StageCut {
  int first = 0, last = 0;
  int blocks() const { return last - first + 1; }
};
// `stages` contiguous ranges over `blocks` blocks: from `spec` ("0-5,6-11", every block once, in
// order) or, when it is empty, balanced so the costliest stage is as cheap as it can be (`cost`
// per block; empty: every block costs the same). Errors (one line): fewer blocks than stages, an
// empty or reversed range, a gap or overlap, a count of ranges other than `stages`.
Expected<std::vector<StageCut>> cut_stages(int blocks, int stages, const std::string& spec = "", const std::vector<double>& cost = {});
std::string stages_string(const std::vector<StageCut>& cuts);  // "0-5,6-11"
// The global batch splits into dp × M micro-batches of K chunks each: an error names the numbers
// when it does not.
Status check_pipeline_batch(int64_t batch, int64_t dp, int64_t micro_batches, int64_t chunks);

enum class PipelineSchedule { kGPipe, k1F1B, kEager1F1B, kZBH1 };
const char* pipeline_name(PipelineSchedule p);
Expected<PipelineSchedule> parse_pipeline(const std::string& text);  // gpipe | 1f1b | eager-1f1b | zb-h1
// Whether the schedule splits each backward into B (input gradient) and W (weight gradients).
bool splits_backward(PipelineSchedule p);

struct PipeStep {
  bool forward = true;
  int micro = 0;
  bool weight = false;  // a W step (forward false): the weight gradients of `micro` (splits_backward)
  int chunk = 0;        // virtual stages: which of the rank's model stages (stage + chunk·S)
  bool operator==(const PipeStep& o) const { return forward == o.forward && micro == o.micro && weight == o.weight && chunk == o.chunk; }
  // 0 forward, 1 backward (B), 2 weight gradients (W)
  int kind() const { return forward ? 0 : weight ? 2 : 1; }
};

// Whether `virtual_stages` V can run: V ≥ 1; V > 1 needs 1F1B, at least two stages and
// micro-batches a multiple of the stages; `blocks` (≥ 0: the model's) at least S·V. One line
// naming the numbers.
Status check_virtual_stages(PipelineSchedule p, int stages, int micro_batches, int virtual_stages, int blocks = -1);
int warmup_forwards(PipelineSchedule p, int stage, int stages, int micro_batches, int virtual_stages = 1);
// The steps of one stage (pipeline rank), in order; V > 1: interleaved, as above (empty where
// check_virtual_stages refuses).
std::vector<PipeStep> stage_steps(PipelineSchedule p, int stage, int stages, int micro_batches, int virtual_stages = 1);
// The most micro-batches whose forward has run and backward has not (with W steps: whose W has
// not), over the stage's steps; with virtual stages, chunk steps (a chunk of a micro-batch).
int peak_in_flight(const std::vector<PipeStep>& steps);
// After each step: the micro-batches whose forward has run and backward (B) has not, and (with W
// steps) those whose B has run and W has not: what they hold differs (all their saved
// activations; only what their weight gradients read). Chunk steps with virtual stages.
struct InFlight {
  int kind = 0;   // of the step (PipeStep::kind: 0 F, 1 B, 2 W)
  int chunk = 0;  // of the step
  int forward_backward = 0, backward_weight = 0;
  // the same for the step's chunk (virtual stage) alone: a step changes only its own chunk's
  int chunk_forward_backward = 0, chunk_backward_weight = 0;
};
std::vector<InFlight> in_flight_profile(const std::vector<PipeStep>& steps);

struct PipelineTimes {
  // Per model stage (S·V of them), one micro-batch; with V = 1 the model stages are the stages.
  std::vector<double> forward_s, backward_s;
  std::vector<double> transfer_s;  // per boundary c → c+1 of model stages (activation; its gradient the same)
  // A boundary's link carries one transfer at a time in both directions together (the emulated
  // hosts' network cards: one token per card); false: each direction its own lane (real links).
  bool half_duplex = false;
  // per stage, a W step's time when the schedule splits the backward (backward_s is then B's): the
  // pipeline search's from the weight-gradient nodes' time, a replay's as the programs ran them;
  // empty: the backward is split evenly (kWeightShare), as simulate_pipeline does for zb-h1
  std::vector<double> weight_s = {};
  // Every stage's ranks on one machine's cores (CPU thread ranks: ClusterSpec::cores_per_node with
  // all ranks on them): the times above are the steps' while every stage computes
  // (ClusterSpec::compute_slowdown); a stage that computes while others wait gets more of the cores
  // (processor sharing: max(1, busy threads / cores)). 0: no sharing (a device each).
  double shared_cores = 0;
  double stage_threads = 0;  // the busy threads one computing stage puts on them (its ranks x threads)
  // per model stage, of forward_s and backward_s, what its ranks wait on the link (exposed
  // collectives): wall time that more free cores do not shorten (empty: none)
  std::vector<double> forward_link_s = {}, backward_link_s = {};
};

struct ClusterSpec;
// `t` with the cluster's core sharing (PipelineTimes::shared_cores) when all `stages` x
// `stage_ranks` ranks share one machine's cores; unchanged otherwise.
PipelineTimes share_cores(PipelineTimes t, const ClusterSpec& cluster, int stages, int64_t stage_ranks);

struct PipelineEvent {
  int stage = 0;  // the model stage (compute) or boundary (transfer); its rank: stage mod S
  bool forward = true;
  int micro = 0;
  bool weight = false;  // a W step
  bool transfer = false;  // a transfer on boundary `stage` → stage + 1 (forward) or back (backward)
  double start_s = 0, end_s = 0;
  double issue_s = 0;  // a transfer: when its producer ended (it starts when its link is free too)
};

struct PipelineSim {
  double step_s = 0;                // the last backward's end
  double bubble = 0;                // 1 − (busiest stage's compute) / step
  std::vector<int> peak_in_flight;  // per stage
  std::vector<PipelineEvent> events;
};

// The share of a backward that is weight gradients when nothing says (a transformer block's weight
// products are about half of its products' backward work; attention's and the norms' backward are
// input gradients, so measured shares are lower: 0.3 to 0.4 for a GPT block).
inline constexpr double kWeightShare = 0.5;
// `t` with its backward split into B and W (weight_s) for a schedule that splits it, when not split yet.
PipelineTimes split_backward(PipelineSchedule p, PipelineTimes t, double weight_share = kWeightShare);

// Each stage (pipeline rank) runs its steps in order on one compute resource; a forward waits for
// its activation to arrive, a backward for its gradient (the last model stage: for its own
// forward), a W for nothing (its B ran before it); the link from one rank to another carries one
// transfer at a time (each direction its own lane unless half_duplex), starting when its producer
// ends. `t` has S·`virtual_stages` model stages; peak_in_flight and the bubble are per rank. With
// shared cores (PipelineTimes::shared_cores) the stages that compute at once share them: each
// step's work progresses at 1 / max(1, busy stages x stage_threads / cores) of a core a thread.
Expected<PipelineSim> simulate_pipeline(PipelineSchedule p, int micro_batches, const PipelineTimes& t, int virtual_stages = 1);

// One transfer across a stage boundary: an activation (forward) from `boundary` to boundary + 1,
// or its gradient back.
struct PipeTransfer {
  int boundary = 0;
  bool forward = true;
  int micro = 0;
  double issue_s = 0;  // when its producer ends (simulated)
};
// The one global order of all cross-stage transfers, forward and backward traffic interleaved: by
// the time each is issued in the simulated pipeline (ties: boundary, direction, micro-batch).
std::vector<PipeTransfer> pipeline_transfer_order(const PipelineSim& sim);

// Every stage's program as the channel checker sees it, on one channel per rank: a send started
// right after the step that makes it, a receive started (in the global order) no later than the
// step that reads it, each rank's channel ops a subsequence of the global order; replayed by
// check_channel_programs. `t` empty: unit times (forward 1, backward 2, transfers 0.5).
Status check_pipeline_order(PipelineSchedule p, int stages, int micro_batches, const PipelineTimes& t = {}, int virtual_stages = 1);

}  // namespace oases
