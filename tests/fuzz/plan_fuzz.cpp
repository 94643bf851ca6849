// libFuzzer target for the plan loader (planner/plan.h Plan::from_json, planner/plan_file.cpp):
// arbitrary bytes -> JSON -> a validated Plan. Any plan may be refused; none may crash, hang, leak
// or allocate without bound, and the refusal must be one line naming the file. A plan that loads
// must be written (to_json) into a file that loads again and writes the same JSON, and must give
// its one-line summary and a run shape (adopt_plan) without fault. Not built by default; with clang:
//
//   bash scripts/fuzz.sh 60      # builds build-fuzz (clang, ASan+UBSan) and runs each target 60 s
//
// Seeds: tests/fuzz/corpus/plan/ (plans of each version as oases-plan and oases-train write them,
// a hand-written map of specs, and damaged ones).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/plan.h"

namespace {

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "input.json";
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // Plan::read says "not valid JSON" before the fields
  auto p = oases::Plan::from_json(j, path);
  if (!p) {
    const std::string& m = p.status().message();
    if (m.rfind(path + ": ", 0) != 0 || m.find('\n') != std::string::npos) die("the error does not name the file on one line", m);
    return 0;
  }
  if (oases::Status st = p->validate(); !st.is_ok()) die("a loaded plan does not validate", st.message());
  const nlohmann::json written = p->to_json();
  auto back = oases::Plan::from_json(written, "written.json");
  if (!back) die("a written plan does not load", back.status().message() + " in " + written.dump());
  if (back->to_json() != written) die("a written plan reads back as another", written.dump() + " vs " + back->to_json().dump());
  (void)p->to_string();
  oases::RunShape run;
  const int64_t world = p->mesh().ranks > 0 ? p->mesh().ranks : 4;
  (void)oases::adopt_plan(*p, path, world, &run);
  return 0;
}
