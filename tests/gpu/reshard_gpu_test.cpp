// Cross-mesh resharding on the GPU (issue 32 item 3): every layout of tests/e2e/test_reshard.sh
// (the paper's microbenchmark layouts, even and uneven shapes, a partial source), each strategy,
// run by thread ranks sharing device 0 (device-local communicator on CUDA streams, tiles in device
// memory through CudaTileMemory: the CUDA Reshard kernel's path) against the same plan on thread
// ranks on the host, bit for bit. Without a GPU: SKIPPED.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "executor/communicator.h"
#include "executor/cuda/device_local_cuda.h"
#include "executor/cuda/device_tiles.h"
#include "executor/device.h"
#include "executor/reshard_runner.h"
#include "graph/tiles.h"
#include "planner/reshard.h"
#include "tests/common/reshard_tiles.h"
#include "tests/gpu/gpu_test_common.h"

namespace oases {
namespace {

// Every rank's destination tile (its boxes' bytes in order), on the host or on the GPU.
std::vector<std::vector<char>> run_ranks(const ReshardPlan& plan, const ReshardProblem& p, int n, bool gpu, std::vector<std::string>* errors) {
  std::vector<std::vector<char>> out(static_cast<size_t>(n));
  errors->assign(static_cast<size_t>(n), "");
  auto host_world = make_local_world(n, 60);
  auto device_world = make_device_local_world(n, gpu ? cuda::cuda_device_ops() : host_device_ops(), 60);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ReshardRunOptions o;
        o.tag = 1;
        TileData src = testutil::indexed_source_tile(p, r);
        if (!gpu) {
          auto comm = local_communicator(host_world, r);
          TileData dst = run_reshard(plan, p, *comm, src, o);
          for (const TileBytes& d : dst.data) out[static_cast<size_t>(r)].insert(out[static_cast<size_t>(r)].end(), d.begin(), d.end());
          return;
        }
        if (!cuda_select_device(0).is_ok()) throw OasesError("cuda_select_device(0)");
        auto comm = device_local_communicator(device_world, r);
        cudaStream_t s = nullptr;
        if (cudaStreamCreate(&s) != cudaSuccess) throw OasesError("cudaStreamCreate");
        // both tiles in device memory, one allocation per box
        auto upload = [&](const TileData& t, TileView* v) {
          v->boxes = t.boxes;
          v->element_bytes = 4;
          for (const TileBytes& d : t.data) {
            void* p = nullptr;
            if (cudaMalloc(&p, std::max<size_t>(d.size(), 1)) != cudaSuccess) throw OasesError("cudaMalloc");
            if (!d.empty() && cudaMemcpy(p, d.data(), d.size(), cudaMemcpyHostToDevice) != cudaSuccess) throw OasesError("upload");
            v->data.push_back(static_cast<char*>(p));
          }
        };
        TileView dsrc, ddst;
        upload(src, &dsrc);
        TileData dst_host;
        if (int64_t dr = p.dst.placed.mesh_rank(r); dr >= 0)
          dst_host = TileData::zeros(tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh).value(), dr, 4);
        upload(dst_host, &ddst);
        {
          cuda::CudaTileMemory mem(s);
          run_reshard_into(plan, p, *comm, dsrc, ddst, mem, o);
        }
        if (cudaStreamSynchronize(s) != cudaSuccess) throw OasesError("the stream failed");
        for (size_t k = 0; k < ddst.data.size(); ++k) {
          std::vector<char> bytes(static_cast<size_t>(ddst.boxes[k].numel() * 4));
          if (cudaMemcpy(bytes.data(), ddst.data[k], bytes.size(), cudaMemcpyDeviceToHost) != cudaSuccess) throw OasesError("download");
          out[static_cast<size_t>(r)].insert(out[static_cast<size_t>(r)].end(), bytes.begin(), bytes.end());
        }
        for (char* d : dsrc.data) cudaFree(d);
        for (char* d : ddst.data) cudaFree(d);
        cudaStreamDestroy(s);
      } catch (const std::exception& e) {
        (*errors)[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ReshardOnGpu, TheReshardTestsLayoutsMatchThreadRanksBitForBit) {
  REQUIRE_GPU();
  struct Case {
    std::string src_mesh, src, dst_mesh, dst;
  };
  // tests/e2e/test_reshard.sh's CASES (destination meshes after the source's ranks), and an
  // overlapping pair
  const std::vector<Case> cases = {{"2x4", "S0RR", "2x4", "S0RR"},  {"2x4", "RRR", "2x4", "S0RR"},   {"2x4", "RS0R", "2x4", "S0RR"},
                                   {"2x4", "RS01R", "2x4", "S01RR"}, {"2x4", "S1RR", "2x4", "S0RR"},  {"2x4", "RS0R", "2x4", "RRS0"},
                                   {"2x4", "S0RR", "3x4", "S0RR"},  {"1x4", "RRR", "2x4", "RRR"},    {"1", "RRR", "4x2", "RRR"},
                                   {"2x2", "S0R:P1", "2x2", "RS1"}};
  int checked = 0;
  for (const Case& c : cases) {
    for (Shape shape : {Shape{8, 8, 4}, Shape{7, 5, 3}}) {
      if (c.src.find(":P") != std::string::npos) shape.pop_back();
      Mesh sm = parse_mesh_shape(c.src_mesh).value(), dm = parse_mesh_shape(c.dst_mesh).value();
      ReshardProblem p;
      p.shape = shape;
      p.src.spec = parse_layout(c.src, shape.size(), &sm).value();
      p.dst.spec = parse_layout(c.dst, shape.size(), &dm).value();
      p.src.placed = PlacedMesh::contiguous(sm, 0);
      p.dst.placed = PlacedMesh::contiguous(dm, sm.size());
      const int n = static_cast<int>(p.dst.placed.ranks.back() + 1);
      ReshardCluster cluster = ReshardCluster::spread(n, 2, LinkModel{1.25, 50}, LinkModel{20, 1});
      for (auto strategy : {ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather, ReshardStrategy::kBroadcast}) {
        std::string what = fmt::format("{} {} -> {} {} {} ({})", c.src_mesh, c.src, c.dst_mesh, c.dst, shape_str(shape), strategy_name(strategy));
        auto plan = plan_reshard(p, cluster, {strategy});
        ASSERT_TRUE(plan) << what << ": " << plan.status().message();
        std::vector<std::string> host_errors, gpu_errors;
        auto want = run_ranks(*plan, p, n, false, &host_errors);
        auto got = run_ranks(*plan, p, n, true, &gpu_errors);
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(host_errors[static_cast<size_t>(r)], "") << what << ", host rank " << r;
          ASSERT_EQ(gpu_errors[static_cast<size_t>(r)], "") << what << ", GPU rank " << r;
          EXPECT_TRUE(got[static_cast<size_t>(r)] == want[static_cast<size_t>(r)]) << what << ", rank " << r;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 60);
}

}  // namespace
}  // namespace oases
