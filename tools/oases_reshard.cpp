// oases-reshard --shape 1024,1024,512 --src-mesh 2x4 --src S0RR --dst-mesh 2x4 --dst RS0R
//   [--src-ranks LIST --dst-ranks LIST] [--strategy sendrecv|allgather|broadcast|auto] [--compare]
//   [--plan-only] [--emulate-link bw=GBPS,latency=US --hosts N] [--local-ranks N] [--repeat R]
//
// Cross-mesh resharding (planner/reshard.h) to see and measure: prints the unit tasks, the chosen
// senders and the one global order with the simulator's prediction; run under ranks (mpirun, or
// --local-ranks N threads) it moves an arange tensor from the source layout to the destination
// layout, times it (median of R runs after one warm-up) and checks every destination tile bit for
// bit. Exit 0 only when every tile is exact; 1 when one is not; 2 on bad input.
//
// A layout is one token per tensor dimension: R, S0, S1 or S01 (sharded over mesh axis 0, 1 or
// both), optionally ":P<axes>" for a partial-sum source. The source mesh takes the first world
// ranks and the destination mesh the next ones unless --src-ranks/--dst-ranks place them; --hosts N
// spreads the world's ranks over N emulated hosts in order, whose cards --emulate-link models.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "executor/cpu/blas_select.h"
#include "executor/launcher.h"
#include "executor/reshard_runner.h"
#include "tools/model_loader.h"

using namespace oases;

namespace {

using Clock = std::chrono::steady_clock;

Expected<std::vector<int64_t>> parse_list(const std::string& s, const char* flag, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) return error("{} '{}': '{}' is not a whole number", flag, s, item);
    if (v < lo || v > hi) return error("{} '{}': {} is outside {} … {}", flag, s, v, lo, hi);
    out.push_back(v);
  }
  if (out.empty()) return error("{} is empty", flag);
  return out;
}

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

struct Row {
  ReshardStrategy strategy;
  double predicted_s = 0, lower_bound_s = 0, measured_s = 0;
  int transfers = 0;
  bool exact = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-reshard: plan, run and check a cross-mesh resharding"};
    std::string shape_s, src_mesh_s, dst_mesh_s, src_s, dst_s, src_ranks_s, dst_ranks_s, strategy_s = "auto", emulate,
                                                                                         intra_s = "bw=10,latency=5";
    bool plan_only = false, compare = false, quiet = false;
    int hosts = 1, repeat = 3;
    int64_t local_ranks = 0;
    double comm_timeout = kDefaultCommTimeoutS;
    app.add_option("--shape", shape_s, "The tensor's shape, e.g. 1024,1024,512")->required();
    app.add_option("--src-mesh", src_mesh_s, "Source mesh shape, e.g. 2x4")->required();
    app.add_option("--src", src_s, "Source layout, one token per dimension: R, S0, S1, S01 (e.g. S0RR)")->required();
    app.add_option("--dst-mesh", dst_mesh_s, "Destination mesh shape")->required();
    app.add_option("--dst", dst_s, "Destination layout")->required();
    app.add_option("--src-ranks", src_ranks_s, "World ranks of the source mesh (default: the first ones)");
    app.add_option("--dst-ranks", dst_ranks_s, "World ranks of the destination mesh (default: the ones after the source's)");
    app.add_option("--strategy", strategy_s, "sendrecv | allgather | broadcast | auto (the fastest predicted)");
    app.add_flag("--compare", compare, "Run (or plan) every strategy and print them side by side");
    app.add_flag("--plan-only", plan_only, "Print the plan and its prediction; move nothing");
    app.add_option("--emulate-link", emulate, "Inter-host link bw=GBPS,latency=US: each host's card moves one transfer at a time");
    app.add_option("--intra-link", intra_s, "Link inside a host, for the prediction (and emulated with --emulate-link)");
    app.add_option("--hosts", hosts, "Spread the world's ranks over this many emulated hosts, in order");
    app.add_option("--local-ranks", local_ranks, "Run N ranks as threads of this process (instead of mpirun)");
    app.add_option("--repeat", repeat, "Timed runs after one warm-up (the median is reported)");
    app.add_option("--comm-timeout", comm_timeout, "Seconds a transfer waits for its peer before the job stops");
    app.add_flag("-q,--quiet", quiet, "Print only the summary");
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;

    if (hosts < 1 || hosts > 4096) return fail_with(error("--hosts must be 1 … 4096, not {}", hosts));
    if (repeat < 1 || repeat > 1000) return fail_with(error("--repeat must be 1 … 1000, not {}", repeat));
    if (local_ranks < 0 || local_ranks > 1024) return fail_with(error("--local-ranks must be 0 … 1024, not {}", local_ranks));
    if (!(comm_timeout > 0 && comm_timeout <= kMaxCommTimeoutS))
      return fail_with(error("--comm-timeout must be in (0, {:g}] seconds, not {:g}", kMaxCommTimeoutS, comm_timeout));
    auto strategy = parse_reshard_strategy(strategy_s);
    if (!strategy) return fail_with(strategy.status());
    auto shape = parse_list(shape_s, "--shape", 0, int64_t{1} << 40);
    if (!shape) return fail_with(shape.status());
    auto sm = parse_mesh_shape(src_mesh_s);
    if (!sm) return fail_with(sm.status().with_context("--src-mesh"));
    auto dm = parse_mesh_shape(dst_mesh_s);
    if (!dm) return fail_with(dm.status().with_context("--dst-mesh"));
    ReshardProblem p;
    p.shape = *shape;
    p.element_bytes = 4;
    {
      // bounded so that one tile, and the arange check, fit a machine: 2^31 elements at most
      int64_t n = 1;
      for (int64_t d : p.shape) n = (d == 0 || n <= (int64_t{1} << 31) / std::max<int64_t>(d, 1)) ? n * d : (int64_t{1} << 32);
      if (n > (int64_t{1} << 31) - 1) return fail_with(error("--shape {}: more than 2^31 - 1 elements", shape_s));
    }
    Mesh src_mesh = *sm, dst_mesh = *dm;
    auto ss = parse_layout(src_s, p.shape.size(), &src_mesh);
    if (!ss) return fail_with(ss.status().with_context("--src"));
    auto ds = parse_layout(dst_s, p.shape.size(), &dst_mesh);
    if (!ds) return fail_with(ds.status().with_context("--dst"));
    p.src = {PlacedMesh::contiguous(src_mesh, 0), *ss};
    p.dst = {PlacedMesh::contiguous(dst_mesh, src_mesh.size()), *ds};
    if (!src_ranks_s.empty()) {
      auto r = parse_list(src_ranks_s, "--src-ranks", 0, 1 << 20);
      if (!r) return fail_with(r.status());
      p.src.placed.ranks = *r;
    }
    if (!dst_ranks_s.empty()) {
      auto r = parse_list(dst_ranks_s, "--dst-ranks", 0, 1 << 20);
      if (!r) return fail_with(r.status());
      p.dst.placed.ranks = *r;
    } else if (!src_ranks_s.empty()) {
      p.dst.placed = PlacedMesh::contiguous(dst_mesh, *std::max_element(p.src.placed.ranks.begin(), p.src.placed.ranks.end()) + 1);
    }
    int64_t needed = 1;
    for (int64_t r : p.src.placed.ranks) needed = std::max(needed, r + 1);
    for (int64_t r : p.dst.placed.ranks) needed = std::max(needed, r + 1);

    LinkModel inter, intra;
    if (!emulate.empty()) {
      auto lm = parse_link_model(emulate);
      if (!lm) return fail_with(lm.status());
      inter = *lm;
    } else {
      inter = LinkModel{1.25, 50};  // the prediction's default: 10 Gbit/s between hosts
    }
    auto il = parse_link_model(intra_s);
    if (!il) return fail_with(il.status().with_context("--intra-link"));
    intra = *il;

    LaunchOptions lo;
    lo.local_ranks = plan_only ? 0 : local_ranks;
    lo.comm_timeout = comm_timeout;
    auto launcher = RankLauncher::start(&argc, &argv, lo);
    if (!launcher) return fail_with(launcher.status());
    RankLauncher& L = **launcher;
    int64_t world = plan_only ? needed : std::max<int64_t>(L.world(), 1);
    if (!plan_only && world < needed)
      return L.fail_before_run(
          error("the meshes need {} ranks (world ranks 0 … {}), the job has {}: start it with mpirun -np {} or --local-ranks {}", needed,
                needed - 1, world, needed, needed));
    ReshardCluster cluster = ReshardCluster::spread(world, hosts, inter, intra);

    std::vector<ReshardStrategy> strategies;
    if (compare) {
      strategies = {ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather, ReshardStrategy::kBroadcast};
    } else {
      strategies = {*strategy};
    }
    std::vector<ReshardPlan> plans;
    for (ReshardStrategy s : strategies) {
      auto plan = plan_reshard(p, cluster, {s});
      if (!plan) return L.fail_before_run(plan.status());
      plans.push_back(std::move(*plan));
    }
    const bool printer = L.process_rank() == 0;
    if (printer) {
      std::printf("%s %s on %s → %s on %s, %lld ranks on %d host(s), link %.3g GB/s %.3g us between hosts\n", shape_str(p.shape).c_str(),
                  layout_string(p.src.spec, p.src.placed.mesh).c_str(), p.src.placed.to_string().c_str(),
                  layout_string(p.dst.spec, p.dst.placed.mesh).c_str(), p.dst.placed.to_string().c_str(), static_cast<long long>(world),
                  hosts, inter.bandwidth_gbps, inter.latency_us);
      if (!quiet) {
        for (const ReshardPlan& plan : plans) std::printf("%s", describe(plan, cluster).c_str());
      }
    }
    std::vector<Row> rows;
    for (const ReshardPlan& plan : plans) rows.push_back({plan.strategy, plan.predicted_s, plan.lower_bound_s, 0, 0, true});
    if (plan_only) {
      for (const Row& r : rows)
        std::printf("%-10s predicted %.3f ms (lower bound %.3f ms)\n", strategy_name(r.strategy), r.predicted_s * 1e3,
                    r.lower_bound_s * 1e3);
      return 0;
    }

    // Emulated cards: lock files in a folder rank 0 makes and every rank learns.
    std::string cards_dir;
    std::mutex mu;
    bool all_exact = true;
    Mesh world_mesh{{"world"}, {world}, {}};
    int rc = L.run(world_mesh, {}, [&](RankRuntime& rt) -> Status {
      std::unique_ptr<Communicator> solo;
      std::shared_ptr<LocalWorld> solo_world;
      Communicator* comm = rt.communicator();
      if (!comm) {
        solo_world = make_local_world(1, comm_timeout);
        solo = local_communicator(solo_world, 0);
        comm = solo.get();
      }
      const int me = comm->rank();
      std::vector<int> everyone(static_cast<size_t>(world));
      for (int i = 0; i < world; ++i) everyone[static_cast<size_t>(i)] = i;
      CommGroup& all = comm->channel_group(everyone, 0);
      if (inter.enabled() && !emulate.empty()) {
        char path[256] = {0};
        if (me == 0) {
          std::string made = make_cards_folder();
          if (made.empty()) return error("cannot make a folder for the emulated cards in {}", std::filesystem::temp_directory_path().string());
          std::snprintf(path, sizeof path, "%s", made.c_str());
        }
        all.broadcast(path, sizeof path, 0);
        std::lock_guard<std::mutex> lock(mu);
        cards_dir = path;
      }
      HostCards cards(cards_dir);
      // This rank's source tile: arange (a partial source: each member of a partial group holds
      // a part, the parts summing to the expected value).
      auto src_tiles = tile_boxes(p.src.spec, p.shape, p.src.placed.mesh);
      auto dst_tiles = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh);
      if (!src_tiles || !dst_tiles) return src_tiles ? dst_tiles.status() : src_tiles.status();
      int64_t sr = p.src.placed.mesh_rank(me), partial_index = 0, partial_size = 1;
      bool partial = p.src.spec.any_partial();
      // every rank (destinations too) needs the group size for the expected sums
      if (partial) partial_size = static_cast<int64_t>(src_tiles->partial_groups.front().size());
      for (const auto& g : src_tiles->partial_groups) {
        auto it = std::find(g.begin(), g.end(), sr);
        if (it != g.end()) partial_index = it - g.begin();
      }
      for (size_t k = 0; k < plans.size(); ++k) {
        std::vector<double> times;
        bool exact = true;
        ReshardRunStats stats;
        for (int rep = 0; rep <= repeat; ++rep) {
          TileData src = TileData::zeros(*src_tiles, sr, 4);
          for (size_t b = 0; b < src.boxes.size(); ++b) {
            auto* v = reinterpret_cast<int32_t*>(src.data[b].data());
            for_each_index(src.boxes[b], p.shape, [&](int64_t i, int64_t flat) { v[i] = held_value(flat, partial_index, partial); });
          }
          ReshardRunOptions ro;
          ro.tag = 1;
          ro.dtype = DType::kI32;
          ro.cards = emulate.empty() ? nullptr : &cards;
          ro.cluster = cluster;
          all.barrier();
          auto t0 = Clock::now();
          stats = {};
          TileData dst = run_reshard(plans[k], p, *comm, src, ro, &stats);
          all.barrier();
          double dt = std::chrono::duration<double>(Clock::now() - t0).count();
          if (rep > 0) times.push_back(dt);
          for (size_t b = 0; b < dst.boxes.size(); ++b) {
            const auto* v = reinterpret_cast<const int32_t*>(dst.data[b].data());
            for_each_index(dst.boxes[b], p.shape,
                           [&](int64_t i, int64_t flat) { exact = exact && v[i] == expected_value(flat, partial_size, partial); });
          }
        }
        int32_t bad = exact ? 0 : 1;
        all.all_reduce(&bad, 1, DType::kI32, ReduceOp::kSum);
        double t = median(times);
        all.all_reduce(&t, 1, DType::kF64, ReduceOp::kMax);
        int32_t transfers = stats.transfers;
        all.all_reduce(&transfers, 1, DType::kI32, ReduceOp::kSum);
        if (me == 0) {
          std::lock_guard<std::mutex> lock(mu);
          rows[k].measured_s = t;
          rows[k].exact = bad == 0;
          rows[k].transfers = transfers;
          all_exact = all_exact && bad == 0;
        }
      }
      if (me == 0 && !cards_dir.empty()) std::filesystem::remove_all(cards_dir);
      return Status::ok();
    });
    if (rc != 0) return rc;
    if (printer) {
      std::printf("%-10s %12s %12s %12s %8s %10s  %s\n", "strategy", "measured_ms", "predicted_ms", "bound_ms", "error", "x_bound",
                  "check");
      for (const Row& r : rows) {
        std::printf("%-10s %12.3f %12.3f %12.3f %7.1f%% %10.2f  %s\n", strategy_name(r.strategy), r.measured_s * 1e3, r.predicted_s * 1e3,
                    r.lower_bound_s * 1e3, r.measured_s > 0 ? (r.predicted_s / r.measured_s - 1) * 100 : 0.0,
                    r.lower_bound_s > 0 ? r.measured_s / r.lower_bound_s : 0.0, r.exact ? "bit-exact" : "MISMATCH");
      }
      if (!all_exact) std::fprintf(stderr, "error: a destination tile differs from the expected slice\n");
    }
    return all_exact ? 0 : 1;
  });
}
