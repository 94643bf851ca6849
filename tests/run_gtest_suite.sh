#!/usr/bin/env bash
# tests/run_gtest_suite.sh BINARY ARGS...: runs one GoogleTest suite for CTest
# (cmake/oases_gtest_suites.cmake). Exit 77 (CTest's "skipped") when the binary passed but ran no
# case to the end (every case skipped); otherwise the binary's own exit code.
log=$(mktemp "${TMPDIR:-/tmp}/oases_suite.XXXXXX") || exit 1
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [[ $rc -eq 0 ]] && grep -q '^\[  PASSED  \] 0 tests\.' "$log"; then
  exit 77
fi
exit "$rc"
