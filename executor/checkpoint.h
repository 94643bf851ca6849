// Checkpoints: one file with the full (gathered) parameters, the optimizer state and the data
// sampler's position, readable by a run with any other tp x dp layout.
//
// File layout (version 2): 8 bytes magic "OASESCK2", a little-endian uint64 header length L, the
// little-endian CRC-32C of those 8 length bytes and the header, the header (JSON: format
// "oases-checkpoint", version 2, fingerprint, step, optimizer {kind, t}, sampler_state, seed,
// extra, and per tensor {name, dtype, onnx_type, shape, offset, bytes, crc32c}), then the tensors'
// raw bytes end to end in table order, each at 20 + L + its offset. A tensor's crc32c covers its
// name, dtype, shape, offset and byte count (tensor_metadata in checkpoint.cpp) and then its bytes.
//
// Loading proves the file whole before anything is used: both checksums, every header field
// (types, step and optimizer step >= 0, known dtypes, sizes that match the shapes, offsets end to
// end inside the file, no trailing bytes, finite float32 values); each failure is one line naming
// the file and the field or tensor. Version 1 files ("OASESCK1", no checksums, written before
// checksums existed) still load, with every other check, and Checkpoint::warning set: refusing
// them would strand runs whose only state they are, and the warning says how to upgrade.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/sharding.h"
#include "graph/status.h"
#include "graph/tensor.h"

namespace oases {

class RankRuntime;  // executor/distributed.h
class Trainer;      // executor/training.h

struct Checkpoint {
  std::string fingerprint;
  int64_t step = 0;
  int64_t optimizer_t = 0;
  std::string optimizer_kind;
  std::string sampler_state;
  uint64_t seed = 0;
  std::map<std::string, Tensor> tensors;  // parameters by name, optimizer state by "<name>.m" etc.
  std::string extra_json = "{}";          // free-form (command line, losses so far)
  std::string warning;                    // set by load_checkpoint for an unverifiable (version 1) file
};

// Written to PATH.tmp, flushed, fsync'ed and renamed over PATH: a crash never leaves half a file.
// Refused (PATH untouched) when a float32 tensor holds NaN or Inf.
Status save_checkpoint(const Checkpoint& c, const std::string& path);
Expected<Checkpoint> load_checkpoint(const std::string& path);

// Pipeline runs save per stage: stage s's tensors in PATH.stage<s>-of-<S> (a checkpoint of the
// layout above, written by the stage), and PATH a manifest naming them (8 bytes "OASESPP1", a
// newline, JSON {format "oases-pipeline-checkpoint", version, stages, step, fingerprint, save_id, files}),
// written last. load_checkpoint(PATH) merges the stage files (each checked whole, of the manifest's
// step and model, no tensor twice), so any layout resumes from it.
std::string stage_checkpoint_path(const std::string& path, int stage, int stages);
// `save_id` is in each stage file's extra JSON ("pipeline_save", "stage") too.
Status save_stage_manifest(const std::string& path, int stages, int64_t step, const std::string& fingerprint, int64_t save_id);

// The optimizer state a checkpoint keeps per parameter, by suffix of the parameter's name.
inline constexpr const char* kOptimizerStateSuffixes[] = {".m", ".v", ".momentum"};

// Every rank's full parameters (and, with `with_optimizer`, the optimizer state) by name, gathered
// from the shards `specs` (per trainable parameter of the trainer) over the run's ranks
// (collective: every rank calls).
std::map<std::string, Tensor> gather_training_state(Trainer& tr, RankRuntime& rt, const std::vector<ShardingSpec>& specs,
                                                    const std::vector<Shape>& shapes, bool with_optimizer);
// Sets this rank's shards of the parameters and the optimizer state from a checkpoint (written
// with any layout). Every parameter must be there with the model's shape and dtype, and with all
// of its optimizer state (adamw: .m and .v, sgd: .momentum) of the same shape; otherwise an error
// naming `path` and the tensor, and nothing is changed.
Status restore_training_state(const Checkpoint& ck, const std::string& path, Trainer& tr, RankRuntime& rt,
                              const std::vector<ShardingSpec>& specs, const std::vector<Shape>& shapes);

}  // namespace oases
