#include "tools/train_driver.h"

#include <filesystem>

#include "executor/device.h"
#include "executor/emulated_link.h"
#include "executor/launcher.h"
#include "executor/reshard_runner.h"
#include "tools/rank_run.h"

namespace fs = std::filesystem;

namespace oases {

namespace {

// One rank's training loop. Under --pp, `rt` is the rank's stage (its mesh, groups and rank in
// the stage) and `world` every rank of the run: the loss comes from the last stage, the gradient
// norm sums the stages (a tied weight counted once), and checkpoints, gradient dumps and exports
// pool every stage's parameters on world rank 0 (executor/stage_rules.h).
Status run_rank(const TrainSetup& s, RankRuntime& rt, RankRuntime* world = nullptr) {
  if (s.piped() && !world) return Status::error("internal: a pipeline rank needs the world's runtime");
  RankRun run(s, rt);
  OASES_RETURN_IF_ERROR(run.start(world));
  OASES_RETURN_IF_ERROR(run.before_training());
  for (int64_t step = run.first_step(); step < run.end_step(); ++step) OASES_RETURN_IF_ERROR(run.step(step));
  return run.finish();
}

}  // namespace

int run_training(TrainArgs& a, int argc, char** argv) {
  if (a.device == "cuda") {
    if (a.zero > 0) return fail_with(Status::error(kZeroNotOnGpu));
    if (Status st = cuda_usable(); !st.is_ok()) return fail_with(st);
  }
  // one rank, N threads, or MPI processes
  LaunchOptions lo;
  lo.local_ranks = a.local_ranks;
  lo.threads = a.threads;
  lo.comm_timeout = a.comm_timeout;
  auto launcher = RankLauncher::start(&argc, &argv, lo);
  if (!launcher) return fail_with(launcher.status());
  RankLauncher& l = **launcher;
  auto setup = prepare_training(a, l.world());
  if (!setup) return l.fail_before_run(setup.status());
  LinkModel link;
  if (!a.emulate_link.empty()) {
    auto lm = parse_link_model(a.emulate_link);
    if (!lm) return fail_with(lm.status());
    link = *lm;
  }
  // groups inside one emulated host are not slowed; the link emulated is the one between hosts
  if (!setup->host_of.empty()) set_emulated_hosts(setup->host_of);
  if (!setup->piped()) return l.run(setup->gp().mesh(), link, [&](RankRuntime& rt) { return run_rank(*setup, rt); });
  // a pipeline: the world's ranks, each running its stage on the stage's own mesh
  const Plan& pl = setup->plan();
  Mesh everyone{{"world"}, {pl.world()}, {}};
  const bool cards = a.hosts > 1 && link.enabled();
  int rc = l.run(everyone, link, [&](RankRuntime& world) -> Status {
    if (cards) {
      // the emulated hosts' network cards: lock files in a folder world rank 0 makes
      std::string dir = world.gather_strings(world.rank() == 0 ? make_cards_folder() : "")[0];
      if (dir.empty()) return error("cannot make a folder for the emulated hosts' cards in {}", fs::temp_directory_path().string());
      set_emulated_cards_dir(dir);
    }
    const int st = pl.stage_of_rank(world.rank());
    PlacedMesh placed = PlacedMesh::contiguous(setup->stage_program(st).mesh(), pl.first_rank(st));
    OASES_ASSIGN_OR_RETURN(auto stage_rt, RankRuntime::create(world.communicator(), placed, link));
    return run_rank(*setup, *stage_rt, &world);
  });
  if (cards && l.process_rank() == 0 && !emulated_cards_dir().empty()) {
    std::error_code ec;
    fs::remove_all(emulated_cards_dir(), ec);
  }
  return rc;
}

}  // namespace oases
