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
// Backwards run in micro-batch order on every stage; a stage sends an activation right after the
// forward that makes it and a gradient right after the backward that makes it.
#pragma once

#include <string>
#include <vector>

#include "graph/status.h"

namespace oases {

// --- stages: contiguous block ranges -----------------------------------------------------------

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

enum class PipelineSchedule { kGPipe, k1F1B, kEager1F1B };
const char* pipeline_name(PipelineSchedule p);
Expected<PipelineSchedule> parse_pipeline(const std::string& text);  // gpipe | 1f1b | eager-1f1b

struct PipeStep {
  bool forward = true;
  int micro = 0;
  bool operator==(const PipeStep& o) const { return forward == o.forward && micro == o.micro; }
};

int warmup_forwards(PipelineSchedule p, int stage, int stages, int micro_batches);
// The steps of one stage, in order.
std::vector<PipeStep> stage_steps(PipelineSchedule p, int stage, int stages, int micro_batches);
// The most micro-batches whose forward has run and backward has not, over the stage's steps.
int peak_in_flight(const std::vector<PipeStep>& steps);

struct PipelineTimes {
  std::vector<double> forward_s, backward_s;  // per stage, one micro-batch
  std::vector<double> transfer_s;             // per boundary s → s+1 (activation; its gradient the same)
  // A boundary's link carries one transfer at a time in both directions together (the emulated
  // hosts' network cards: one token per card); false: each direction its own lane (real links).
  bool half_duplex = false;
};

struct PipelineEvent {
  int stage = 0;
  bool forward = true;
  int micro = 0;
  bool transfer = false;  // a transfer on boundary `stage` → stage + 1 (forward) or back (backward)
  double start_s = 0, end_s = 0;
};

struct PipelineSim {
  double step_s = 0;                // the last backward's end
  double bubble = 0;                // 1 − (busiest stage's compute) / step
  std::vector<int> peak_in_flight;  // per stage
  std::vector<PipelineEvent> events;
};

// Each stage runs its steps in order on one compute resource; a forward waits for its activation
// to arrive, a backward for its gradient (the last stage: for its own forward); each boundary's
// link carries one transfer at a time in each direction, starting when its producer ends.
Expected<PipelineSim> simulate_pipeline(PipelineSchedule p, int micro_batches, const PipelineTimes& t);

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
Status check_pipeline_order(PipelineSchedule p, int stages, int micro_batches, const PipelineTimes& t = {});

}  // namespace oases
