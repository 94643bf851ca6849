// Checkpoints: one file with the full (gathered) parameters, the optimizer state and the data
// sampler's position, readable by a run with any other tp x dp layout.
//
// File layout: 8 bytes magic "OASESCK1", a little-endian uint64 header length, the header (JSON:
// format "oases-checkpoint", version 1, fingerprint, step, optimizer {kind, t}, sampler_state,
// seed, extra, and per tensor {name, dtype, onnx_type, shape, offset, bytes}), then the tensors'
// raw bytes, each at 16 + header length + its offset.
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
};

// Written to PATH.tmp, flushed, fsync'ed and renamed over PATH: a crash never leaves half a file.
// Refused (PATH untouched) when a float32 tensor holds NaN or Inf.
Status save_checkpoint(const Checkpoint& c, const std::string& path);
Expected<Checkpoint> load_checkpoint(const std::string& path);

// The optimizer state a checkpoint keeps per parameter, by suffix of the parameter's name.
inline constexpr const char* kOptimizerStateSuffixes[] = {".m", ".v", ".momentum"};

// Every rank's full parameters (and, with `with_optimizer`, the optimizer state) by name, gathered
// from the shards `specs` (per trainable parameter of the trainer) over the run's ranks
// (collective: every rank calls).
std::map<std::string, Tensor> gather_training_state(Trainer& tr, RankRuntime& rt, const std::vector<ShardingSpec>& specs,
                                                    const std::vector<Shape>& shapes, bool with_optimizer);
// Sets this rank's shards of the parameters and the optimizer state from a checkpoint (written
// with any layout); errors name the checkpoint `path` and a missing parameter.
Status restore_training_state(const Checkpoint& ck, const std::string& path, Trainer& tr, RankRuntime& rt,
                              const std::vector<ShardingSpec>& specs, const std::vector<Shape>& shapes);

}  // namespace oases
