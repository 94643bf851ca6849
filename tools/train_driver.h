// oases-train's work, shared by its three ways of running: one rank, N ranks as threads of one
// process (--local-ranks N), or one MPI process per rank (mpirun/srun).
//
// Every rank samples the same global batch (same seed) and feeds its slice, so a parallel run
// sees exactly the batches of the single-rank run. Rank 0 prints progress, writes logs,
// checkpoints (with full, gathered tensors: a run can resume on another layout), gradient dumps
// and the exported model.
#pragma once

#include <string>
#include <vector>

#include "executor/communicator.h"
#include "tools/model_loader.h"

namespace oases {

// Why --zero 1 is refused with --device cuda (the flag, or a plan file's "zero": 1).
inline constexpr const char* kZeroNotOnGpu =
    "--zero 1 (the distributed optimizer) runs on CPU ranks only so far: the GPU trainer keeps whole optimizer state";

struct TrainArgs {
  std::string model, data, inputs_dir, save, resume, export_onnx, dump_grads, log_json, export_plan, plan;
  bool synthetic = false, quiet = false, verbose = false, profile = false;
  int64_t steps = 100, batch = 0, seq = 0, grad_accum = 1, stop_after = 0;
  std::string optimizer = "adamw", loss = "auto", freeze, train;
  std::string on_nonfinite = "stop";  // a step with a non-finite loss or gradient norm: stop | skip
  double lr = 1e-3, min_lr = -1, weight_decay = 0.0, momentum = 0.9, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, clip = 1.0;
  int64_t warmup = 0, ignore_index = -100, val_every = 0, val_batches = 4, save_every = 0, log_every = 0;
  double val_fraction = 0.1;
  uint64_t seed = 1234;
  int threads = 0;
  int64_t profile_nodes = 15;  // --profile's slowest nodes listed
  bool nesterov = false, no_cosine = false, decay_all = false;
  // parallelism
  int64_t tp = 0, dp = 0, local_ranks = 0;
  // pipeline stages (planner/pipeline_program.h): --pp S stages of tp x dp ranks each
  int64_t pp = 1, micro_batches = 0;  // micro_batches 0: S (1 without stages)
  std::string stages;                 // "0-5,6-11": blocks per stage; "": balanced
  std::string pipeline = "1f1b";      // gpipe | 1f1b | eager-1f1b | zb-h1
  int64_t virtual_stages = 1;         // interleaved 1F1B: block ranges per stage (--stages lists S x V)
  std::string stage_meshes;           // "2x1,1x2:oases": each stage's tp x dp[:schedule]; "": --tp/--dp for all
  int64_t hosts = 0;                  // emulated hosts: the ranks spread over N in order (--emulate-link is between them)
  bool no_vocab_parallel = false, sequence_parallel = false;
  bool collective_matmul = false;  // sequence-parallel gathers/scatters as ring steps beside the products
  double dp_bucket_mb = 25;  // data-parallel gradient all-reduce buckets (0: one per gradient)
  int64_t zero = -1;         // --zero: the distributed optimizer's stage (0 or 1); -1: the plan's (0 without one)
  double comm_timeout = kDefaultCommTimeoutS;
  // overlapped schedules
  int64_t chunks = 0;        // 0: 2 with --schedule, else 1
  std::string schedule;      // plain | default_checkpoint | optim_comm_checkpoint | overlap_checkpoint | oases
  std::string emulate_link;  // bw=GBPS,latency=US
  std::string trace;         // Chrome trace JSON
  int64_t trace_steps = 3;
  bool overlap_report = false, memory_report = false;
  // GPU backend and mixed precision (docs/GPU.md)
  std::string device = "cpu";  // cpu | cuda
  std::string dtype;  // fp32 | bf16 | fp16; "": the plan file's (--plan), else fp32
  BindingFlags bind;
};

void add_train_options(CLI::App& app, TrainArgs& a);
// Runs the whole job; returns the process exit code (0, or 2 after printing `error: …`).
int run_training(TrainArgs& a, int argc, char** argv);

}  // namespace oases
