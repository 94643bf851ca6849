#include "executor/data.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace oases {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kLlmcMagic = 20240520;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Expected<TokenData> load_tokens(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return error("{}: is a folder, not a data file (a token file: .bin, .i32 or text)", path);
  if (!fs::exists(path, ec)) return error("{}: no such data file", path);
  if (!fs::is_regular_file(path, ec)) return error("{}: not a regular file (a token file: .bin, .i32 or text)", path);
  uint64_t size = fs::file_size(path, ec);
  if (size > (uint64_t{16} << 30)) return error("{}: {} bytes is over the 16 GiB limit of the loader", path, size);
  std::ifstream in(path, std::ios::binary);
  if (!in) return error("{}: cannot open for reading", path);
  std::vector<char> bytes(static_cast<size_t>(size));
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(in.gcount()) != size) return error("{}: short read", path);
  TokenData d;
  d.path = path;
  int32_t header[3] = {0, 0, 0};
  if (size >= 1024) std::memcpy(header, bytes.data(), sizeof(header));
  if (ends_with(path, ".bin") && header[0] == kLlmcMagic) {
    if (header[1] != 1 && header[1] != 2) return error("{}: llm.c token file of unknown version {}", path, header[1]);
    uint64_t n = static_cast<uint32_t>(header[2]);
    if (1024 + 2 * n > size) return error("{}: header says {} tokens but the file holds {}", path, n, (size - 1024) / 2);
    d.format = "llm.c";
    d.tokens.resize(n);
    const uint16_t* p = reinterpret_cast<const uint16_t*>(bytes.data() + 1024);
    for (uint64_t i = 0; i < n; ++i) d.tokens[i] = p[i];
  } else if (ends_with(path, ".bin")) {
    if (size % 2) return error("{}: a uint16 token file must have an even size, it has {} bytes", path, size);
    d.format = "nanogpt";
    d.tokens.resize(size / 2);
    const uint16_t* p = reinterpret_cast<const uint16_t*>(bytes.data());
    for (size_t i = 0; i < d.tokens.size(); ++i) d.tokens[i] = p[i];
  } else if (ends_with(path, ".i32")) {
    if (size % 4) return error("{}: an int32 token file must have a size divisible by 4, it has {} bytes", path, size);
    d.format = "int32";
    d.tokens.resize(size / 4);
    std::memcpy(d.tokens.data(), bytes.data(), size);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      if (d.tokens[i] < 0) return error("{}: negative token id {} at position {}", path, d.tokens[i], i);
    }
  } else {
    d.format = "bytes";
    d.tokens.resize(size);
    for (size_t i = 0; i < size; ++i) d.tokens[i] = static_cast<uint8_t>(bytes[i]);
    d.vocab_hint = 256;
  }
  if (d.vocab_hint == 0) {
    int32_t mx = 0;
    for (int32_t t : d.tokens) mx = std::max(mx, t);
    d.vocab_hint = static_cast<int64_t>(mx) + 1;
  }
  return d;
}

TokenData synthetic_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  TokenData d;
  d.format = "synthetic";
  d.vocab_hint = vocab;
  d.tokens.resize(static_cast<size_t>(n));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  for (auto& t : d.tokens) t = u(rng);
  return d;
}

Status check_vocab(const TokenData& d, int64_t vocab) {
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    if (d.tokens[i] >= vocab) {
      return error("{}: token id {} at position {} is not below the model's vocabulary size {}", d.path.empty() ? d.format : d.path,
                   d.tokens[i], i, vocab);
    }
  }
  return Status::ok();
}

Expected<Batch> BatchSampler::next(int64_t batch, int64_t seq) {
  if (size() < seq + 1) return error("the data has {} tokens in this split, one batch row needs {}", size(), seq + 1);
  Batch b;
  b.batch = batch;
  b.seq = seq;
  b.inputs.resize(static_cast<size_t>(batch * seq));
  b.targets.resize(static_cast<size_t>(batch * seq));
  std::uniform_int_distribution<int64_t> u(begin_, end_ - seq - 1);
  for (int64_t r = 0; r < batch; ++r) {
    int64_t off = u(rng_);
    for (int64_t t = 0; t < seq; ++t) {
      b.inputs[r * seq + t] = (*tokens_)[off + t];
      b.targets[r * seq + t] = (*tokens_)[off + t + 1];
    }
  }
  return b;
}

Batch BatchSampler::at(int64_t index, int64_t batch, int64_t seq) const {
  Batch b;
  b.batch = batch;
  b.seq = seq;
  b.inputs.resize(static_cast<size_t>(batch * seq));
  b.targets.resize(static_cast<size_t>(batch * seq));
  int64_t windows = std::max<int64_t>(1, (size() - 1) / seq);
  for (int64_t r = 0; r < batch; ++r) {
    int64_t w = (index * batch + r) % windows;
    int64_t off = begin_ + w * seq;
    for (int64_t t = 0; t < seq; ++t) {
      b.inputs[r * seq + t] = (*tokens_)[off + t];
      b.targets[r * seq + t] = (*tokens_)[off + t + 1];
    }
  }
  return b;
}

std::string BatchSampler::state() const {
  std::ostringstream o;
  o << rng_;
  return o.str();
}

Status BatchSampler::set_state(const std::string& s) {
  std::istringstream i(s);
  i >> rng_;
  if (!i) return Status::error("the checkpoint's sampler state is unreadable");
  return Status::ok();
}

}  // namespace oases
