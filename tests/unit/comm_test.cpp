// The communicator suite on the local (threads) implementation, collective kernels over split and
// segmented dimensions against slicing/assembling, the duals of the collectives' gradients, and a
// peer that never arrives.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "../common/comm_suite.h"
#include "executor/emulated_link.h"
#include "executor/executor.h"
#include "executor/launcher.h"
#include "graph/autodiff.h"
#include "graph/sharding.h"

namespace oases {
namespace {

template <class F>
void run_ranks(int n, F&& body, double timeout_s = 60) {
  auto world = make_local_world(n, timeout_s);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      auto comm = local_communicator(world, r);
      body(*comm, r);
    });
  }
  for (auto& t : ts) t.join();
}

TEST(LocalCommunicator, SharedSuite) {
  for (int n : {1, 2, 4}) {
    std::mutex mu;
    std::vector<std::string> failures;
    run_ranks(n, [&](Communicator& c, int) {
      auto f = testing::run_comm_suite(c);
      std::lock_guard<std::mutex> lock(mu);
      failures.insert(failures.end(), f.begin(), f.end());
    });
    for (const auto& f : failures) ADD_FAILURE() << n << " ranks: " << f;
  }
}

TEST(LocalCommunicator, MissingPeerTimesOutWithAnError) {
  auto world = make_local_world(2, 0.5);
  auto comm = local_communicator(world, 0);
  auto g = comm->make_group({0, 1});
  float x = 1;
  try {
    g->all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    FAIL() << "no error";
  } catch (const OasesError& e) {
    // names the collective, the group and the rank it waited for
    EXPECT_NE(std::string(e.what()).find(
                  "all-reduce in group [0, 1] (member 0 of 2): waited 0.5 s (--comm-timeout) for rank 1, which did not arrive"),
              std::string::npos)
        << e.what();
  }
}

TEST(LocalCommunicator, TimeoutNamesEveryMissingRank) {
  auto world = make_local_world(4, 0.3);
  std::string msg;
  std::thread other([&] {
    auto g = local_communicator(world, 2)->make_group({0, 1, 2, 3});
    try {
      g->barrier();
    } catch (const OasesError&) {}
  });
  auto g = local_communicator(world, 0)->make_group({0, 1, 2, 3});
  try {
    g->barrier();
  } catch (const OasesError& e) {
    msg = e.what();
  }
  other.join();
  EXPECT_NE(msg.find("for ranks 1, 3, which did not arrive"), std::string::npos) << msg;
}

// Rank 2 waits for rank 1 in [1, 2], while rank 1 waits for rank 0 (absent) in [0, 1]: rank 2's
// timeout names the chain down to rank 0, not only the rank it waited for.
TEST(LocalCommunicator, TimeoutFollowsTheChainOfWaitingRanks) {
  auto world = make_local_world(3, 1.0);
  std::thread first([&] {
    auto g = local_communicator(world, 1)->make_group({0, 1});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 2's wait starts first
    try {
      g->barrier();
    } catch (const OasesError&) {}
  });
  std::string msg;
  auto g = local_communicator(world, 2)->make_group({1, 2});
  try {
    g->barrier();
  } catch (const OasesError& e) {
    msg = e.what();
  }
  first.join();
  EXPECT_NE(msg.find("barrier in group [1, 2] (member 1 of 2): waited 1 s (--comm-timeout) for rank 1, which did not arrive; "
                     "rank 1 waits for rank 0 in barrier in group [0, 1] (member 1 of 2)"),
            std::string::npos)
      << msg;
}

// Rank 0 receives from rank 1 (tag 7, 1 s timeout) while rank 1, 200 ms later, runs `rank1`, which
// waits for rank 2, which never comes; returns rank 0's error.
template <class F>
std::string receive_timeout_while(F&& rank1) {
  auto world = make_local_world(3, 1.0);
  std::thread middle([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0's receive waits first
    try {
      rank1(*local_communicator(world, 1));
    } catch (const OasesError&) {}
  });
  std::string msg;
  float x = 0;
  try {
    local_communicator(world, 0)->irecv(&x, sizeof(x), 1, 7)->wait();
  } catch (const OasesError& e) {
    msg = e.what();
  }
  middle.join();
  return msg;
}

// A receive that times out first (a later pipeline stage's rank is stuck in its tp all-reduce with
// a hung peer) names the rank that holds everyone up, as a collective's timeout does.
TEST(LocalCommunicator, ReceiveTimeoutFollowsTheSendersWait) {
  std::string msg = receive_timeout_while([](Communicator& c) { c.make_group({1, 2})->barrier(); });
  EXPECT_NE(
      msg.find("receive by rank 0 from rank 1 (tag 7): nothing arrived within 1 s; rank 1 waits for rank 2 in barrier in group [1, 2]"),
      std::string::npos)
      << msg;
}

// The chain follows receives too: rank 1 itself waits to receive from rank 2 (a pipeline stage
// waiting for the one before it).
TEST(LocalCommunicator, ReceiveTimeoutFollowsAReceivingSender) {
  std::string msg = receive_timeout_while([](Communicator& c) {
    float y = 0;
    c.irecv(&y, sizeof(y), 2, 8)->wait();
  });
  EXPECT_NE(
      msg.find("receive by rank 0 from rank 1 (tag 7): nothing arrived within 1 s; rank 1 waits for rank 2 in receive from rank 2 (tag 8)"),
      std::string::npos)
      << msg;
}

// A sender that waits for no one is computing (or stuck in its own code): the receive gives it one
// more timeout before it calls it hung, and then says so.
TEST(LocalCommunicator, ReceiveGivesABusySenderOneMoreTimeout) {
  auto world = make_local_world(2, 0.5);
  std::thread slow([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));  // busy past one timeout, not two
    float y = 3;
    local_communicator(world, 1)->isend(&y, sizeof(y), 0, 7)->wait();
  });
  float x = 0;
  EXPECT_NO_THROW(local_communicator(world, 0)->irecv(&x, sizeof(x), 1, 7)->wait());
  slow.join();
  EXPECT_EQ(x, 3.0f);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    local_communicator(world, 0)->irecv(&x, sizeof(x), 1, 8)->wait();  // rank 1 never sends again
  } catch (const OasesError& e) {
    msg = e.what();
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(
      msg.find(
          "receive by rank 0 from rank 1 (tag 8): nothing arrived within 1 s; rank 1 waits for no rank (busy, or stuck in its own code)"),
      std::string::npos)
      << msg;
  EXPECT_GE(s, 0.95);
  EXPECT_LT(s, 5.0);
}

// The emulated link moves a collective's data only once every member is there: a rank that arrives
// early leaves with the late one, the link's time after the late one's arrival (it used to leave
// the link's time after its own arrival, so ranks sharing cores hid one rank's link time behind
// another's computation).
TEST(EmulatedLink, CollectiveEndsTheLinksTimeAfterTheLastArrival) {
  const LinkModel link{1e3, 15000};  // latency-bound: 15 ms per ring step
  const double link_s = link.all_reduce_s(4 * 4, 2);
  const double late_s = 0.08;
  ASSERT_GT(link_s, 0.02);
  auto world = make_local_world(2, 10);
  const auto start = std::chrono::steady_clock::now();
  double done_s[2] = {0, 0};
  float v[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      auto g = emulate_link(local_communicator(world, r)->make_group({0, 1}), link);
      if (r == 1)
        std::this_thread::sleep_until(
            start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(late_s)));
      g->all_reduce(v[r], 4, DType::kF32, ReduceOp::kSum);
      done_s[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(done_s[r], late_s + link_s - 1e-3) << "rank " << r << " left before the link's time after rank 1 arrived";
    EXPECT_LT(done_s[r], late_s + link_s + 0.05) << "rank " << r;
    EXPECT_FLOAT_EQ(v[r][3], 44.0f);
  }
  EXPECT_NEAR(done_s[0], done_s[1], 0.01) << "both members leave together";
}

TEST(ThreadRanks, HungRankIsLeftBehindAfterTheGrace) {
  // rank 1 is stuck in its own code (no collective to wake it); rank 0 times out in a barrier
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto t0 = std::chrono::steady_clock::now();
  bool abandoned = false;
  Status st = run_thread_ranks(
      2, Mesh{{"tp"}, {2}}, LinkModel{}, 1, 0.3,
      [release](RankRuntime& rt) -> Status {
        if (rt.rank() == 1) {
          while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return Status::ok();
        }
        rt.axis_groups()[0]->barrier();
        return Status::ok();
      },
      &abandoned);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release->store(true);  // the detached thread ends (it holds its own state)
  EXPECT_TRUE(abandoned);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("for rank 1, which did not arrive"), std::string::npos) << st.message();
  EXPECT_LT(s, 5.0);  // timeout 0.3 s + grace min(0.3 s, 10 s)
}

TEST(LocalCommunicator, AbortWakesWaiters) {
  auto world = make_local_world(3, 60);
  std::string msg;
  std::thread waiter([&] {
    auto comm = local_communicator(world, 0);
    auto g = comm->make_group({0, 1, 2});
    try {
      g->barrier();
    } catch (const OasesError& e) {
      msg = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  local_communicator(world, 2)->abort("rank 2 failed: test");
  waiter.join();
  EXPECT_NE(msg.find("rank 2 failed"), std::string::npos) << msg;
}

// One collective node over a tp group of n threads; `in` is each rank's input.
std::vector<Tensor> run_collective(int n, const std::string& op, AttrMap attrs, const std::vector<Tensor>& in) {
  std::vector<Tensor> out(static_cast<size_t>(n));
  run_ranks(n, [&](Communicator& c, int r) {
    std::vector<int> all(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
    auto g = c.make_group(all);
    Graph gr;
    gr.opset_imports[""] = 17;
    ValueId x = gr.add_input("x", in[static_cast<size_t>(r)].dtype(), in[static_cast<size_t>(r)].shape());
    AttrMap a = attrs;
    a.set_int("mesh_axis", 0);
    a.set_int("group_size", n);
    NodeId nd = gr.add_node_new_outputs(op, {x}, 1, a, "coll", kOasesDomain);
    ASSERT_TRUE(infer_node(gr, nd).is_ok());
    gr.add_output(gr.node(nd).outputs[0]);
    ExecOptions eo;
    eo.groups = {g.get()};
    auto ex = Executor::create(gr, eo);
    ASSERT_TRUE(ex) << ex.status().message();
    auto res = (*ex)->run({{"x", in[static_cast<size_t>(r)]}});
    ASSERT_TRUE(res) << res.status().message();
    out[static_cast<size_t>(r)] = (*res)[0];
  });
  return out;
}

Tensor iota(const Shape& s, float base) {
  Tensor t(DType::kF32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] = base + static_cast<float>(i);
  return t;
}

// The nice values of this process's live communication threads (named "oases-comm" once their
// priority is set), read by the kernel from /proc/self/task/<tid>/stat (field 19); a thread that
// ended between the listing and the read is left out.
std::vector<int> comm_thread_nices() {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    if (!std::getline(comm, name) || name != "oases-comm") continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // "tid (comm) state ppid ...": fields from 3 on follow the last ')'; nice is field 19
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i) {
      if (i == 19) out.push_back(std::stoi(field));
    }
  }
  return out;
}

// Every thread of this process by name (what a failure below reports).
std::string thread_names() {
  std::string out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) out += (out.empty() ? "" : ", ") + e.path().filename().string() + ":" + name;
  }
  return out;
}

// The communication thread asks the OS for OASES_COMM_NICE nice levels from the process's (-10 by
// default; 0 leaves it), and the report says what it got. Checked on the threads themselves: the
// nice the kernel holds for each live communication thread (read from /proc while its executor
// runs) is the report's, and the asked one where the OS allows it (root here; a lower priority,
// OASES_COMM_NICE=3, is allowed to anyone), the process's where it refused.
TEST(CommThread, RunsAtTheNiceItAskedForAndSaysWhatItGot) {
  // each rank's nice values of the communication threads alive after its overlapped all-reduce
  auto overlapped_all_reduce = [] {
    std::mutex mu;
    std::vector<std::vector<int>> seen(2);
    run_ranks(2, [&](Communicator& c, int r) {
      auto grp = c.make_group({0, 1});
      Graph g;
      g.opset_imports[""] = 17;
      ValueId x = g.add_input("x", DType::kF32, {4});
      NodeId ar = g.add_node_new_outputs("AllReduce", {x}, 1, AttrMap{{"mesh_axis", Attribute::of_int(0)}}, "ar", kOasesDomain);
      ASSERT_TRUE(infer_node(g, ar).is_ok());
      g.add_output(g.node(ar).outputs[0]);
      ExecOptions eo;
      eo.groups = {grp.get()};
      eo.order = {{ScheduledOp::Kind::kCommStart, ar}, {ScheduledOp::Kind::kCommWait, ar}};
      auto ex = Executor::create(g, eo);
      ASSERT_TRUE(ex) << ex.status().message();
      auto res = (*ex)->run({{"x", iota({4}, static_cast<float>(r))}});
      ASSERT_TRUE(res) << res.status().message();
      EXPECT_FLOAT_EQ((*res)[0].data<float>()[3], 3.f + 4.f);
      // this executor's communication thread ran the all-reduce, so it is alive and named; the
      // listing is read again for up to 2 s should /proc not show it yet (CI once saw none on a
      // loaded machine)
      std::vector<int> nices = comm_thread_nices();
      for (int tries = 0; nices.empty() && tries < 200; ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        nices = comm_thread_nices();
      }
      if (nices.empty()) ADD_FAILURE() << "rank " << r << ": threads " << thread_names();
      std::lock_guard<std::mutex> lock(mu);
      seen[static_cast<size_t>(r)] = nices;
    });
    return seen;
  };
  // expect_threads_at WHEN SEEN NICE: every rank saw a communication thread, each at NICE
  auto expect_threads_at = [](const std::string& when, const std::vector<std::vector<int>>& seen, int nice) {
    for (size_t r = 0; r < seen.size(); ++r) {
      EXPECT_FALSE(seen[r].empty()) << when << ": rank " << r << " found no thread named oases-comm";
      for (int n : seen[r]) EXPECT_EQ(n, nice) << when << ": rank " << r << ": a communication thread at nice " << n;
    }
  };
  errno = 0;
  const int process = getpriority(PRIO_PROCESS, 0);  // the calling thread's, which the ranks' threads inherit
  ASSERT_EQ(errno, 0);

  unsetenv("OASES_COMM_NICE");
  auto seen = overlapped_all_reduce();
  std::string got = comm_thread_priority();
  const int raised = std::max(process - 10, -20);
  if (got.find("refused") != std::string::npos) {
    EXPECT_NE(geteuid(), 0u) << "root may raise a priority: " << got;
    EXPECT_EQ(got, fmt::format("communication threads at the process's nice {}: raising it was refused (needs CAP_SYS_NICE or ulimit -e)", process));
    expect_threads_at("refused", seen, process);
  } else {
    EXPECT_EQ(got, fmt::format("communication threads at nice {} (the process at {})", raised, process));
    expect_threads_at("default offset -10", seen, raised);
  }

  setenv("OASES_COMM_NICE", "3", 1);  // a lower priority: allowed without privileges
  seen = overlapped_all_reduce();
  got = comm_thread_priority();
  EXPECT_EQ(got, fmt::format("communication threads at nice {} (the process at {})", std::min(process + 3, 19), process));
  expect_threads_at("OASES_COMM_NICE=3", seen, std::min(process + 3, 19));

  setenv("OASES_COMM_NICE", "0", 1);
  seen = overlapped_all_reduce();
  unsetenv("OASES_COMM_NICE");
  got = comm_thread_priority();
  EXPECT_EQ(got, fmt::format("communication threads at the process's nice {} (OASES_COMM_NICE=0)", process));
  expect_threads_at("OASES_COMM_NICE=0", seen, process);
}

TEST(CollectiveKernels, GatherScatterSliceAgreeWithShardingOfTensors) {
  const int n = 2;
  Mesh mesh{{"tp"}, {n}};
  for (int segments : {1, 3}) {
    for (size_t dim : {0, 1, 2}) {
      Shape global{6, 6, 12};
      Tensor full = iota(global, 0.f);
      ShardingSpec spec = ShardingSpec::replicated(3).with_dim(dim, 0, segments);
      std::vector<Tensor> parts;
      for (int r = 0; r < n; ++r) parts.push_back(slice_for_rank(full, spec, mesh, r));
      AttrMap a{{"dim", Attribute::of_int(static_cast<int64_t>(dim))}, {"segments", Attribute::of_int(segments)}};
      // all-gather rebuilds the full tensor on every rank
      auto gathered = run_collective(n, "AllGather", a, parts);
      for (int r = 0; r < n; ++r)
        EXPECT_TRUE(gathered[static_cast<size_t>(r)].same_as(full)) << "AllGather dim " << dim << " segments " << segments;
      // shard-slice takes each rank's part of a replicated value
      auto sliced = run_collective(n, "ShardSlice", a, std::vector<Tensor>(n, full));
      for (int r = 0; r < n; ++r)
        EXPECT_TRUE(sliced[static_cast<size_t>(r)].same_as(parts[static_cast<size_t>(r)])) << "ShardSlice dim " << dim;
      // reduce-scatter of (rank + 1) * full gives each rank its part of sum_r (r + 1) * full
      std::vector<Tensor> scaled;
      for (int r = 0; r < n; ++r) {
        Tensor t = full.clone();
        for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data<float>()[i] *= static_cast<float>(r + 1);
        scaled.push_back(t);
      }
      auto scattered = run_collective(n, "ReduceScatter", a, scaled);
      Tensor total = full.clone();
      for (int64_t i = 0; i < total.numel(); ++i) total.mutable_data<float>()[i] *= static_cast<float>(n * (n + 1) / 2);
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(scattered[static_cast<size_t>(r)].same_as(slice_for_rank(total, spec, mesh, r))) << "ReduceScatter dim " << dim;
      }
    }
  }
}

TEST(CollectiveKernels, AllToAllMovesTheSplitDimension) {
  const int n = 2;
  Mesh mesh{{"tp"}, {n}};
  Tensor full = iota({4, 6}, 1.f);
  ShardingSpec rows = ShardingSpec::replicated(2).with_dim(0, 0), cols = ShardingSpec::replicated(2).with_dim(1, 0);
  std::vector<Tensor> in;
  for (int r = 0; r < n; ++r) in.push_back(slice_for_rank(full, rows, mesh, r));
  auto out = run_collective(n, "AllToAll", AttrMap{{"split_dim", Attribute::of_int(1)}, {"concat_dim", Attribute::of_int(0)}}, in);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(out[static_cast<size_t>(r)].same_as(slice_for_rank(full, cols, mesh, r)));
}

// The gradient of each collective is its dual (Megatron's f/g and their gather/scatter cousins).
TEST(Collectives, GradientIsTheDual) {
  struct Case {
    std::string op, dual;
    AttrMap attrs;
  };
  std::vector<Case> cases = {
      {"AllReduce", "Identity", {}},
      {"ParallelIdentity", "AllReduce", {}},
      {"AllGather", "ReduceScatter", AttrMap{{"dim", Attribute::of_int(1)}, {"segments", Attribute::of_int(3)}}},
      {"ReduceScatter", "AllGather", AttrMap{{"dim", Attribute::of_int(1)}}},
      {"ShardSlice", "AllGather", AttrMap{{"dim", Attribute::of_int(0)}}},
      {"AllToAll", "AllToAll", AttrMap{{"split_dim", Attribute::of_int(1)}, {"concat_dim", Attribute::of_int(0)}}},
      {"Broadcast", "AllReduce", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    Graph g;
    g.opset_imports[""] = 17;
    ValueId x = g.add_initializer("x", iota({6, 12}, 0.f));
    AttrMap a = c.attrs;
    a.set_int("mesh_axis", 1);
    a.set_int("group_size", 2);
    NodeId n = g.add_node_new_outputs(c.op, {x}, 1, a, "coll", kOasesDomain);
    ASSERT_TRUE(infer_node(g, n).is_ok());
    ValueId y = g.node(n).outputs[0];
    std::vector<int64_t> axes{0, 1};
    NodeId s = g.add_node_new_outputs("ReduceSum", {y}, 1, AttrMap{{"axes", Attribute::of_ints(axes)}, {"keepdims", Attribute::of_int(0)}});
    ASSERT_TRUE(infer_node(g, s).is_ok());
    auto bw = build_backward(g, g.node(s).outputs[0], {x});
    ASSERT_TRUE(bw) << bw.status().message();
    NodeId gp = g.value(bw->grads.at(x)).producer;
    ASSERT_NE(gp, kNoId);
    const Node& gn = g.node(gp);
    EXPECT_EQ(gn.op_type, c.dual);
    if (gn.domain == kOasesDomain) {
      EXPECT_EQ(gn.attrs.get_int("mesh_axis", -1), 1);
      EXPECT_EQ(gn.attrs.get_int("group_size", -1), 2);
      if (c.op == "AllToAll") {
        EXPECT_EQ(gn.attrs.get_int("split_dim", -1), 0);
        EXPECT_EQ(gn.attrs.get_int("concat_dim", -1), 1);
      } else if (c.attrs.has("dim")) {
        EXPECT_EQ(gn.attrs.get_int("dim", -1), c.attrs.get_int("dim", -2));
        EXPECT_EQ(gn.attrs.get_int("segments", 1), c.attrs.get_int("segments", 1));
      }
    }
  }
}

TEST(ShardingSpec, ValueTypeBasics) {
  Mesh m = Mesh::data_tensor(2, 4);
  ShardingSpec a = ShardingSpec::replicated(3).with_dim(0, 0).with_dim(2, 1, 3);
  ShardingSpec b = a;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.to_string(&m), "[S(dp), R, S(tp)/3]");
  EXPECT_TRUE(a.validate({4, 5, 24}, m).is_ok());
  EXPECT_FALSE(a.validate({4, 5, 18}, m).is_ok());  // 18 is not 3 segments x 4 ranks x k
  EXPECT_FALSE(a.validate({3, 5, 24}, m).is_ok());  // 3 rows over dp=2
  EXPECT_FALSE(ShardingSpec::replicated(2).with_dim(0, 1).with_dim(1, 1).validate({4, 4}, m).is_ok());  // tp twice
  EXPECT_EQ(a.local_shape({4, 5, 24}, m), (Shape{2, 5, 6}));
  ShardingSpec p = ShardingSpec::replicated(2).with_partial(1);
  EXPECT_EQ(p.to_string(&m), "[R, R] P(tp)");
  EXPECT_NE(p, ShardingSpec::replicated(2));
}

}  // namespace
}  // namespace oases
