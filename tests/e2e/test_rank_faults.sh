#!/usr/bin/env bash
# A rank that fails, hangs or dies in the middle of training, with thread ranks (--local-ranks) and
# with mpirun. What the run must do, and the exit codes (README.md, "When a rank fails"):
#   failing rank (returns an error)    every launcher: exit 2, "error: rank R: <its error>"
#   hung rank (sleeps inside a step)   after --comm-timeout: exit 2, one line naming the collective,
#                                      its group and the rank(s) it waited for
#   dead rank (exits / is killed)      mpirun: within seconds, exit 9 (the rank's code) or 137
#                                      (SIGKILL), "mpirun noticed that process rank R ... exited on
#                                      signal 9"; threads: the process is the job, it ends at once
# Slurm (srun --mpi=pmix): tests/e2e/test_rank_faults_slurm.sh.
# ctest: COST 33 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
TINY=$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx
D=(--synthetic --steps 10 -q --tp 2)
HUNG="all-reduce in group \[0, 1\] \(member 0 of 2\): waited 5 s \(--comm-timeout\) for rank 1, which did not arrive"

# elapsed SECONDS_START: whole seconds since then
elapsed() { echo $(($(date +%s) - $1)); }

# --comm-timeout: (0, 86400] seconds, default 120, in every tool that runs ranks
for v in 0 -5 nan 1e6; do
  expect_error "oases-train --comm-timeout $v" "--comm-timeout: $v is not in \(0, 86400\]" "$T" "$TINY" --synthetic --steps 1 --comm-timeout "$v"
done
expect_error "oases-profile --comm-timeout 0" "--comm-timeout must be in \(0, 86400\] seconds, not 0" \
  "$OASES_BIN/oases-profile" --out "$WORK/p.json" --comm-timeout 0
# (the help read whole first: grep -q stops reading at the match, and under pipefail the writer's
# SIGPIPE on the rest of a long help would fail the pipe)
help=$("$T" --help)
grep -qE -- "--comm-timeout .*=120$" <<<"$help" || fail "oases-train --help: no default 120 for --comm-timeout"

# --- thread ranks
expect_error "failing rank (threads)" "injected failure at step 4" env OASES_TEST_FAULT=1:3:error "$T" "$TINY" "${D[@]}" --local-ranks 2
start=$(date +%s)
expect_error "hung rank (threads)" "$HUNG" env OASES_TEST_FAULT=1:3:hang timeout 60 "$T" "$TINY" "${D[@]}" --local-ranks 2 --comm-timeout 5
# the timeout, then at most min(timeout, 10 s) for the other ranks to come back, then the hung thread is left
t=$(elapsed "$start"); ((t >= 5 && t < 20)) || fail "hung rank (threads): stopped after $t s, expected 5 to 20"
# tp 2 x dp 2: the hung rank is missing from its tp group [0, 1] (rank 0 times out there), or a
# rank that reached its dp group first times out waiting for rank 0 (itself waiting for rank 1):
# either way the message ends at rank 1
expect_error "hung rank (threads, tp x dp)" "waited 5 s \(--comm-timeout\) for rank (1, which did not arrive|[023], which did not arrive.*; rank [023] waits for rank 1 in )" \
  env OASES_TEST_FAULT=1:3:hang timeout 60 "$T" "$TINY" --synthetic --steps 10 -q --tp 2 --dp 2 --local-ranks 4 --comm-timeout 5

# --- mpirun
# mpi_fault KIND TIMEOUT: 2 MPI ranks, rank 1 failing as KIND at step 4; sets out, rc and t (seconds)
mpi_fault() {
  local start
  start=$(date +%s)
  out=$(OASES_TEST_FAULT=1:3:$1 timeout 60 "${MPIRUN[@]}" -np 2 "$T" "$TINY" "${D[@]}" --comm-timeout "$2" 2>&1)
  rc=$?
  t=$(elapsed "$start")
}
mpi_fault error 120  # the default --comm-timeout
[[ $rc -eq 2 ]] || fail "failing rank (mpi): exit $rc ($out)"
[[ $(grep -c "^error:" <<<"$out") -eq 1 ]] || fail "failing rank (mpi): expected one error line: $out"
grep -q "^error: rank 1: injected failure at step 4" <<<"$out" || fail "failing rank (mpi) message: $out"
echo "ok: failing rank (mpi) -> exit $rc"

mpi_fault hang 5
[[ $rc -eq 2 ]] || fail "hung rank (mpi): exit $rc ($out)"
grep -qE "^error: rank 0: $HUNG; aborting the job" <<<"$out" || fail "hung rank (mpi) message: $out"
((t >= 5 && t < 20)) || fail "hung rank (mpi): stopped after $t s, expected 5 to 20"
echo "ok: hung rank (mpi) -> exit $rc after $t s"

mpi_fault kill 60
[[ $rc -eq 137 ]] || fail "killed rank (mpi): exit $rc, expected 137 ($out)"
grep -q "process rank 1 with PID .* exited on signal 9" <<<"$out" || fail "killed rank (mpi) message: $out"
((t < 15)) || fail "killed rank (mpi): stopped after $t s (the timeout is 60 s: the launcher must see the death)"
echo "ok: killed rank (mpi) -> exit $rc after $t s"

mpi_fault exit 60
[[ $rc -eq 9 ]] || fail "exiting rank (mpi): exit $rc, expected 9 ($out)"
grep -qE "Process name: +\[\[[0-9]+,1\],1\]" <<<"$out" || fail "exiting rank (mpi) message: $out"
((t < 15)) || fail "exiting rank (mpi): stopped after $t s"
echo "ok: exiting rank (mpi) -> exit $rc after $t s"
finish
