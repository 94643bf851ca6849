// oases-gpu-info [--json]: what this build and this machine offer the GPU backend. Loads the CUDA
// runtime, cuBLAS, cuBLASLt, cuDNN and NCCL and reads their versions (the calls that work without
// a GPU say so; those that need one report why they did not answer), then counts devices. Exit 0
// whatever it finds: it is a report, not a requirement.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "executor/cpu/blas_select.h"
#include "executor/device.h"
#include "tools/model_loader.h"

using namespace oases;

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    bool json = false;
    CLI::App app{"oases-gpu-info: CUDA libraries, their versions and the devices this build can use"};
    app.add_flag("--json", json, "Print the report as JSON");
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    std::string report = cuda_report_json();
    if (json) {
      std::printf("%s\n", report.c_str());
      return 0;
    }
    nlohmann::json j = nlohmann::json::parse(report);
    if (!j["built"].get<bool>()) {
      std::printf("GPU backend: built without CUDA\n");
      return 0;
    }
    std::printf("GPU backend: built with CUDA\n");
    for (const auto& l : j["libraries"]) {
      std::string v = l["read"].get<bool>() ? l["version"].get<std::string>() : "not read (" + l["note"].get<std::string>() + ")";
      std::string c = l["compiled"].get<std::string>();
      std::printf("  %-15s %s%s\n", l["library"].get<std::string>().c_str(), v.c_str(),
                  c.empty() ? "" : ("  (built against " + c + ")").c_str());
    }
    const auto& d = j["devices"];
    if (d["count"].get<int>() == 0) {
      std::printf("devices: none (%s)\n", d["error"].get<std::string>().c_str());
    } else {
      for (size_t i = 0; i < d["names"].size(); ++i) {
        std::printf("device %zu: %s, sm_%d, %.1f GiB\n", i, d["names"][i].get<std::string>().c_str(), d["sm"][i].get<int>(),
                    d["memory_gib"][i].get<double>());
      }
    }
    return 0;
  });
}
