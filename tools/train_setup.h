// oases-train's preparation, the same on every rank and done once per process: the command line
// and the plan file made into one Plan, the model loaded at the run's shapes, the global program
// (planner/rank_program.h), the data and how it feeds the model's inputs, the optimizer settings.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/data.h"
#include "executor/distributed.h"
#include "executor/optimizer.h"
#include "executor/training.h"
#include "planner/pipeline_program.h"
#include "planner/rank_program.h"
#include "tools/train_driver.h"

namespace oases {

struct TrainSetup {
  TrainArgs a;       // with what the plan fixed filled in
  // What the run trains: the plan (the plan file and the command line together; under --pp its
  // stages, each one's blocks and ranks fixed, and the micro-batches), every stage's program (one
  // mesh: `first` alone; gp() is then the first stage's, chunked into M x K chunks) and the machine
  // the transfers between stages are planned for (planner/pipeline_program.h).
  StageGlobals programs;
  GlobalProgram& gp() { return programs.first; }
  const GlobalProgram& gp() const { return programs.first; }
  const Plan& plan() const { return programs.plan; }
  const GlobalProgram& stage_program(int stage) const { return programs.program(stage); }
  int64_t batch = 0, seq = 0, vocab = 0;
  std::map<std::string, Tensor> fixed_feeds;  // --inputs DIR
  std::optional<Tensor> class_labels;         // --inputs DIR/labels.pb: an image classifier's targets [B]
  std::vector<InputRole> roles;
  TokenData data;
  int64_t split = 0;  // tokens before it train, after it validate
  bool have_val = false;
  OptimizerConfig oc;
  std::string fingerprint;  // names, dtypes and shapes of the trainable parameters
  uint64_t model_hash = 0;  // every rank must run the same model, layout and binary
  bool piped() const { return plan().num_stages() > 1; }
  // "tp 2 x dp 1" where every stage has the first's mesh, else "meshes 2x1,1x2:oases"
  std::string meshes_text() const;
  std::vector<int> host_of;  // --hosts N: the emulated host of each world rank (empty: one machine)
};

Expected<TrainSetup> prepare_training(const TrainArgs& args, int64_t world);

// This rank's program (planner/rank_program.h) bound to the executor in a Trainer; the device
// communicator and groups of a GPU run are kept in `device_comms`, the schedule run in `sched`. Prints the schedule
// (OASES_DUMP_SCHEDULE) and the memory report on rank 0.
// Under --pp, `rt` is the rank's stage runtime and `stage` receives what its program holds.
Expected<std::unique_ptr<Trainer>> make_trainer(const TrainSetup& s, RankRuntime& rt, DeviceComms* device_comms,
                                                std::optional<ScheduleOptions>* sched, StageProgramInfo* stage = nullptr);

}  // namespace oases
