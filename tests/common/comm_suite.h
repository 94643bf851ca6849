// The shared test suite of the Communicator interface: every implementation (local threads, MPI,
// NCCL) runs it on each of its ranks. Each check returns an empty string or what went wrong; the
// caller reports the failures. Every rank must call the checks in the same order.
#pragma once

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "executor/communicator.h"
#include "executor/distributed.h"

namespace oases::testing {

inline std::vector<std::string> run_comm_suite(Communicator& comm) {
  std::vector<std::string> failures;
  int rank = comm.rank(), n = comm.size();
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) failures.push_back(fmt::format("rank {}: {}", rank, what));
  };
  std::vector<int> all(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  auto world = comm.make_group(all);
  check(world->size() == n && world->rank() == rank, "world group size/rank");

  // all-reduce: sums and maxima, several types, sizes that do not divide by n
  for (int64_t count : {1, 7, 1000}) {
    std::vector<float> f(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) f[i] = static_cast<float>(rank + 1) * 0.5f + static_cast<float>(i);
    world->all_reduce(f.data(), count, DType::kF32, ReduceOp::kSum);
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>(r + 1) * 0.5f + static_cast<float>(i);
      ok &= std::abs(f[i] - want) <= 1e-4f * std::abs(want);
    }
    check(ok, fmt::format("all_reduce sum float32 x {}", count));
    std::vector<int64_t> m(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) m[i] = (rank * 31 + i * 7) % 13;
    world->all_reduce(m.data(), count, DType::kI64, ReduceOp::kMax);
    ok = true;
    for (int64_t i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int r = 0; r < n; ++r) want = std::max<int64_t>(want, (r * 31 + i * 7) % 13);
      ok &= m[i] == want;
    }
    check(ok, fmt::format("all_reduce max int64 x {}", count));
  }
  // every member gets bit-identical sums (replicated parameters stay identical)
  {
    std::vector<double> d(33);
    for (size_t i = 0; i < d.size(); ++i) d[i] = std::sin(static_cast<double>(rank * 100 + i)) * 1e-3 + 1.0 / (rank + 3);
    world->all_reduce(d.data(), 33, DType::kF64, ReduceOp::kSum);
    std::vector<double> gathered(33 * static_cast<size_t>(n));
    world->all_gather(d.data(), gathered.data(), 33 * 8);
    bool same = true;
    for (int r = 1; r < n; ++r) same &= std::memcmp(gathered.data(), gathered.data() + 33 * r, 33 * 8) == 0;
    check(same, "all_reduce results are bit-identical on every member");
  }
  // all-gather
  {
    std::vector<int32_t> in(5), out(5 * static_cast<size_t>(n));
    for (int i = 0; i < 5; ++i) in[static_cast<size_t>(i)] = rank * 10 + i;
    world->all_gather(in.data(), out.data(), 5 * 4);
    bool ok = true;
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 5; ++i) ok &= out[static_cast<size_t>(r * 5 + i)] == r * 10 + i;
    }
    check(ok, "all_gather");
  }
  // reduce-scatter
  {
    std::vector<float> in(3 * static_cast<size_t>(n)), out(3);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank) + static_cast<float>(i);
    world->reduce_scatter(in.data(), out.data(), 3, DType::kF32, ReduceOp::kSum);
    bool ok = true;
    for (int i = 0; i < 3; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>(r) + static_cast<float>(rank * 3 + i);
      ok &= std::abs(out[static_cast<size_t>(i)] - want) < 1e-4f;
    }
    check(ok, "reduce_scatter");
  }
  // all-to-all
  {
    std::vector<int64_t> in(2 * static_cast<size_t>(n)), out(2 * static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      in[static_cast<size_t>(2 * j)] = rank * 100 + j;
      in[static_cast<size_t>(2 * j + 1)] = -(rank * 100 + j);
    }
    world->all_to_all(in.data(), out.data(), 2 * 8);
    bool ok = true;
    for (int j = 0; j < n; ++j)
      ok &= out[static_cast<size_t>(2 * j)] == j * 100 + rank && out[static_cast<size_t>(2 * j + 1)] == -(j * 100 + rank);
    check(ok, "all_to_all");
  }
  // ring shifts (collective matmuls): by one and by two, and the all-gather-based default
  for (int offset : {1, 2, -1}) {
    std::vector<int64_t> in{rank * 10 + 1, rank * 10 + 2, rank * 10 + 3}, out(3, -7), via_default(3, -7);
    world->shift(in.data(), out.data(), 3 * 8, offset);
    world->CommGroup::shift(in.data(), via_default.data(), 3 * 8, offset);
    int from = ((rank - offset) % n + n) % n;
    check(out[0] == from * 10 + 1 && out[2] == from * 10 + 3 && out == via_default, "shift by " + std::to_string(offset));
  }
  // broadcast from the last member
  {
    std::vector<double> b(4, rank == n - 1 ? 2.5 : -1.0);
    world->broadcast(b.data(), 4 * 8, n - 1);
    check(b[0] == 2.5 && b[3] == 2.5, "broadcast");
  }
  // subgroups: pairs (0,1), (2,3), ... created by every rank in the same order
  if (n % 2 == 0) {
    std::vector<int> pair{rank - rank % 2, rank - rank % 2 + 1};
    auto g = comm.make_group(pair);
    check(g->size() == 2 && g->rank() == rank % 2, "pair group size/rank");
    float x = static_cast<float>(rank);
    g->all_reduce(&x, 1, DType::kF32, ReduceOp::kSum);
    check(x == static_cast<float>(pair[0] + pair[1]), "all_reduce in a pair group");
    // strided groups (0,2), (1,3): the other mesh axis
    if (n >= 4 && n % 2 == 0) {
      std::vector<int> col;
      for (int r = rank % 2; r < n; r += 2) col.push_back(r);
      auto c = comm.make_group(col);
      int64_t y = rank;
      c->all_reduce(&y, 1, DType::kI64, ReduceOp::kSum);
      int64_t want = 0;
      for (int r : col) want += r;
      check(y == want, "all_reduce in a strided group");
    }
  }
  // point to point on channels: a ring of sends, two tags between the same pair kept apart, and
  // messages of one (from, to, tag) in order
  if (n > 1) {
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    std::vector<int32_t> out1(6), out2(3), in1(6, -1), in2(3, -1), in3(6, -1);
    for (int i = 0; i < 6; ++i) out1[static_cast<size_t>(i)] = rank * 100 + i;
    for (int i = 0; i < 3; ++i) out2[static_cast<size_t>(i)] = -(rank * 100 + i);
    auto r2 = comm.irecv(in2.data(), 12, prev, 7);  // posted before the tag-5 receives
    auto r1 = comm.irecv(in1.data(), 24, prev, 5);
    auto r3 = comm.irecv(in3.data(), 24, prev, 5);
    auto s1 = comm.isend(out1.data(), 24, next, 5);
    auto s2 = comm.isend(out2.data(), 12, next, 7);
    std::vector<int32_t> out3(out1.rbegin(), out1.rend());
    auto s3 = comm.isend(out3.data(), 24, next, 5);
    for (auto* r : {r1.get(), r2.get(), r3.get(), s1.get(), s2.get(), s3.get()}) r->wait();
    bool ok = true;
    for (int i = 0; i < 6; ++i) ok &= in1[static_cast<size_t>(i)] == prev * 100 + i && in3[static_cast<size_t>(i)] == prev * 100 + 5 - i;
    for (int i = 0; i < 3; ++i) ok &= in2[static_cast<size_t>(i)] == -(prev * 100 + i);
    check(ok, "isend/irecv around a ring, two tags, in order");
    // channel groups over any rank set: [last, 0] (an order that is not ascending) broadcasting
    // from its first member, then the same ranks on another channel
    std::vector<int> duo{n - 1, 0};
    if (rank == 0 || rank == n - 1) {
      for (int tag : {3, 4}) {
        CommGroup& g = comm.channel_group(duo, tag);
        check(g.size() == 2 && g.members() == duo && g.rank() == (rank == n - 1 ? 0 : 1), "channel group members");
        std::vector<float> b(5, rank == n - 1 ? 1.5f * static_cast<float>(tag) : 0.f);
        auto req = g.ibroadcast(b.data(), 20, 0);
        req->wait();
        check(b[0] == 1.5f * static_cast<float>(tag) && b[4] == b[0], fmt::format("ibroadcast on channel {}", tag));
        check(&comm.channel_group(duo, tag) == &g, "channel groups are cached");
      }
    }
  }
  // meshes that leave world ranks out (pipeline stages): the first half of the world in order, the
  // second half reversed; each mesh's groups are made by its members alone
  if (n >= 2 && n % 2 == 0) {
    int half = n / 2;
    bool first = rank < half;
    PlacedMesh pm;
    pm.mesh = Mesh{{"tp"}, {half}, {}};
    for (int i = 0; i < half; ++i) pm.ranks.push_back(first ? i : n - 1 - i);
    auto rt = RankRuntime::create(&comm, pm);
    check(static_cast<bool>(rt), rt ? "" : "placed mesh: " + rt.status().message());
    if (rt) {
      check((*rt)->rank() == (first ? rank : n - 1 - rank), "placed mesh: rank() is the mesh rank");
      int64_t x = rank, want = 0;
      for (int64_t r : pm.ranks) want += r;
      (*rt)->axis_groups()[0]->all_reduce(&x, 1, DType::kI64, ReduceOp::kSum);
      check(x == want, "placed mesh: all-reduce over its own members");
    }
  }
  world->barrier();
  return failures;
}

}  // namespace oases::testing
