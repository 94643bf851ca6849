// oases-reshard --shape 1024,1024,512 --src-mesh 2x4 --src S0RR --dst-mesh 2x4 --dst RS0R
//   [--src-ranks LIST --dst-ranks LIST] [--strategy sendrecv|allgather|broadcast|auto] [--compare]
//   [--plan-only] [--emulate-link bw=GBPS,latency=US --hosts N] [--local-ranks N] [--repeat R] [--max-memory BYTES]
//
// Cross-mesh resharding (planner/reshard.h) to see and measure: prints the unit tasks, the chosen
// senders and the one global order with the simulator's prediction; run under ranks (mpirun, or
// --local-ranks N threads) it moves an arange tensor from the source layout to the destination
// layout, times it (median of R runs after one warm-up) and checks every destination tile bit for
// bit. Exit 0 only when every tile is exact; 1 when one is not; 2 on bad input.
//
// A layout is one token per tensor dimension: R, S0, S1 or S01 (sharded over mesh axis 0, 1 or
// both), optionally ":P<axes>" for a partial-sum source; or, as the output writes it, a spec over
// axes m0, m1 ("[S(m0), R, R]", "[R, S(m01)] P(m1)"). The source mesh takes the first world
// ranks and the destination mesh the next ones unless --src-ranks/--dst-ranks place them; --hosts N
// spreads the world's ranks over N emulated hosts in order, whose cards --emulate-link models.
//
// Bounds (bad input is refused before any work, exit 2): each mesh, and the world the two take,
// at most 2^20 ranks (graph/mesh.h check_mesh_ranks, as for a plan's meshes); a shape of at most
// 32 dimensions and 2^31 - 1 elements; in a run, the tiles this process's ranks hold within
// --max-memory.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "executor/cpu/blas_select.h"
#include "tools/model_loader.h"
#include "tools/reshard_bench.h"

using namespace oases;

namespace {

// Per-rank tables (every rank's tile boxes) grow with mesh ranks x dimensions: both are bounded.
constexpr size_t kMaxShapeDims = 32;

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

struct Flags {
  std::string shape_s, src_mesh_s, dst_mesh_s, src_s, dst_s, src_ranks_s, dst_ranks_s, strategy_s = "auto", emulate,
      intra_s = "bw=10,latency=5", max_memory_s;
  bool plan_only = false, compare = false, quiet = false;
  int hosts = 1, repeat = 3;
  int64_t local_ranks = 0;
  double comm_timeout = kDefaultCommTimeoutS;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--shape", f.shape_s, "The tensor's shape, e.g. 1024,1024,512")->required();
  app.add_option("--src-mesh", f.src_mesh_s, "Source mesh shape, e.g. 2x4")->required();
  app.add_option("--src", f.src_s, "Source layout, one token per dimension: R, S0, S1, S01 (e.g. S0RR)")->required();
  app.add_option("--dst-mesh", f.dst_mesh_s, "Destination mesh shape")->required();
  app.add_option("--dst", f.dst_s, "Destination layout")->required();
  app.add_option("--src-ranks", f.src_ranks_s, "World ranks of the source mesh (default: the first ones)");
  app.add_option("--dst-ranks", f.dst_ranks_s, "World ranks of the destination mesh (default: the ones after the source's)");
  app.add_option("--strategy", f.strategy_s, "sendrecv | allgather | broadcast | auto (the fastest predicted)");
  app.add_flag("--compare", f.compare, "Run (or plan) every strategy and print them side by side");
  app.add_flag("--plan-only", f.plan_only, "Print the plan and its prediction; move nothing");
  app.add_option("--emulate-link", f.emulate, "Inter-host link bw=GBPS,latency=US: each host's card moves one transfer at a time");
  app.add_option("--intra-link", f.intra_s, "Link inside a host, for the prediction (and emulated with --emulate-link)");
  app.add_option("--hosts", f.hosts, "Spread the world's ranks over this many emulated hosts, in order");
  app.add_option("--local-ranks", f.local_ranks, "Run N ranks as threads of this process (instead of mpirun)");
  app.add_option("--repeat", f.repeat, "Timed runs after one warm-up (the median is reported)");
  app.add_option("--comm-timeout", f.comm_timeout, "Seconds a transfer waits for its peer before the job stops");
  app.add_option("--max-memory", f.max_memory_s,
                 "Most bytes the tiles of this process's ranks may take in a run, e.g. 8G (default: half the machine's RAM, at most 64G)");
  app.add_flag("-q,--quiet", f.quiet, "Print only the summary");
}

// The flags' problem; `needed` receives the world size its meshes take, `max_memory` the bytes a
// run's tiles may take in this process.
Expected<ReshardProblem> read_problem(const Flags& f, int64_t* needed, uint64_t* max_memory) {
  if (f.hosts < 1 || f.hosts > 4096) return error("--hosts must be 1 … 4096, not {}", f.hosts);
  if (f.repeat < 1 || f.repeat > 1000) return error("--repeat must be 1 … 1000, not {}", f.repeat);
  if (f.local_ranks < 0 || f.local_ranks > 1024) return error("--local-ranks must be 0 … 1024, not {}", f.local_ranks);
  if (!(f.comm_timeout > 0 && f.comm_timeout <= kMaxCommTimeoutS))
    return error("--comm-timeout must be in (0, {:g}] seconds, not {:g}", kMaxCommTimeoutS, f.comm_timeout);
  OASES_RETURN_IF_ERROR(parse_reshard_strategy(f.strategy_s).status());
  *max_memory = max_memory_bytes();
  if (!f.max_memory_s.empty()) {
    auto bytes = parse_byte_size(f.max_memory_s);
    if (!bytes) return bytes.status().with_context("--max-memory");
    *max_memory = *bytes;
  }
  ReshardProblem p;
  OASES_ASSIGN_OR_RETURN(p.shape, parse_list(f.shape_s, "--shape", 0, int64_t{1} << 40));
  if (p.shape.size() > kMaxShapeDims) return error("--shape: {} dimensions, more than {}", p.shape.size(), kMaxShapeDims);
  auto sm = parse_mesh_shape(f.src_mesh_s);
  if (!sm) return sm.status().with_context("--src-mesh");
  auto dm = parse_mesh_shape(f.dst_mesh_s);
  if (!dm) return dm.status().with_context("--dst-mesh");
  p.element_bytes = 4;
  {
    // bounded so that one tile, and the arange check, fit a machine: 2^31 elements at most
    int64_t n = 1;
    for (int64_t d : p.shape) n = (d == 0 || n <= (int64_t{1} << 31) / std::max<int64_t>(d, 1)) ? n * d : (int64_t{1} << 32);
    if (n > (int64_t{1} << 31) - 1) return error("--shape {}: more than 2^31 - 1 elements", f.shape_s);
  }
  Mesh src_mesh = *sm, dst_mesh = *dm;
  auto ss = parse_layout(f.src_s, p.shape.size(), &src_mesh);
  if (!ss) return ss.status().with_context("--src");
  auto ds = parse_layout(f.dst_s, p.shape.size(), &dst_mesh);
  if (!ds) return ds.status().with_context("--dst");
  p.src = {PlacedMesh::contiguous(src_mesh, 0), *ss};
  p.dst = {PlacedMesh::contiguous(dst_mesh, src_mesh.size()), *ds};
  if (!f.src_ranks_s.empty()) {
    OASES_ASSIGN_OR_RETURN(p.src.placed.ranks, parse_list(f.src_ranks_s, "--src-ranks", 0, kMaxMeshRanks - 1));
  }
  if (!f.dst_ranks_s.empty()) {
    OASES_ASSIGN_OR_RETURN(p.dst.placed.ranks, parse_list(f.dst_ranks_s, "--dst-ranks", 0, kMaxMeshRanks - 1));
  } else if (!f.src_ranks_s.empty()) {
    p.dst.placed = PlacedMesh::contiguous(dst_mesh, *std::max_element(p.src.placed.ranks.begin(), p.src.placed.ranks.end()) + 1);
  }
  *needed = 1;
  for (int64_t r : p.src.placed.ranks) *needed = std::max(*needed, r + 1);
  for (int64_t r : p.dst.placed.ranks) *needed = std::max(*needed, r + 1);
  // the world is a mesh of its own (its ranks' hosts, the run's one axis): bounded alike
  if (*needed > kMaxMeshRanks)
    return error(
        "--src-mesh {} and --dst-mesh {} take world ranks 0 … {}, more than {} ranks in all (overlap them with --src-ranks/--dst-ranks)",
        f.src_mesh_s, f.dst_mesh_s, *needed - 1, kMaxMeshRanks);
  return p;
}

// The bytes of source and destination tiles that the ranks of this process hold at once in a
// run: every world rank under --local-ranks, else one rank a process (the largest, so that every
// process finds the same). A lower bound: packed transfers and receive buffers come on top.
Expected<uint64_t> tile_bytes_held(const ReshardProblem& p, int64_t world, bool every_rank) {
  auto src = tile_boxes(p.src.spec, p.shape, p.src.placed.mesh);
  if (!src) return src.status();
  auto dst = tile_boxes(p.dst.spec, p.shape, p.dst.placed.mesh);
  if (!dst) return dst.status();
  auto bytes_of = [&](const TileMap& t, int64_t mesh_rank) {
    uint64_t n = 0;
    if (mesh_rank < 0) return n;
    for (const Box& b : t.boxes.at(static_cast<size_t>(mesh_rank))) n += static_cast<uint64_t>(b.numel() * p.element_bytes);
    return n;
  };
  uint64_t total = 0, largest = 0;
  for (int64_t w = 0; w < world; ++w) {
    uint64_t n = bytes_of(*src, p.src.placed.mesh_rank(w)) + bytes_of(*dst, p.dst.placed.mesh_rank(w));
    total += n;
    largest = std::max(largest, n);
  }
  return every_rank ? total : largest;
}

void print_rows(const std::vector<ReshardRow>& rows, bool all_exact) {
  std::printf("%-10s %12s %12s %12s %8s %10s  %s\n", "strategy", "measured_ms", "predicted_ms", "bound_ms", "error", "x_bound", "check");
  for (const ReshardRow& r : rows) {
    std::printf("%-10s %12.3f %12.3f %12.3f %7.1f%% %10.2f  %s\n", strategy_name(r.strategy), r.measured_s * 1e3, r.predicted_s * 1e3,
                r.lower_bound_s * 1e3, r.measured_s > 0 ? (r.predicted_s / r.measured_s - 1) * 100 : 0.0,
                r.lower_bound_s > 0 ? r.measured_s / r.lower_bound_s : 0.0, r.exact ? "bit-exact" : "MISMATCH");
  }
  if (!all_exact) std::fprintf(stderr, "error: a destination tile differs from the expected slice\n");
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  return run_tool([&] {
    CLI::App app{"oases-reshard: plan, run and check a cross-mesh resharding"};
    Flags f;
    add_flags(app, f);
    if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
    int64_t needed = 1;
    uint64_t max_memory = 0;
    auto problem = read_problem(f, &needed, &max_memory);
    if (!problem) return fail_with(problem.status());
    const ReshardProblem& p = *problem;
    LinkModel inter{1.25, 50};  // the prediction's default: 10 Gbit/s between hosts
    if (!f.emulate.empty()) {
      auto lm = parse_link_model(f.emulate);
      if (!lm) return fail_with(lm.status());
      inter = *lm;
    }
    auto intra = parse_link_model(f.intra_s);
    if (!intra) return fail_with(intra.status().with_context("--intra-link"));

    LaunchOptions lo;
    lo.local_ranks = f.plan_only ? 0 : f.local_ranks;
    lo.comm_timeout = f.comm_timeout;
    auto launcher = RankLauncher::start(&argc, &argv, lo);
    if (!launcher) return fail_with(launcher.status());
    RankLauncher& L = **launcher;
    int64_t world = f.plan_only ? needed : std::max<int64_t>(L.world(), 1);
    if (!f.plan_only && world < needed)
      return L.fail_before_run(
          error("the meshes need {} ranks (world ranks 0 … {}), the job has {}: start it with mpirun -np {} or --local-ranks {}", needed,
                needed - 1, world, needed, needed));
    if (!f.plan_only) {
      // refused before anything is allocated (a run past the machine's memory is killed, not told)
      auto held = tile_bytes_held(p, world, !L.is_mpi());
      if (!held) return L.fail_before_run(held.status());
      if (*held > max_memory)
        return L.fail_before_run(error("--shape {}: the tiles of {} would take {} bytes, over --max-memory {} bytes{}", f.shape_s,
                                       L.is_mpi() ? "one rank" : fmt::format("this process's {} ranks", world), *held, max_memory,
                                       f.max_memory_s.empty() ? " (the default)" : ""));
    }
    ReshardBenchOptions bo;
    bo.cluster = ReshardCluster::spread(world, f.hosts, inter, *intra);
    std::vector<ReshardStrategy> strategies{*parse_reshard_strategy(f.strategy_s)};
    if (f.compare) strategies = {ReshardStrategy::kSendRecv, ReshardStrategy::kAllGather, ReshardStrategy::kBroadcast};
    std::vector<ReshardPlan> plans;
    for (ReshardStrategy s : strategies) {
      auto plan = plan_reshard(p, bo.cluster, {s});
      if (!plan) return L.fail_before_run(plan.status());
      plans.push_back(std::move(*plan));
    }
    const bool printer = L.process_rank() == 0;
    if (printer) {
      std::printf("%s %s on %s → %s on %s, %lld ranks on %d host(s), link %.3g GB/s %.3g us between hosts\n", shape_str(p.shape).c_str(),
                  layout_string(p.src.spec, p.src.placed.mesh).c_str(), p.src.placed.to_string().c_str(),
                  layout_string(p.dst.spec, p.dst.placed.mesh).c_str(), p.dst.placed.to_string().c_str(), static_cast<long long>(world),
                  f.hosts, inter.bandwidth_gbps, inter.latency_us);
      if (!f.quiet) {
        for (const ReshardPlan& plan : plans) std::printf("%s", describe(plan, bo.cluster).c_str());
      }
    }
    ReshardBenchResult result;
    for (const ReshardPlan& plan : plans) result.rows.push_back({plan.strategy, plan.predicted_s, plan.lower_bound_s, 0, 0, true});
    if (f.plan_only) {
      for (const ReshardRow& r : result.rows)
        std::printf("%-10s predicted %.3f ms (lower bound %.3f ms)\n", strategy_name(r.strategy), r.predicted_s * 1e3, r.lower_bound_s * 1e3);
      return 0;
    }
    bo.world = world;
    bo.repeat = f.repeat;
    bo.comm_timeout = f.comm_timeout;
    bo.emulate = !f.emulate.empty();
    bo.cards_folder = inter.enabled() && bo.emulate;
    Mesh world_mesh{{"world"}, {world}, {}};
    int rc = L.run(world_mesh, {}, [&](RankRuntime& rt) { return bench_reshard_rank(rt, p, plans, bo, &result); });
    if (rc != 0) return rc;
    if (printer) print_rows(result.rows, result.all_exact);
    return result.all_exact ? 0 : 1;
  });
}
