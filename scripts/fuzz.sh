#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: builds the libFuzzer targets (clang, ASan + UBSan, tests/fuzz) in
# their own build folder and runs each for SECONDS (default 60) from its seed corpus; exits 1 when
# a target crashes, leaks, times out or runs out of memory (the input that did it is kept in
# $BUILD_DIR/fuzz-artifacts/).
#
# Targets: oases_importer_fuzz (ONNX bytes -> import -> canonical passes), oases_checkpoint_fuzz
# (bytes -> load_checkpoint -> save -> load) and oases_plan_fuzz (JSON bytes -> Plan::from_json,
# validated -> to_json -> from_json).
# Seeds: tests/fuzz/corpus/<target>/ (small ONNX node-test models; tiny valid and damaged
# checkpoints, remade with tests/e2e/tamper_checkpoint.cpp; plans of versions 1 to 3 as oases-plan
# and oases-train --export-plan write them, trimmed to the keys a plan is read from, and damaged
# ones), plus, for the importer, the broken models of tests/e2e/make_bad_inputs.cpp and two
# transformer models (models/small/gpt2_tiny, tests/data/models/gpt2_odd_sizes). Inputs the run
# finds go to a scratch corpus, not the repo.
# CI (.ci/run) runs this with 30 s per target; the targets run side by side.
#
# Env: OASES_FUZZ_BUILD_DIR (default build-fuzz), OASES_FUZZ_RUN=1 also runs the graphs that import.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
TARGETS=(oases_importer_fuzz oases_checkpoint_fuzz oases_plan_fuzz)

# shellcheck source=scripts/fuzz_configure.sh
source scripts/fuzz_configure.sh
BUILD_DIR=$FUZZ_BUILD_DIR
# shellcheck source=scripts/cores.sh
source scripts/cores.sh
cmake --build "$BUILD_DIR" -j "$(oases_build_jobs)" --target "${TARGETS[@]}" oases_make_bad_inputs

WORK=$(mktemp -d "${TMPDIR:-/tmp}/oases_fuzz_XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/seeds" "$BUILD_DIR/fuzz-artifacts"
"$BUILD_DIR/tests/bin/oases_make_bad_inputs" "$WORK/bad" >/dev/null
find "$WORK/bad" -name '*.onnx' -size -64k -exec cp {} "$WORK/seeds/" \;
cp models/small/gpt2_tiny/model.onnx "$WORK/seeds/gpt2_tiny.onnx"
cp tests/data/models/gpt2_odd_sizes/model.onnx "$WORK/seeds/gpt2_odd_sizes.onnx"

# The targets run side by side, all at once (each fuzzer is one thread), each for SECONDS of a core:
# where they outnumber the cores, for SECONDS x targets / cores of wall time (3 targets on 2 cores:
# 45 s for 30 s each, where two at a time then the last alone took 60 s and left a core idle).
cores=$(oases_cores)
WALL_SECONDS=$SECONDS_PER_TARGET
((${#TARGETS[@]} > cores)) && WALL_SECONDS=$(((SECONDS_PER_TARGET * ${#TARGETS[@]} + cores - 1) / cores))
run_target() {  # target name: runs it, leaves its exit code in $WORK/NAME.rc
  local target=$1 name=$2 extra_seeds=()
  mkdir -p "$WORK/corpus_$name"
  [[ $name == importer ]] && extra_seeds=("$WORK/seeds")
  # -rss_limit_mb/-malloc_limit_mb: a model may ask for anything, the importer must refuse it
  local rc=0
  # timeout: libFuzzer ends itself after -max_total_time; should it not, the target fails by name
  timeout -k 10 "$((WALL_SECONDS + 300))" "$BUILD_DIR/tests/bin/$target" "$WORK/corpus_$name" "tests/fuzz/corpus/$name" "${extra_seeds[@]}" \
    -max_total_time="$WALL_SECONDS" -timeout=30 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD_DIR/fuzz-artifacts/$name-" >"$WORK/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$WORK/$name.rc"
}
name_of() { local n=${1#oases_}; echo "${n%_fuzz}"; }

for target in "${TARGETS[@]}"; do
  echo "== $target: ${WALL_SECONDS} s beside the others (${SECONDS_PER_TARGET} s of a core)"
  run_target "$target" "$(name_of "$target")" &
done
wait

status=0
for target in "${TARGETS[@]}"; do
  name=$(name_of "$target")
  rc=$(cat "$WORK/$name.rc" 2>/dev/null || echo 1)
  echo "-- $target"
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::number_of_executed_units|^stat::peak_rss_mb' "$WORK/$name.log" || true
  if [[ $rc -ne 0 ]] || grep -qE '==[0-9]+==ERROR|runtime error:|deadly signal|Test unit written' "$WORK/$name.log"; then
    echo "FAIL: $target (exit $rc); the input is in $BUILD_DIR/fuzz-artifacts/:"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$WORK/$name.log" | head -20
    cp "$WORK/$name.log" "$BUILD_DIR/fuzz-artifacts/$name.log"
    status=1
  else
    echo "ok: $target"
  fi
done
exit $status
