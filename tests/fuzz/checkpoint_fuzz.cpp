// libFuzzer target for the checkpoint loader (executor/checkpoint.h): arbitrary bytes -> a file ->
// load_checkpoint. Any file may be refused; none may crash, hang, leak or allocate without bound,
// and the refusal must be one line naming the file. A file that loads must save and load again
// to the same checkpoint. Not built by default; with clang:
//
//   bash scripts/fuzz.sh 60      # builds build-fuzz (clang, ASan+UBSan) and runs each target 60 s
//
// A mutated version 2 file almost always fails its header checksum, which would keep the fuzzer
// away from the field checks behind it; so each version 2 input is also loaded with its header
// checksum recomputed (the tensors' own checksums stay as they are; version 1 seeds, which have
// none, reach the tensor reads).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "executor/checkpoint.h"
#include "tests/common/checkpoint_tamper.h"

namespace {

std::string scratch_dir() {
  // in memory where the machine has it: every input that loads is saved, and a save fsyncs
  static const std::string dir = [] {
    char tmpl[] = "/dev/shm/oases_ckpt_fuzz_XXXXXX";
    if (mkdtemp(tmpl)) return std::string(tmpl);
    std::strcpy(tmpl, "/tmp/oases_ckpt_fuzz_XXXXXX");
    return std::string(mkdtemp(tmpl) ? tmpl : "/tmp");
  }();
  return dir;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void same_or_die(const oases::Checkpoint& a, const oases::Checkpoint& b) {
  bool same = a.fingerprint == b.fingerprint && a.step == b.step && a.optimizer_t == b.optimizer_t &&
              a.optimizer_kind == b.optimizer_kind && a.sampler_state == b.sampler_state && a.seed == b.seed &&
              a.extra_json == b.extra_json && a.tensors.size() == b.tensors.size();
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    same = same && it != b.tensors.end() && it->second.dtype() == t.dtype() && it->second.shape() == t.shape() &&
           (t.nbytes() == 0 || std::memcmp(it->second.raw(), t.raw(), t.nbytes()) == 0);
  }
  if (!same) {
    std::fprintf(stderr, "a loaded checkpoint did not survive a save and a load\n");
    std::abort();
  }
}

void load(const std::string& bytes) {
  const std::string path = scratch_dir() + "/input.ckpt";
  write_file(path, bytes);
  auto c = oases::load_checkpoint(path);
  if (!c) {
    const std::string& m = c.status().message();
    if (m.find(path) == std::string::npos || m.find('\n') != std::string::npos) {
      std::fprintf(stderr, "the error does not name the file on one line: %s\n", m.c_str());
      std::abort();
    }
    return;
  }
  const std::string again = scratch_dir() + "/again.ckpt";
  oases::Status st = oases::save_checkpoint(*c, again);
  if (!st.is_ok()) {
    std::fprintf(stderr, "a loaded checkpoint cannot be saved: %s\n", st.message().c_str());
    std::abort();
  }
  auto back = oases::load_checkpoint(again);
  if (!back) {
    std::fprintf(stderr, "a saved checkpoint does not load: %s\n", back.status().message().c_str());
    std::abort();
  }
  same_or_die(*c, *back);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // under libFuzzer's -malloc_limit_mb (2 GiB in scripts/fuzz.sh): a table asking for a huge
  // tensor must be refused by the loader's own checks first
  static const bool limited = [] {
    oases::set_max_memory_bytes(uint64_t{1} << 30);
    return true;
  }();
  (void)limited;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  load(bytes);
  if (size >= 20 && bytes.compare(0, 8, "OASESCK2") == 0) {
    uint64_t hl = 0;
    std::memcpy(&hl, data + 8, 8);
    if (hl <= size - 20) {
      auto ck = oases::testutil::CheckpointBytes::parse(bytes);
      ck.reseal();
      load(ck.bytes());
    }
  }
  return 0;
}
