// Ranks that share one GPU (executor/device_local_comm.h with executor/cuda/device_local_cuda.h):
// three thread ranks on device 0, each with its own stream, run the collectives, a channel group
// and a ring of transfers; every value is checked against the same calls on the host backend
// (bit for bit: both sum in member order). Without a GPU: SKIPPED.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "executor/cuda/device_local_cuda.h"
#include "executor/device.h"
#include "tests/gpu/device_floats.h"
#include "tests/gpu/gpu_test_common.h"

namespace oases {
namespace {

using gpu_test::DeviceFloats;

std::vector<float> values(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.37f * static_cast<float>(rank + 1) + 0.01f * static_cast<float>(i);
  return v;
}

// One rank's calls: the results it read back, in order. `on_device` puts its buffers on the GPU
// and its calls on a stream of its own.
std::vector<std::vector<float>> script(int r, Communicator& c, bool on_device) {
  const size_t k = 4096;
  cudaStream_t s = nullptr;
  if (on_device) {
    EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
    set_device_local_stream(c, s);
  }
  std::vector<std::vector<float>> got;
  auto run = [&](std::vector<float> host, const std::function<void(float*)>& call) {
    if (!on_device) {
      call(host.data());
      got.push_back(host);
      return;
    }
    DeviceFloats d(host);
    call(d.get());
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    got.push_back(d.read());
  };
  auto g = c.make_group({0, 1, 2});
  if (on_device) set_device_local_stream(*g, s);
  run(values(r, k), [&](float* x) { g->all_reduce(x, static_cast<int64_t>(k), DType::kF32, ReduceOp::kSum); });
  run(values(r, 3 * k), [&](float* x) {  // in place: this rank's part at its place
    g->all_gather(x + r * k, x, static_cast<int64_t>(k * sizeof(float)));
  });
  run(values(r, 3 * k), [&](float* x) { g->reduce_scatter(x, x + r * k, static_cast<int64_t>(k), DType::kF32, ReduceOp::kSum); });
  run(values(r, k), [&](float* x) { g->broadcast(x, static_cast<int64_t>(k * sizeof(float)), 2); });
  run(values(r, k), [&](float* x) { g->shift(x, x, static_cast<int64_t>(k * sizeof(float)), 1); });
  CommGroup& ch = c.channel_group(r == 1 ? std::vector<int>{1} : std::vector<int>{0, 2}, 3);
  if (on_device) set_device_local_stream(ch, s);
  run(values(r, k), [&](float* x) { ch.all_reduce(x, static_cast<int64_t>(k), DType::kF32, ReduceOp::kMax); });
  // a ring of transfers: to r + 1, from r - 1
  run(values(r, 2 * k), [&](float* x) {
    auto q = c.irecv(x + k, static_cast<int64_t>(k * sizeof(float)), (r + 2) % 3, 7);
    auto p = c.isend(x, static_cast<int64_t>(k * sizeof(float)), (r + 1) % 3, 7);
    q->wait();
    p->wait();
  });
  if (s) cudaStreamDestroy(s);
  return got;
}

std::vector<std::vector<std::vector<float>>> on_ranks(std::shared_ptr<DeviceOps> ops, bool on_device, std::vector<std::string>* errors) {
  auto world = make_device_local_world(3, std::move(ops), 60);
  std::vector<std::vector<std::vector<float>>> out(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (on_device && !cuda_select_device(0).is_ok()) throw OasesError("cuda_select_device(0)");
        auto c = device_local_communicator(world, r);
        out[static_cast<size_t>(r)] = script(r, *c, on_device);
      } catch (const std::exception& e) {
        (*errors)[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(DeviceLocal, ThreeRanksOnOneGpuMatchTheHostBitForBit) {
  REQUIRE_GPU();
  std::vector<std::string> host_errors(3), gpu_errors(3);
  auto want = on_ranks(host_device_ops(), false, &host_errors);
  auto got = on_ranks(cuda::cuda_device_ops(), true, &gpu_errors);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(host_errors[static_cast<size_t>(r)], "");
    ASSERT_EQ(gpu_errors[static_cast<size_t>(r)], "");
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), want[static_cast<size_t>(r)].size());
    for (size_t i = 0; i < want[static_cast<size_t>(r)].size(); ++i)
      EXPECT_EQ(got[static_cast<size_t>(r)][i], want[static_cast<size_t>(r)][i]) << "rank " << r << ", call " << i;
  }
}

}  // namespace
}  // namespace oases
