#!/usr/bin/env bash
# scripts/sanitize.sh [asan|tsan|ci|all]: the sanitizer builds, each in its own build folder (CPU
# only, -DOASES_CUDA=OFF, -O1 -g1: ASan's advice, and twice as quick to build as -O2 -g; unity
# builds of sixteen sources a unit: eight cut the compile work of a cold build by about 40%, sixteen
# by about 10% more), and the tests they run. Exits 1 when a test fails or a sanitizer reports.
#
#   asan  build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (no recovery, leaks checked),
#         every unit, conformance, e2e and MPI test (thread ranks and MPI ranks included).
#   tsan  build-tsan: ThreadSanitizer (-O0: a quarter less compile work than -O1, and its runs are a
#         few steps of small models), oases-train with thread ranks (2 and 4) on the overlapped
#         schedules (oases and overlap_checkpoint, chunked), with and without an emulated link,
#         and the communicator and thread-pool unit tests.
#   ci    the lean pass CI runs (.ci/run): the ASan+UBSan unit tests, a few thread-rank and MPI
#         runs of oases-train under ASan (and the MPI communicator suite), and one TSan run of
#         thread ranks on the oases schedule; builds only the targets these need, the ASan ones in
#         the fuzz targets' clang folder (build-fuzz, scripts/fuzz_configure.sh).
# Env: OASES_ASAN_BUILD_DIR, OASES_TSAN_BUILD_DIR, CTEST_ARGS (extra ctest arguments, e.g. -L unit),
#      OASES_SANITIZE_JOBS (build jobs, default: the cores and memory scripts/cores.sh finds).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${1:-all}
# shellcheck source=scripts/cores.sh
source "$ROOT/scripts/cores.sh"
JOBS=${OASES_SANITIZE_JOBS:-$(oases_build_jobs)}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
command -v ccache >/dev/null && GEN+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
ASAN_DIR=${OASES_ASAN_BUILD_DIR:-build-asan}
TSAN_DIR=${OASES_TSAN_BUILD_DIR:-build-tsan}
M=models/train/gpt2_bytes/model.onnx
TINY=models/small/gpt2_tiny/model.onnx
FOUR=models/train/gpt2_4l/model.onnx  # 4 blocks: pipeline stages with virtual stages
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
status=0

configure() {  # DIR FLAGS [OPT]: OPT (default -O1) with -g1
  local dir=$1 flags=$2 opt=${3:--O1}
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    cmake -S . -B "$dir" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOASES_CUDA=OFF -DCMAKE_UNITY_BUILD=ON -DOASES_HOT_OPT= \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt -g1 -DNDEBUG" \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  fi
}

asan_env() {
  # Leaks inside Open MPI's and OpenBLAS's own start-up are theirs, not ours (scripts/sanitizers/lsan.supp).
  export LSAN_OPTIONS="suppressions=$ROOT/scripts/sanitizers/lsan.supp:print_suppressions=0"
  export ASAN_OPTIONS="detect_odr_violation=0:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
}

# Open MPI dlcloses its components (mca_*.so) in MPI_Finalize, so the allocations they never free
# show as leaks from "<unknown module>" with the one or two frames the fast unwinder finds in
# libraries built without frame pointers; with the slow (DWARF) unwinder every such stack reaches
# MPI_Init/libopen-rte and the suppressions above recognise it. Only the runs under mpirun pay for it.
MPI_ASAN_OPTIONS="detect_odr_violation=0:abort_on_error=0:halt_on_error=1:fast_unwind_on_malloc=0"

tsan_env() {
  export TSAN_OPTIONS="suppressions=$ROOT/scripts/sanitizers/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
}

# a run that hangs fails by name after RUN_TIMEOUT seconds (each shard of unit_shards likewise)
RUN_TIMEOUT=${OASES_SANITIZE_RUN_TIMEOUT:-600}
run() {  # NAME CMD...: runs CMD, a failure (or a sanitizer report, which exits non-zero) fails the pass
  local name=$1
  shift
  local t0=$SECONDS rc=0
  if declare -F "$1" >/dev/null; then
    "$@" || rc=$?
  else
    timeout -k 10 "$RUN_TIMEOUT" "$@" || rc=$?
  fi
  if [[ $rc -eq 0 ]]; then
    echo "ok: $name ($((SECONDS - t0)) s)"
  elif ((rc == 124 || (rc == 137 && SECONDS - t0 >= RUN_TIMEOUT))); then  # 137 also: killed for another reason
    echo "FAIL: $name (no end after ${RUN_TIMEOUT} s: stopped)"
    status=1
  else
    echo "FAIL: $name (exit $rc)"
    status=1
  fi
}

unit_shards() {  # BINARY N [FILTER]: the gtest binary as N shards run side by side; fails when one does (its log shown)
  local bin=$1 n=$2 filter=${3:-*} i rc=0
  local logs
  logs=$(mktemp -d "${TMPDIR:-/tmp}/oases_shards_XXXXXX")
  local pids=()
  for ((i = 0; i < n; i++)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout -k 10 "$RUN_TIMEOUT" "$bin" --gtest_brief=1 --gtest_filter="$filter" >"$logs/$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    if ! wait "${pids[$i]}"; then
      rc=1
      echo "== shard $i of $n failed:"
      tail -n 80 "$logs/$i.log"
    else
      grep -E '^\[  PASSED  \]' "$logs/$i.log" | sed "s/^/shard $i: /" || true
    fi
  done
  rm -rf "$logs"
  return $rc
}

tsan_runs() {  # DIR RUN...: oases-train under TSan with each set of flags
  local dir=$1
  shift
  tsan_env
  for r in "$@"; do
    # shellcheck disable=SC2086
    run "TSan: oases-train --synthetic --batch 4 --seq 16 $r" "$dir/bin/oases-train" "$M" --synthetic --batch 4 --seq 16 $r -q
  done
}

if [[ $WHAT == asan || $WHAT == all ]]; then
  configure "$ASAN_DIR" "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake --build "$ASAN_DIR" -j "$JOBS"
  asan_env
  echo "== ASan + UBSan: ctest in $ASAN_DIR (unit, conformance)"
  (cd "$ASAN_DIR" && ctest -j "$(oases_cores)" --output-on-failure --timeout 1200 -LE "e2e|mpi" ${CTEST_ARGS:-}) || status=1
  echo "== ASan + UBSan: ctest in $ASAN_DIR (e2e, mpi: the slow unwinder, for Open MPI's leaks)"
  (cd "$ASAN_DIR" && ASAN_OPTIONS=$MPI_ASAN_OPTIONS ctest -j "$(oases_cores)" --output-on-failure --timeout 1200 -L "e2e|mpi" ${CTEST_ARGS:-}) ||
    status=1
fi

if [[ $WHAT == tsan || $WHAT == all ]]; then
  configure "$TSAN_DIR" "-fsanitize=thread -fno-omit-frame-pointer" -O0
  cmake --build "$TSAN_DIR" -j "$JOBS" --target oases-train oases_unit_tests
  tsan_runs "$TSAN_DIR" \
    "--local-ranks 2 --tp 2 --schedule oases --chunks 2 --steps 3" \
    "--local-ranks 2 --tp 2 --schedule overlap_checkpoint --chunks 2 --steps 3" \
    "--local-ranks 2 --tp 2 --schedule oases --chunks 2 --steps 2 --emulate-link bw=5,latency=20" \
    "--local-ranks 4 --tp 2 --dp 2 --schedule oases --chunks 2 --steps 2" \
    "--local-ranks 4 --tp 4 --schedule overlap_checkpoint --chunks 2 --steps 2"
  run "TSan: communicator and thread-pool unit tests" \
    "$TSAN_DIR/bin/oases_unit_tests" --gtest_filter="ParallelFor.*:LocalCommunicator.*:CollectiveKernels.*:StreamPlan.*"
fi

if [[ $WHAT == ci ]]; then
  t_start=$SECONDS
  # the clang ASan+UBSan folder the fuzz targets use (scripts/fuzz_configure.sh): .ci/run has
  # built its libraries already, so only the unit tests and tools are left to compile
  # shellcheck source=scripts/fuzz_configure.sh
  source scripts/fuzz_configure.sh
  ASAN_DIR=$FUZZ_BUILD_DIR
  targets=(oases_unit_tests oases-train)
  grep -q "^OASES_MPI:BOOL=ON" "$ASAN_DIR/CMakeCache.txt" && targets+=(oases_mpi_comm_suite)
  cmake --build "$ASAN_DIR" -j "$JOBS" --target "${targets[@]}"
  echo "== ASan + UBSan build: $((SECONDS - t_start)) s"
  asan_env
  # but the exhaustive searches of 4-rank layouts (two thirds of the unit tests' time, the same
  # search code as their 2-rank cases run here; the Release ctest runs them all)
  run "ASan: unit tests ($JOBS shards side by side)" \
    unit_shards "$ASAN_DIR/bin/oases_unit_tests" "$JOBS" "-SmallModels/SearchEqualsBruteForce.*_4_*"
  run "ASan: 2 thread ranks, tp 2, oases schedule" \
    "$ASAN_DIR/bin/oases-train" "$TINY" --synthetic --steps 3 -q --local-ranks 2 --tp 2 --schedule oases --chunks 2
  run "ASan: 4 thread ranks, tp 2 x dp 2, sequence parallel" \
    "$ASAN_DIR/bin/oases-train" "$TINY" --synthetic --steps 3 -q --local-ranks 4 --tp 2 --dp 2 --sequence-parallel
  run "ASan: 4 thread ranks, pp 2 x 2 virtual stages x dp 2, ZeRO-1 (its gathers beside the next step)" \
    "$ASAN_DIR/bin/oases-train" "$FOUR" --synthetic --batch 8 --seq 16 --steps 3 -q --local-ranks 4 --pp 2 --dp 2 --virtual-stages 2 \
    --micro-batches 2 --zero 1
  if [[ -x $ASAN_DIR/tests/bin/oases_mpi_comm_suite ]]; then
    run "ASan: MPI communicator suite, 2 ranks" env ASAN_OPTIONS=$MPI_ASAN_OPTIONS "${MPIRUN[@]}" -np 2 "$ASAN_DIR/tests/bin/oases_mpi_comm_suite"
    run "ASan: 2 MPI ranks, tp 2, overlap_checkpoint" env ASAN_OPTIONS=$MPI_ASAN_OPTIONS \
      "${MPIRUN[@]}" -np 2 "$ASAN_DIR/bin/oases-train" "$TINY" --synthetic --steps 3 -q --tp 2 --schedule overlap_checkpoint --chunks 2
  fi
  t_tsan=$SECONDS
  configure "$TSAN_DIR" "-fsanitize=thread -fno-omit-frame-pointer" -O0
  cmake --build "$TSAN_DIR" -j "$JOBS" --target oases-train
  echo "== TSan build: $((SECONDS - t_tsan)) s"
  tsan_runs "$TSAN_DIR" "--local-ranks 2 --tp 2 --schedule oases --chunks 2 --steps 2"
  M=$FOUR tsan_runs "$TSAN_DIR" "--local-ranks 4 --pp 2 --dp 2 --zero 1 --virtual-stages 2 --micro-batches 2 --steps 2"
  echo "== sanitizer pass: $((SECONDS - t_start)) s"
fi
[[ $WHAT =~ ^(asan|tsan|ci|all)$ ]] || { echo "usage: $0 asan|tsan|ci|all" >&2; exit 2; }
exit $status
