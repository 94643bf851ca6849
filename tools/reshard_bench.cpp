#include "tools/reshard_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

namespace oases {

namespace {

using Clock = std::chrono::steady_clock;

// The arange value of element `flat` on member `j` of a partial group of `p` (their sum is what
// the destination must hold), and that sum.
int32_t held_value(int64_t flat, int64_t j, bool partial) {
  return partial ? static_cast<int32_t>(flat % 65521 + j) : static_cast<int32_t>(flat);
}
int32_t expected_value(int64_t flat, int64_t p, bool partial) {
  return partial ? static_cast<int32_t>(p * (flat % 65521) + p * (p - 1) / 2) : static_cast<int32_t>(flat);
}

template <class F>
void for_each_index(const Box& b, const Shape& shape, F f) {
  if (b.empty()) return;
  std::vector<int64_t> i(b.offset.size(), 0);
  int64_t k = 0;
  while (true) {
    int64_t flat = 0;
    for (size_t d = 0; d < i.size(); ++d) flat = flat * shape[d] + b.offset[d] + i[d];
    f(k++, flat);
    size_t d = i.size();
    while (d > 0 && ++i[d - 1] == b.extent[d - 1]) i[--d] = 0;
    if (d == 0) break;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// This rank's place among the partial source's members: which part it holds of how many (every
// rank, destinations too, needs the group size for the expected sums).
struct PartialSource {
  bool partial = false;
  int64_t index = 0, size = 1;
};

// One plan: `repeat` timed runs after a warm-up; the row's measured time is the slowest rank's
// median.
Status measure_plan(const ReshardPlan& plan, const ReshardProblem& p, const ReshardBenchOptions& o, Communicator& comm, CommGroup& all,
                    const HostCards& cards, const TileMap& src_tiles, const PartialSource& ps, ReshardRow* row,
                    ReshardBenchResult* out) {
  const int me = comm.rank();
  const int64_t sr = p.src.placed.mesh_rank(me);
  std::vector<double> times;
  bool exact = true;
  ReshardRunStats stats;
  for (int rep = 0; rep <= o.repeat; ++rep) {
    TileData src = TileData::zeros(src_tiles, sr, 4);
    for (size_t b = 0; b < src.boxes.size(); ++b) {
      auto* v = reinterpret_cast<int32_t*>(src.data[b].data());
      for_each_index(src.boxes[b], p.shape, [&](int64_t i, int64_t flat) { v[i] = held_value(flat, ps.index, ps.partial); });
    }
    ReshardRunOptions ro;
    ro.tag = 1;
    ro.dtype = DType::kI32;
    ro.cards = o.emulate ? &cards : nullptr;
    ro.cluster = o.cluster;
    all.barrier();
    auto t0 = Clock::now();
    stats = {};
    TileData dst = run_reshard(plan, p, comm, src, ro, &stats);
    all.barrier();
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) times.push_back(dt);
    for (size_t b = 0; b < dst.boxes.size(); ++b) {
      const auto* v = reinterpret_cast<const int32_t*>(dst.data[b].data());
      for_each_index(dst.boxes[b], p.shape, [&](int64_t i, int64_t flat) { exact = exact && v[i] == expected_value(flat, ps.size, ps.partial); });
    }
  }
  int32_t bad = exact ? 0 : 1;
  all.all_reduce(&bad, 1, DType::kI32, ReduceOp::kSum);
  double t = median(times);
  all.all_reduce(&t, 1, DType::kF64, ReduceOp::kMax);
  int32_t transfers = stats.transfers;
  all.all_reduce(&transfers, 1, DType::kI32, ReduceOp::kSum);
  if (me == 0) {
    std::lock_guard<std::mutex> lock(out->mu);
    row->measured_s = t;
    row->exact = bad == 0;
    row->transfers = transfers;
    out->all_exact = out->all_exact && bad == 0;
  }
  return Status::ok();
}

}  // namespace

Status bench_reshard_rank(RankRuntime& rt, const ReshardProblem& p, const std::vector<ReshardPlan>& plans, const ReshardBenchOptions& o,
                          ReshardBenchResult* out) {
  std::unique_ptr<Communicator> solo;
  std::shared_ptr<LocalWorld> solo_world;
  Communicator* comm = rt.communicator();
  if (!comm) {
    solo_world = make_local_world(1, o.comm_timeout);
    solo = local_communicator(solo_world, 0);
    comm = solo.get();
  }
  const int me = comm->rank();
  std::vector<int> everyone(static_cast<size_t>(o.world));
  for (int i = 0; i < o.world; ++i) everyone[static_cast<size_t>(i)] = i;
  CommGroup& all = comm->channel_group(everyone, 0);
  // Emulated cards: lock files in a folder rank 0 makes and every rank learns.
  if (o.cards_folder) {
    char path[256] = {0};
    if (me == 0) {
      std::string made = make_cards_folder();
      if (made.empty()) return error("cannot make a folder for the emulated cards in {}", std::filesystem::temp_directory_path().string());
      std::snprintf(path, sizeof path, "%s", made.c_str());
    }
    all.broadcast(path, sizeof path, 0);
    std::lock_guard<std::mutex> lock(out->mu);
    out->cards_dir = path;
  }
  HostCards cards(out->cards_dir);
  // This rank's source tile: arange (a partial source: each member of a partial group holds
  // a part, the parts summing to the expected value).
  auto src_tiles = tile_boxes(p.src.spec, p.shape, p.src.placed.mesh);
  auto dst_tiles = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh);
  if (!src_tiles || !dst_tiles) return src_tiles ? dst_tiles.status() : src_tiles.status();
  PartialSource ps;
  const int64_t sr = p.src.placed.mesh_rank(me);
  ps.partial = p.src.spec.any_partial();
  if (ps.partial) ps.size = static_cast<int64_t>(src_tiles->partial_groups.front().size());
  for (const auto& g : src_tiles->partial_groups) {
    auto it = std::find(g.begin(), g.end(), sr);
    if (it != g.end()) ps.index = it - g.begin();
  }
  for (size_t k = 0; k < plans.size(); ++k)
    OASES_RETURN_IF_ERROR(measure_plan(plans[k], p, o, *comm, all, cards, *src_tiles, ps, &out->rows[k], out));
  if (me == 0 && !out->cards_dir.empty()) std::filesystem::remove_all(out->cards_dir);
  return Status::ok();
}

}  // namespace oases
