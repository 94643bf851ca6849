#include "tools/profile_cuda.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "executor/device.h"
#include "executor/measure_cuda.h"
#include "executor/measure_machine.h"
#include "graph/atomic_file.h"
#include "tools/plan_driver.h"

namespace oases {

int profile_cuda(const CudaProfileOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  if (Status s = cuda_usable(); !s.is_ok()) return fail_with(s.with_context("--backend cuda"));
  if (o.dtype != "fp32" && o.dtype != "bf16" && o.dtype != "fp16") return fail_with(error("--dtype must be fp32, bf16 or fp16, not '{}'", o.dtype));
  if (o.ranks < 1) return fail_with(error("--ranks must be at least 1, not {}", o.ranks));
  if (o.reps < 1) return fail_with(error("--reps must be at least 1, not {}", o.reps));
  if (Status s = check_output_file(o.out, "--out " + o.out); !s.is_ok()) return fail_with(s);
  Profile p;
  p.backend = "cuda";
  p.machine = machine_description(1, 1);
  p.ranks = 1;  // one rank per GPU: nothing shares the device while an op is timed
  p.threads_per_rank = 1;
  p.op_clock = "wall";
  auto dev = measure_cuda_device();
  if (!dev) return fail_with(dev.status());
  p.device = *dev;
  p.has_device = true;
  p.machine["gpu"] = dev->name;
  std::printf("device: %s, %.1f TFLOP/s fp32, %.1f TFLOP/s bf16 matrix products, %.0f GB/s streaming, %.1f us a launch\n",
              dev->name.c_str(), dev->fp32_tflops, dev->fp16_tflops, dev->memory_gbps, dev->launch_us);
  auto opt = measure_cuda_optimizer();
  if (!opt) return fail_with(opt.status());
  p.optimizer_us_per_mib = *opt;
  std::printf("optimizer: AdamW on the device %.2f us per MiB of parameters\n", p.optimizer_us_per_mib);
  std::printf("collectives: not measured (one process on this GPU; plan with --cluster, whose links price them)\n");
  if (!o.model.empty()) {
    auto pm = load_planning_model(o.model, o.import, o.batch, o.seq);
    if (!pm) return fail_with(pm.status());
    auto a = analyze_model(pm->forward, pm->train.graph, pm->train.params, o.ranks);
    if (!a) return fail_with(a.status().with_context(o.model));
    auto degrees = profiled_degrees(*a, o.degrees, o.model, o.ranks);
    if (!degrees) return fail_with(degrees.status());
    std::map<std::string, OpSample> acc;
    nlohmann::json done = nlohmann::json::array();
    for (int64_t t : *degrees) {
      for (int64_t k : o.chunks) {
        if (k < 1 || pm->batch % (o.ranks / t * k) != 0) continue;
        auto t1 = std::chrono::steady_clock::now();
        auto r = measure_model_ops_on_cuda(pm->forward, pm->path, *a, o.ranks, t, k, o.dtype, o.reps, &acc);
        if (!r) return fail_with(r.status().with_context(o.model));
        std::printf("ops: tp %lld x dp %lld, %lld chunk(s), %s: %d new shapes timed%s in %.1f s\n", static_cast<long long>(t),
                    static_cast<long long>(o.ranks / t), static_cast<long long>(k), o.dtype.c_str(), r->timed,
                    r->skipped ? fmt::format(", {} could not run alone (first: {})", r->skipped, r->first_error).c_str() : "",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
        done.push_back({{"tp", t}, {"chunks", k}});
      }
    }
    for (auto& [k, s] : acc) p.ops.push_back(s);
    p.model = {{"path", o.model}, {"batch", pm->batch}, {"seq", pm->seq}, {"ranks", o.ranks}, {"dtype", o.dtype}, {"profiled", done}};
    std::printf("ops: %zu distinct op shapes of %s\n", p.ops.size(), o.model.c_str());
  }
  if (Status s = write_file_atomically(o.out, p.to_json().dump(1) + "\n"); !s.is_ok()) return fail_with(s);
  std::printf("wrote %s in %.1f s\n", o.out.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace oases
