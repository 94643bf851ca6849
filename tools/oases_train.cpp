// oases-train MODEL [--data F | --inputs DIR | --synthetic] [--steps N] [--batch B --seq T]
//   [--optimizer sgd|adamw --lr ...] [--save CKPT] [--resume CKPT] [--export-onnx OUT.onnx]
//   [--dump-grads DIR] [--log-json FILE] [--tp T --dp D] [--local-ranks N] [--plan plan.json] [-v]
// Trains an imported model on one rank, on N ranks as threads, or under mpirun/srun.
#include <cmath>

#include <CLI/CLI.hpp>

#include "executor/cpu/blas_select.h"
#include "executor/notes.h"
#include "kernels/cpu/parallel.h"
#include "tools/train_driver.h"

namespace oases {

namespace {

// A number in [lo, hi] (lo_open/hi_open: the bound itself excluded), finite: CLI11's own ranges
// accept nan and inf, which would reach the optimizer as a silent garbage schedule.
CLI::Validator number_in(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  std::string range = fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo, hi == HUGE_VAL ? "inf" : fmt::format("{}", hi),
                                  hi_open || hi == HUGE_VAL ? ")" : "]");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return fmt::format("{} is not a number", text);
        bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
        return ok ? std::string() : fmt::format("{} is not in {}", text, range);
      },
      "in " + range);
}

const double kInf = HUGE_VAL;

}  // namespace

void add_train_options(CLI::App& app, TrainArgs& a) {
  app.add_option("model", a.model, "ONNX model file")->required();
  app.add_option("--data", a.data, "Token file: llm.c/nanoGPT uint16 .bin, int32 .i32, or UTF-8 text (bytes)");
  app.add_option(
      "--inputs", a.inputs_dir,
      "Feed the graph inputs from input_N.pb files (ONNX test-data layout; an image classifier's class labels from labels.pb, int64 [B])");
  app.add_flag("--synthetic", a.synthetic,
               "Random tokens (benchmarks); a vision model gets standard normal images and uniform class labels");
  app.add_option("--steps", a.steps, "Optimizer steps (0 with --dump-grads: gradients only)")->check(number_in(0, kInf));
  app.add_option("--batch", a.batch, "Sequences per micro-batch (the global batch under data parallelism)")->check(number_in(1, kInf));
  app.add_option("--seq", a.seq, "Tokens per sequence")->check(number_in(1, kInf));
  app.add_option("--grad-accum", a.grad_accum, "Micro-batches per optimizer step")->check(number_in(1, kInf));
  app.add_option("--optimizer", a.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", a.lr, "Peak learning rate")->check(number_in(0, kInf, true));
  app.add_option("--min-lr", a.min_lr, "Learning rate at the end of the cosine decay (default lr/10)")->check(number_in(0, kInf));
  app.add_option("--warmup", a.warmup, "Steps of linear warm-up")->check(number_in(0, kInf));
  app.add_flag("--no-cosine", a.no_cosine, "Constant learning rate after warm-up");
  app.add_option("--weight-decay", a.weight_decay, "Decoupled weight decay (AdamW) or L2 (SGD)")->check(number_in(0, kInf));
  app.add_flag("--decay-all", a.decay_all, "Also decay rank-1 parameters (biases, norm scales)");
  app.add_option("--momentum", a.momentum, "SGD momentum");
  app.add_flag("--nesterov", a.nesterov, "Nesterov momentum (SGD)");
  app.add_option("--beta1", a.beta1, "AdamW beta1");
  app.add_option("--beta2", a.beta2, "AdamW beta2");
  app.add_option("--eps", a.eps, "AdamW epsilon");
  app.add_option("--clip", a.clip, "Global gradient-norm clip (0: off)")->check(number_in(0, kInf));
  app.add_option("--on-nonfinite", a.on_nonfinite,
                 "stop | skip: a step whose loss or gradient norm is NaN/Inf stops the run (exit 2, nothing saved) or is skipped")
      ->check(CLI::IsMember({"stop", "skip"}));
  app.add_option("--loss", a.loss, "auto | cross_entropy")->check(CLI::IsMember({"auto", "cross_entropy"}));
  app.add_option("--ignore-index", a.ignore_index, "Target id the appended cross-entropy ignores");
  app.add_option("--freeze", a.freeze, "Hold initializers whose names match this regex fixed");
  app.add_option("--train", a.train, "Train initializers whose names match this regex though they look like buffers (--freeze wins)");
  app.add_option("--seed", a.seed, "Seed of batch sampling and dropout");
  app.add_option("--val-every", a.val_every, "Validation loss every N steps (0: only at the end)")->check(number_in(0, kInf));
  app.add_option("--val-batches", a.val_batches, "Batches per validation")->check(number_in(1, kInf));
  app.add_option("--val-fraction", a.val_fraction, "Fraction of the data held out for validation")->check(number_in(0, 1, false, true));
  app.add_option("--save", a.save, "Write a checkpoint to CKPT (at the end, and every --save-every steps)");
  app.add_option("--save-every", a.save_every, "Checkpoint every N steps")->check(number_in(0, kInf));
  app.add_option("--resume", a.resume, "Continue from a checkpoint (also one written with another tp/dp layout)");
  app.add_option("--stop-after", a.stop_after, "Stop (and save) after N steps of this run; --steps still sets the schedule")
      ->check(number_in(0, kInf));
  app.add_option("--export-onnx", a.export_onnx, "Write the model with the trained weights");
  app.add_option("--dump-grads", a.dump_grads, "Write the first step's gradients (one TensorProto per parameter, full tensors)");
  app.add_option("--log-json", a.log_json,
                 "One JSON object per step, after FILE's old lines (grows in FILE.tmp, renamed over FILE when the run ends)");
  app.add_option("--log-every", a.log_every, "Progress line every N steps (default: about 20 lines a run)")->check(number_in(0, kInf));
  app.add_option("--threads", a.threads, "Threads for BLAS and kernels per rank (0: the cores shared among ranks)")
      ->check(number_in(0, kernels::kMaxThreads));
  app.add_flag("-q,--quiet", a.quiet, "No progress lines");
  app.add_flag("-v,--verbose", a.verbose, "Notes on stderr: which kernel paths ran and why others were not taken (once each)");
  app.add_flag("--profile", a.profile, "Print the time per op type and the slowest nodes per step (rank 0, steps after the first)");
  app.add_option("--profile-nodes", a.profile_nodes, "With --profile: how many of the slowest nodes to list (default 15)")->check(number_in(0, kInf));
  app.add_option("--tp", a.tp, "Tensor-parallel degree")->check(number_in(1, kInf));
  app.add_option("--dp", a.dp, "Data-parallel degree")->check(number_in(1, kInf));
  app.add_option("--pp", a.pp, "Pipeline stages, each on its own mesh of tp x dp ranks (the world is pp x tp x dp)")
      ->check(number_in(1, kInf));
  app.add_option("--micro-batches", a.micro_batches, "Micro-batches per step flowing through the pipeline stages (default: --pp)")
      ->check(number_in(1, kInf));
  app.add_option("--stages", a.stages, "Blocks of each stage, e.g. 0-5,6-11 (default: balanced); stage 0 also holds the embedding, "
                                       "the last the head and loss; with --virtual-stages V, pp x V ranges in model order");
  app.add_option("--virtual-stages", a.virtual_stages,
                 "Interleaved 1F1B: each stage holds V block ranges (model stage c on stage c mod pp), the bubble 1/V of 1F1B's "
                 "for V times the transfers; --micro-batches a multiple of --pp")
      ->check(number_in(1, kInf));
  app.add_option("--stage-meshes", a.stage_meshes,
                 "Each stage its own mesh, TPxDP[:SCHEDULE] per stage, e.g. 2x1,1x2:oases (the world is the sum; "
                 "the chunks are --chunks on every stage)");
  app.add_option("--pipeline", a.pipeline,
                 "gpipe | 1f1b | eager-1f1b | zb-h1: the order of micro-batch forwards and backwards per stage (zb-h1: each "
                 "backward split into the input gradient, sent on at once, and the weight gradients after it)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "eager-1f1b", "zb-h1"}));
  app.add_option("--hosts", a.hosts,
                 "Emulate N hosts (the ranks spread over them in order): --emulate-link is then the link between hosts only, "
                 "groups and transfers inside a host run at the machine's speed")
      ->check(number_in(1, kInf));
  app.add_option("--local-ranks", a.local_ranks, "Run N ranks as threads of this process")->check(number_in(1, kInf));
  app.add_flag("--no-vocab-parallel", a.no_vocab_parallel, "Replicate the embedding and LM head instead of splitting the vocabulary");
  app.add_flag("--sequence-parallel", a.sequence_parallel, "Split norms and residuals over the sequence (reduce-scatter + all-gather)");
  app.add_flag("--collective-matmul", a.collective_matmul,
               "With --sequence-parallel: decompose each all-gather before column-parallel products and each reduce-scatter after "
               "row-parallel ones into tp ring steps, each step's transfer overlapping the product of the part already here");
  app.add_option("--dp-bucket-mb", a.dp_bucket_mb, "MiB of gradients per data-parallel all-reduce (0: one all-reduce per gradient)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--zero", a.zero,
                 "1: the distributed optimizer (ZeRO stage 1): optimizer state sharded over the data-parallel group, gradients "
                 "reduce-scattered, updated parameters all-gathered; 0: replicated (default: the plan's, else 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1}));
  app.add_option("--export-plan", a.export_plan, "Write the partitioned plan as JSON");
  app.add_option("--plan", a.plan, "Run this plan (oases-plan output, or specs per initializer)");
  app.add_option("--comm-timeout", a.comm_timeout, "Seconds a collective waits for its peers before the run stops (a hung rank)")
      ->check(number_in(0, kMaxCommTimeoutS, true))
      ->capture_default_str();
  app.add_option("--chunks", a.chunks, "Micro-batch chunks per batch (default 2 with --schedule, else 1)")->check(number_in(1, kInf));
  app.add_option("--schedule", a.schedule, "plain | default_checkpoint | optim_comm_checkpoint | overlap_checkpoint | oases")
      ->check(CLI::IsMember({"plain", "default_checkpoint", "optim_comm_checkpoint", "overlap_checkpoint", "oases"}));
  app.add_option("--emulate-link", a.emulate_link, "Delay collectives as a link of bw=GBPS,latency=US would (ring algorithm)");
  app.add_option("--trace", a.trace, "Write a Chrome trace (Perfetto) of the first --trace-steps steps after the first");
  app.add_option("--trace-steps", a.trace_steps, "Steps in the trace")->check(number_in(1, kInf));
  app.add_flag("--overlap-report", a.overlap_report, "Print total, hidden and exposed communication time per step and per block");
  app.add_flag("--memory-report", a.memory_report, "Print the bytes of activations each block keeps for the backward pass");
  app.add_option("--device", a.device, "cpu | cuda (the GPU backend: docs/GPU.md)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", a.dtype,
                 "fp32 | bf16 | fp16: compute type; parameters and optimizer state stay fp32, fp16 adds dynamic loss scaling "
                 "(default: a --plan file's, else fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  a.bind.add_to(app);
}

}  // namespace oases

using namespace oases;

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    TrainArgs a;
    CLI::App app{"oases-train: train an ONNX transformer on one or many ranks"};
    add_train_options(app, a);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    set_verbose_notes(a.verbose);
    return run_training(a, argc, argv);
  });
}
