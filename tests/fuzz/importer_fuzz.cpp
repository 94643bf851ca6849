// libFuzzer target for the importer: arbitrary bytes -> ModelProto -> Graph -> canonical pipeline
// (which folds constants with the CPU kernels). Any input may be rejected; none may crash, hang,
// leak or allocate without bound. Not built by default. With clang:
//
//   bash scripts/fuzz.sh 300     # builds build-fuzz (clang, ASan+UBSan) and runs 300 s from the seeds
//
// External data resolves against a scratch folder holding one 4 KiB file, w.bin, so the
// confinement and size checks run too. Symbolic dims named batch/seq/N are bound to small sizes.
// With OASES_FUZZ_RUN=1 in the environment, graphs that canonicalise are also run on the CPU
// with zero inputs (when small), which checks that shape rules and kernels agree.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <onnx/onnx_pb.h>

#include "executor/executor.h"
#include "graph/passes/pass.h"
#include "importer/onnx_import.h"

namespace {

std::string scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/oases_fuzz_XXXXXX";
    std::string d = mkdtemp(tmpl) ? tmpl : "/tmp";
    std::ofstream(d + "/w.bin", std::ios::binary) << std::string(4096, '\1');
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Under libFuzzer's -malloc_limit_mb (2 GiB in scripts/fuzz.sh): the importer's own limit must
  // refuse a huge tensor before libFuzzer would report the allocation.
  static const bool limited = [] {
    oases::set_max_memory_bytes(uint64_t{1} << 30);
    return true;
  }();
  (void)limited;
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, static_cast<int>(size))) return 0;
  oases::ImportOptions opts;
  opts.dims = {{"batch", 2}, {"seq", 3}, {"N", 4}};
  auto g = oases::import_onnx_model(model, scratch_dir(), opts);
  if (!g) return 0;
  if (!oases::check_supported(*g).is_ok()) return 0;
  static oases::CpuEvaluator evaluator;
  oases::FoldOptions fold;
  fold.evaluator = &evaluator;
  auto reports = oases::run_canonical_passes(*g, fold);
  if (!reports) return 0;
  static const bool run = std::getenv("OASES_FUZZ_RUN") != nullptr;
  if (!run) return 0;
  std::map<std::string, oases::Tensor> feeds;
  size_t bytes = 0;
  for (oases::ValueId v : g->inputs()) {
    const oases::Value& val = g->value(v);
    bytes += val.nbytes();
    if (bytes > (size_t{64} << 20)) return 0;
    feeds[val.name] = oases::Tensor(val.dtype, val.shape);
  }
  auto ex = oases::Executor::create(*g);
  if (!ex || (*ex)->program().memory.arena_bytes > (size_t{256} << 20)) return 0;
  auto out = (*ex)->run(feeds);
  (void)out;
  return 0;
}
