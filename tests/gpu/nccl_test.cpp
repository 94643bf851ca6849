// NCCL through the communicator (executor/cuda/nccl_communicator.h), every value checked: on one
// GPU a world of one (every collective of a group, a channel group, transfers to itself as device
// copies in either order and as NCCL send/receive in a batch, the error of a transfer waited for
// before its partner exists); on two GPUs two thread ranks (a mesh group's collectives, point to
// point both ways on two tags, a channel group). Without a GPU each test reports SKIPPED.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "executor/communicator.h"
#include "executor/cuda/nccl_communicator.h"
#include "executor/device.h"
#include "tests/gpu/device_floats.h"
#include "tests/gpu/gpu_test_common.h"

namespace oases {
namespace {

using cuda::NcclCommunicator;
using cuda::NcclGroup;
using gpu_test::DeviceFloats;
using gpu_test::iota;

int gpu_count() {
  std::string rep = cuda_report_json();
  auto pos = rep.find("\"count\":");
  return pos == std::string::npos ? 0 : std::atoi(rep.c_str() + pos + 8);
}

TEST(Nccl, WorldOfOneEveryCollectiveChannelGroupAndTransfersToItself) {
  REQUIRE_GPU();
  ASSERT_TRUE(cuda_select_device(0).is_ok());
  auto world = make_local_world(1, 60);
  auto host = local_communicator(world, 0);
  NcclCommunicator nc(host.get());
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  nc.set_stream(s);
  const std::vector<float> v = iota(1024, 1.0f);

  std::unique_ptr<CommGroup> made = nc.make_group({0});
  auto* g = dynamic_cast<NcclGroup*>(made.get());
  ASSERT_NE(g, nullptr);
  g->set_stream(s);
  {
    DeviceFloats x(v);
    g->all_reduce(x.get(), 1024, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x.read(), v) << "all-reduce over one rank";
    g->all_reduce(x.get(), 1024, DType::kF32, ReduceOp::kMax);
    EXPECT_EQ(x.read(), v) << "max over one rank";
  }
  {
    DeviceFloats in(v), out(1024);
    g->all_gather(in.get(), out.get(), static_cast<int64_t>(in.bytes()));
    EXPECT_EQ(out.read(), v) << "all-gather";
  }
  {
    DeviceFloats in(v), out(1024);
    g->reduce_scatter(in.get(), out.get(), 1024, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(out.read(), v) << "reduce-scatter";
  }
  {
    DeviceFloats in(v), out(1024);
    g->all_to_all(in.get(), out.get(), static_cast<int64_t>(in.bytes()));
    EXPECT_EQ(out.read(), v) << "all-to-all";
  }
  {
    DeviceFloats x(v);
    g->broadcast(x.get(), static_cast<int64_t>(x.bytes()), 0);
    EXPECT_EQ(x.read(), v) << "broadcast";
  }
  {
    DeviceFloats in(v), out(1024);
    g->shift(in.get(), out.get(), static_cast<int64_t>(in.bytes()), 1);
    EXPECT_EQ(out.read(), v) << "ring shift";
  }
  g->barrier();

  // a channel group: made once per (members, tag), the same object after
  CommGroup& ch = nc.channel_group({0}, 7);
  EXPECT_EQ(&ch, &nc.channel_group({0}, 7));
  {
    auto* nch = dynamic_cast<NcclGroup*>(&ch);
    ASSERT_NE(nch, nullptr);
    nch->set_stream(s);
    DeviceFloats x(v);
    nch->all_reduce(x.get(), 1024, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(x.read(), v) << "channel group all-reduce";
  }

  // to itself outside a batch: device copies, the send first or the receive first
  {
    DeviceFloats a(v), b(1024);
    auto send = nc.isend(a.get(), static_cast<int64_t>(a.bytes()), 0, 3);
    auto recv = nc.irecv(b.get(), static_cast<int64_t>(b.bytes()), 0, 3);
    recv->wait();
    send->wait();
    EXPECT_EQ(b.read(), v) << "send then receive";
  }
  {
    DeviceFloats a(v), b(1024);
    auto recv = nc.irecv(b.get(), static_cast<int64_t>(b.bytes()), 0, 4);
    auto send = nc.isend(a.get(), static_cast<int64_t>(a.bytes()), 0, 4);
    send->wait();
    recv->wait();
    EXPECT_EQ(b.read(), v) << "receive then send";
  }
  // ... and through NCCL's own send and receive, issued together in a batch
  {
    DeviceFloats a(v), b(1024);
    nc.begin_batch();
    auto send = nc.isend(a.get(), static_cast<int64_t>(a.bytes()), 0, 5);
    auto recv = nc.irecv(b.get(), static_cast<int64_t>(b.bytes()), 0, 5);
    EXPECT_THROW(send->wait(), OasesError) << "a batched transfer waited for before the batch ends";
    nc.end_batch();
    send->wait();
    recv->wait();
    EXPECT_TRUE(recv->test());
    EXPECT_EQ(b.read(), v) << "NCCL send/receive to itself";
  }
  // a send to itself waited for before any receive could never complete: an error, not a hang
  {
    DeviceFloats a(v), b(1024);
    auto send = nc.isend(a.get(), static_cast<int64_t>(a.bytes()), 0, 6);
    EXPECT_FALSE(send->test());
    EXPECT_THROW(send->wait(), OasesError);
    auto recv = nc.irecv(b.get(), static_cast<int64_t>(b.bytes()), 0, 6);  // matched now: completes
    recv->wait();
    EXPECT_EQ(b.read(), v);
  }
  // bad peers and tags are refused with the numbers named
  {
    DeviceFloats a(v);
    EXPECT_THROW(nc.isend(a.get(), 4, 1, 0), OasesError);
    EXPECT_THROW(nc.isend(a.get(), 4, 0, Communicator::kMaxChannelTag + 1), OasesError);
  }
  cudaStreamDestroy(s);
}

// The two-GPU test: a mesh group all-reduces and all-gathers (values checked on both ranks),
// point to point both ways on two tags, a channel group's broadcast.
TEST(Nccl, TwoGpusCollectivesPointToPointAndChannelGroups) {
  REQUIRE_GPU();
  const int devices = gpu_count();
  if (devices < 2) GTEST_SKIP() << "needs two GPUs, found " << devices;
  auto world = make_local_world(2, 60);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto host = local_communicator(world, r);
        Status st = cuda_select_device(r);
        if (!st.is_ok()) throw OasesError(st.message());
        NcclCommunicator nc(host.get());
        cudaStream_t s = nullptr;
        if (cudaStreamCreate(&s) != cudaSuccess) throw OasesError("cudaStreamCreate");
        nc.set_stream(s);
        auto check = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
          if (got != want) throw OasesError(fmt::format("rank {}: {}: got {} … want {} …", r, what, got[0], want[0]));
        };
        std::unique_ptr<CommGroup> made = nc.make_group({0, 1});
        auto* g = dynamic_cast<NcclGroup*>(made.get());
        g->set_stream(s);
        // all-reduce: rank r holds (r + 1) · [1, 2, …]: the sum is 3 · [1, 2, …]
        std::vector<float> mine = iota(256, 1.0f), sum = iota(256, 1.0f);
        for (float& x : mine) x *= static_cast<float>(r + 1);
        for (float& x : sum) x *= 3.0f;
        DeviceFloats x(mine);
        g->all_reduce(x.get(), 256, DType::kF32, ReduceOp::kSum);
        check(x.read(), sum, "all-reduce");
        // all-gather: rank 0's then rank 1's
        DeviceFloats in(iota(128, 1000.0f * static_cast<float>(r))), out(256);
        g->all_gather(in.get(), out.get(), static_cast<int64_t>(in.bytes()));
        std::vector<float> both = iota(128, 0.0f), second = iota(128, 1000.0f);
        both.insert(both.end(), second.begin(), second.end());
        check(out.read(), both, "all-gather");
        // point to point: 0 -> 1 on tag 1, 1 -> 0 on tag 2, issued in opposite orders (tags never queue behind each other)
        DeviceFloats send_buf(iota(64, 10.0f * static_cast<float>(r + 1))), recv_buf(64);
        std::unique_ptr<CommRequest> a, b;
        if (r == 0) {
          a = nc.isend(send_buf.get(), static_cast<int64_t>(send_buf.bytes()), 1, 1);
          b = nc.irecv(recv_buf.get(), static_cast<int64_t>(recv_buf.bytes()), 1, 2);
        } else {
          b = nc.irecv(recv_buf.get(), static_cast<int64_t>(recv_buf.bytes()), 0, 1);
          a = nc.isend(send_buf.get(), static_cast<int64_t>(send_buf.bytes()), 0, 2);
        }
        a->wait();
        b->wait();
        check(recv_buf.read(), iota(64, 10.0f * static_cast<float>(2 - r)), "point to point");
        // a channel group's broadcast from member 1
        CommGroup& ch = nc.channel_group({0, 1}, 9);
        dynamic_cast<NcclGroup&>(ch).set_stream(s);
        DeviceFloats bc(iota(32, r == 1 ? 500.0f : 0.0f));
        ch.broadcast(bc.get(), static_cast<int64_t>(bc.bytes()), 1);
        check(bc.read(), iota(32, 500.0f), "channel group broadcast");
        cudaStreamDestroy(s);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace oases
