// Training data: a token stream from a file, split into a training and a held-out part, and a
// seeded sampler of [batch, seq+1] windows (inputs = window[:-1], targets = window[1:]).
//
// File formats (chosen by content, then extension):
//   llm.c .bin     a 256 x int32 header (magic 20240520, version 1 or 2, token count) then uint16 ids
//   nanoGPT .bin   raw little-endian uint16 ids (any other *.bin)
//   *.i32          raw little-endian int32 ids (Oases' format for vocabularies beyond 65535)
//   anything else  UTF-8 text read byte by byte (vocabulary 256)
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "graph/status.h"

namespace oases {

struct TokenData {
  std::vector<int32_t> tokens;
  std::string format;      // "llm.c", "nanogpt", "int32", "bytes", "synthetic"
  int64_t vocab_hint = 0;  // 256 for bytes; max id + 1 otherwise
  std::string path;
};

// Loads a token file; errors name the file.
Expected<TokenData> load_tokens(const std::string& path);
// Random tokens for benchmarks.
TokenData synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed);

struct Batch {
  std::vector<int64_t> inputs;   // [batch, seq]
  std::vector<int64_t> targets;  // [batch, seq]
  int64_t batch = 0, seq = 0;
};

// Samples windows uniformly from tokens[begin, end). The state (engine) is saved in checkpoints so
// that a resumed run draws the same batches.
class BatchSampler {
 public:
  BatchSampler() = default;
  BatchSampler(const std::vector<int32_t>* tokens, int64_t begin, int64_t end, uint64_t seed)
      : tokens_(tokens), begin_(begin), end_(end), rng_(seed) {}
  // Error when the range holds fewer than seq + 1 tokens.
  Expected<Batch> next(int64_t batch, int64_t seq);
  // Deterministic batches covering the range in order (validation); wraps around.
  Batch at(int64_t index, int64_t batch, int64_t seq) const;
  std::string state() const;
  Status set_state(const std::string& s);
  int64_t size() const { return end_ - begin_; }

 private:
  const std::vector<int32_t>* tokens_ = nullptr;
  int64_t begin_ = 0, end_ = 0;
  std::mt19937_64 rng_;
};

// Checks every token id is below `vocab`; the error gives the first offender and its position.
Status check_vocab(const TokenData& d, int64_t vocab);

}  // namespace oases
