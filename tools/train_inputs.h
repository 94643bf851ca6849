// oases-train's data: the model inputs' shapes bound from the command line or from --inputs
// files, how the batches feed the inputs, and the tokens with their validation split.
#pragma once

#include "tools/train_setup.h"

namespace oases {

// Binds the token inputs [B, T] (and the batch of image inputs) to --batch/--seq or to what the
// model fixes (8 x 64 when neither does); `batch` and `seq` receive them.
Status bind_token_shapes(const TrainArgs& a, ImportOptions* opts, int64_t* batch, int64_t* seq);
// --inputs DIR: input_N.pb files by name (or position), their shapes bound, into s->fixed_feeds
// (and s->class_labels from labels.pb); the batch and sequence from the first token input.
Status read_input_files(const TrainArgs& a, ImportOptions* opts, TrainSetup* s);
// How the batches feed the inputs, and the tokens (with the validation split), on s.gp()'s graph.
Status prepare_data(TrainSetup& s);

}  // namespace oases
