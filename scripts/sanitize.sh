#!/usr/bin/env bash
# scripts/sanitize.sh [asan|tsan|all]: the sanitizer builds, each in its own build folder (CPU
# only, -DOASES_CUDA=OFF), and the tests they run. Exits 1 when a test fails or a sanitizer reports.
#
#   asan  build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (no recovery), every unit,
#         conformance, e2e and MPI test (thread ranks and MPI ranks included).
#   tsan  build-tsan: ThreadSanitizer, oases-train with thread ranks on the overlapped schedules
#         (oases and chunked pipelines) and the communicator suite.
# Both builds take ~15 minutes each on 2 cores (ccache makes a rebuild quick).
# Env: OASES_ASAN_BUILD_DIR, OASES_TSAN_BUILD_DIR, CTEST_ARGS (extra ctest arguments, e.g. -R unit).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${1:-all}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
command -v ccache >/dev/null && GEN+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
status=0

configure() {  # DIR FLAGS
  local dir=$1 flags=$2
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    cmake -S . -B "$dir" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOASES_CUDA=OFF \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
  fi
}

if [[ $WHAT == asan || $WHAT == all ]]; then
  dir=${OASES_ASAN_BUILD_DIR:-build-asan}
  configure "$dir" "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake --build "$dir" -j "$(nproc)"
  # Leaks inside Open MPI's and OpenBLAS's own start-up are theirs, not ours.
  export LSAN_OPTIONS="suppressions=$ROOT/scripts/sanitizers/lsan.supp:print_suppressions=0"
  export ASAN_OPTIONS="detect_odr_violation=0:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  echo "== ASan + UBSan: ctest in $dir"
  (cd "$dir" && ctest -j "$(nproc)" --output-on-failure --timeout 1200 ${CTEST_ARGS:-}) || status=1
fi

if [[ $WHAT == tsan || $WHAT == all ]]; then
  dir=${OASES_TSAN_BUILD_DIR:-build-tsan}
  configure "$dir" "-fsanitize=thread -fno-omit-frame-pointer"
  cmake --build "$dir" -j "$(nproc)" --target oases-train oases_unit_tests
  export TSAN_OPTIONS="suppressions=$ROOT/scripts/sanitizers/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
  M=models/train/gpt2_bytes/model.onnx
  runs=(
    "--local-ranks 2 --tp 2 --schedule oases --chunks 2 --steps 3"
    "--local-ranks 2 --tp 2 --schedule overlap_checkpoint --chunks 2 --steps 3"
    "--local-ranks 2 --tp 2 --schedule oases --chunks 2 --steps 2 --emulate-link bw=5,latency=20"
    "--local-ranks 4 --tp 2 --dp 2 --schedule oases --chunks 2 --steps 2"
  )
  for r in "${runs[@]}"; do
    echo "== TSan: oases-train $M --synthetic --batch 4 --seq 16 $r"
    # shellcheck disable=SC2086
    if ! "$dir/bin/oases-train" "$M" --synthetic --batch 4 --seq 16 $r -q; then
      echo "FAIL: TSan run: $r"
      status=1
    fi
  done
  echo "== TSan: communicator and thread-pool unit tests"
  "$dir/bin/oases_unit_tests" --gtest_filter="ParallelFor.*:LocalCommunicator.*:CollectiveKernels.*:StreamPlan.*" || status=1
fi
exit $status
