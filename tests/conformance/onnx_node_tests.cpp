// Conformance: the ONNX node tests of libonnx-testdata (ONNX_NODE_TEST_DIR/test_*), one GoogleTest
// case per test whose every node has a schema in the op registry (the "_expanded" variants count
// when all the ops of their expansion are supported). Each data set is imported with the input
// shapes of its data, made canonical, run with the CPU executor and compared with the expected
// outputs at the ONNX backend-test tolerance (rtol 1e-3, atol 1e-7; exact for integers and bool).
//
// Tests listed in out_of_scope.txt ("test_name  reason") are reported skipped with their reason,
// unless they pass, which is a failure: the list must stay honest. Tests of unsupported ops are not
// instantiated; they are counted in the summary printed at the end of a run.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "graph/op_registry.h"
#include "tools/data_set.h"

namespace oases {

// The node tests include models below opset 13 whose ops are unchanged since; the runner reads
// them (the tools refuse opsets below 13 unless asked).
static ImportOptions older_opsets_allowed() {
  ImportOptions o;
  o.allow_older_opsets = true;
  return o;
}
namespace {

namespace fs = std::filesystem;

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-7;

const std::string kNodeTestDir = ONNX_NODE_TEST_DIR;
const std::string kOutOfScopeFile = std::string(OASES_SOURCE_DIR) + "/tests/conformance/out_of_scope.txt";

// The node tests found on disk, split by whether the registry knows all of their ops.
struct Catalogue {
  std::vector<std::string> supported;
  std::vector<std::string> unsupported;
  std::map<std::string, int> missing_ops;  // op -> number of tests that need it
  std::set<std::string> all;
};

std::string op_key(const std::string& domain, const std::string& op) {
  return is_default_domain(domain) ? op : domain + "." + op;
}

const Catalogue& catalogue() {
  static const Catalogue cat = [] {
    Catalogue c;
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(kNodeTestDir, ec)) {
      std::string name = e.path().filename().string();
      if (e.is_directory() && name.rfind("test_", 0) == 0) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    const OpRegistry& reg = OpRegistry::global();
    for (const auto& name : names) {
      c.all.insert(name);
      onnx::ModelProto model;
      std::set<std::string> missing;
      if (!read_model_proto(kNodeTestDir + "/" + name + "/model.onnx", &model).is_ok()) {
        missing.insert("(unreadable model)");
      }
      for (const auto& n : model.graph().node()) {
        if (!reg.find(n.domain(), n.op_type())) missing.insert(op_key(n.domain(), n.op_type()));
      }
      if (missing.empty()) {
        c.supported.push_back(name);
      } else {
        c.unsupported.push_back(name);
        for (const auto& op : missing) ++c.missing_ops[op];
      }
    }
    return c;
  }();
  return cat;
}

// out_of_scope.txt: "test_name  reason" per line; '#' starts a comment.
struct OutOfScopeEntry {
  std::string reason;
  int line = 0;
};

struct OutOfScopeList {
  std::map<std::string, OutOfScopeEntry> entries;
  std::vector<std::string> problems;  // malformed or repeated lines
};

const OutOfScopeList& out_of_scope() {
  static const OutOfScopeList list = [] {
    OutOfScopeList l;
    std::ifstream in(kOutOfScopeFile);
    if (!in) {
      l.problems.push_back(kOutOfScopeFile + ": cannot be read");
      return l;
    }
    std::string text;
    for (int line_no = 1; std::getline(in, text); ++line_no) {
      auto hash = text.find('#');
      if (hash != std::string::npos) text.resize(hash);
      std::istringstream ss(text);
      std::string name;
      if (!(ss >> name)) continue;
      std::string reason;
      std::getline(ss, reason);
      reason.erase(0, reason.find_first_not_of(" \t"));
      reason.erase(reason.find_last_not_of(" \t\r") + 1);
      if (reason.empty()) {
        l.problems.push_back(fmt::format("line {}: '{}' has no reason", line_no, name));
        continue;
      }
      if (!l.entries.emplace(name, OutOfScopeEntry{reason, line_no}).second) {
        l.problems.push_back(fmt::format("line {}: '{}' is listed twice", line_no, name));
      }
    }
    return l;
  }();
  return list;
}

// What this process saw, for the summary line.
struct Tally {
  std::atomic<int> run{0}, passed{0}, out_of_scope{0}, failed{0};
};
Tally& tally() {
  static Tally t;
  return t;
}

std::string top_missing_ops(const Catalogue& c, size_t n) {
  std::vector<std::pair<int, std::string>> v;
  for (const auto& [op, count] : c.missing_ops) v.push_back({-count, op});
  std::sort(v.begin(), v.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < v.size() && i < n; ++i) parts.push_back(fmt::format("{} {}", v[i].second, -v[i].first));
  if (v.size() > n) parts.push_back(fmt::format("and {} more ops", v.size() - n));
  return fmt::format("{}", fmt::join(parts, ", "));
}

class SummaryEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    const Catalogue& c = catalogue();
    const Tally& t = tally();
    if (t.run == 0) return;
    std::printf(
        "[conformance] ONNX node tests in %s: %zu found, %zu of supported ops; run here %d: passed %d, "
        "skipped as out of scope %d, failed %d; %zu tests of unsupported ops not run (%s)\n",
        kNodeTestDir.c_str(), c.all.size(), c.supported.size(), t.run.load(), t.passed.load(), t.out_of_scope.load(), t.failed.load(),
        c.unsupported.size(), top_missing_ops(c, 12).c_str());
  }
};
const auto* const kSummary = ::testing::AddGlobalTestEnvironment(new SummaryEnvironment);

// Runs one data set; returns an error describing the first problem, or OK.
Status run_data_set(const std::string& model_path, const std::string& ds) {
  OASES_ASSIGN_OR_RETURN(auto given, read_numbered_tensors(ds, "input"));
  OASES_ASSIGN_OR_RETURN(auto feeds, match_model_inputs(model_path, given, ds, older_opsets_allowed()));
  OASES_ASSIGN_OR_RETURN(FedModel fed, load_model_for_feeds(model_path, older_opsets_allowed(), &feeds));
  OASES_ASSIGN_OR_RETURN(auto ex, Executor::create(fed.model.graph));
  OASES_ASSIGN_OR_RETURN(std::vector<Tensor> outs, ex->run(feeds));
  OASES_ASSIGN_OR_RETURN(auto expected, read_numbered_tensors(ds, "output"));
  const Graph& g = ex->graph();
  if (expected.size() != g.outputs().size()) {
    return error("{}: {} expected outputs, the model gives {}", ds, expected.size(), g.outputs().size());
  }
  std::vector<std::string> problems;
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [want_name, want] = expected[i];
    size_t idx = i;
    for (size_t j = 0; j < g.outputs().size(); ++j) {
      if (g.value(g.outputs()[j]).name == want_name) idx = j;
    }
    const std::string& name = g.value(g.outputs()[idx]).name;
    TensorComparison c = compare_tensors(outs[idx], want, kRtol, kAtol);
    if (!c.problem.empty()) {
      problems.push_back(fmt::format("output '{}': {}", name, c.problem));
    } else if (c.bad > 0) {
      problems.push_back(fmt::format(
          "output '{}': {} of {} elements outside rtol {} atol {} (max abs err {:.3g}, max rel err {:.3g}; "
          "first at {}: got {}, expected {})",
          name, c.bad, want.numel(), kRtol, kAtol, c.max_abs, c.max_rel, c.first_bad,
          load_as_double(outs[idx].raw(), outs[idx].dtype(), c.first_bad), load_as_double(want.raw(), want.dtype(), c.first_bad)));
    }
  }
  if (!problems.empty()) return error("{}: {}", fs::path(ds).filename().string(), fmt::join(problems, "; "));
  return Status::ok();
}

Status run_node_test(const std::string& name) {
  const std::string dir = kNodeTestDir + "/" + name;
  std::vector<std::string> data_sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) data_sets.push_back(e.path().string());
  }
  std::sort(data_sets.begin(), data_sets.end());
  if (data_sets.empty()) return error("{}: no test_data_set_* folder", dir);
  try {
    for (const auto& ds : data_sets) OASES_RETURN_IF_ERROR(run_data_set(dir + "/model.onnx", ds));
  } catch (const std::exception& e) {
    return error("exception: {}", e.what());
  }
  return Status::ok();
}

class OnnxNodeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxNodeTest, Run) {
  const std::string& name = GetParam();
  Status result = run_node_test(name);
  ++tally().run;
  const auto& oos = out_of_scope().entries;
  auto listed = oos.find(name);
  if (listed != oos.end()) {
    if (result.is_ok()) {
      ++tally().failed;
      FAIL() << name << " passes but is listed as out of scope (\"" << listed->second.reason << "\", line " << listed->second.line
             << "): remove it from out_of_scope.txt";
    }
    ++tally().out_of_scope;
    GTEST_SKIP() << "out of scope: " << listed->second.reason << "\n  (" << result.message() << ")";
  }
  if (result.is_ok()) {
    ++tally().passed;
  } else {
    ++tally().failed;
  }
  EXPECT_TRUE(result.is_ok()) << result.message();
}

INSTANTIATE_TEST_SUITE_P(Node, OnnxNodeTest, ::testing::ValuesIn(catalogue().supported),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OnnxNodeTest);

// The list names only tests that exist and are of supported ops, each once and with a reason.
TEST(OnnxNodeTestList, OutOfScopeEntriesAreWellFormed) {
  const Catalogue& c = catalogue();
  if (c.all.empty()) GTEST_SKIP() << "no node tests under " << kNodeTestDir << " (install libonnx-testdata)";
  const OutOfScopeList& l = out_of_scope();
  for (const auto& p : l.problems) ADD_FAILURE() << kOutOfScopeFile << ": " << p;
  std::set<std::string> supported(c.supported.begin(), c.supported.end());
  for (const auto& [name, e] : l.entries) {
    if (!c.all.count(name)) {
      ADD_FAILURE() << kOutOfScopeFile << " line " << e.line << ": '" << name << "' is not a node test under " << kNodeTestDir;
    } else if (!supported.count(name)) {
      ADD_FAILURE() << kOutOfScopeFile << " line " << e.line << ": '" << name
                    << "' uses an unsupported op, so it is never run; remove it from the list";
    }
  }
}

}  // namespace
}  // namespace oases
