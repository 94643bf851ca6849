#!/usr/bin/env bash
# Ranks started by a real Slurm (`srun --mpi=pmix`, Open MPI over PMIx) on a single-node cluster
# (scripts/slurm_local.sh, started here when none runs): a normal run, then a rank that fails,
# hangs or dies mid-training (as tests/e2e/test_rank_faults.sh does for threads and mpirun).
#   failing rank   exit 2, one line "error: rank 1: ..."
#   hung rank      after --comm-timeout: exit 2, "error: rank 0: all-reduce in group ...: waited
#                  5 s (--comm-timeout) for rank 1, which did not arrive; aborting the job"
#   dead rank      within seconds (KillOnBadExit=1): srun's exit code is non-zero (that of the task
#                  it stopped last, 143 here), "srun: error: <node>: task 1: Killed" (SIGKILL) or
#                  "task 1: Exited with exit code 9"
# Slurm and munge are required packages (scripts/setup.sh): when one is not installed the test fails.
# It skips (exit 77, the reason printed) only where the cluster cannot start: not root, or the
# daemons refuse to run on this machine.
# Not run alone: it mostly waits (Slurm's start, the 5 s timeout), and its time bounds (5 to 25 s,
# under 20 s) hold beside the other tests; started early so that its waits overlap their work.
# ctest: COST 60
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
TINY=$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx
D=(--synthetic --steps 10 -q --tp 2)
export OASES_SLURM_DIR=${OASES_SLURM_DIR:-/tmp/oases-slurm-test}
export OASES_SLURM_PORT=${OASES_SLURM_PORT:-6827}  # beside a system cluster's 6817
SLURM=$OASES_SOURCE_DIR/scripts/slurm_local.sh

for b in slurmctld slurmd srun sinfo munged; do
  PATH=$PATH:/usr/sbin:/sbin command -v "$b" >/dev/null || fail "$b is not installed (scripts/setup.sh installs slurmctld slurmd slurm-client munge)"
done
((FAILURES)) && finish
if ! bash "$SLURM" status >/dev/null 2>&1; then
  if ! why=$(bash "$SLURM" start 2>&1 >/dev/null); then
    echo "SKIP: the single-node Slurm cluster cannot start here: $why"
    exit 77
  fi
  trap 'bash "$SLURM" stop; rm -rf "$WORK"' EXIT
fi
export SLURM_CONF=$OASES_SLURM_DIR/slurm.conf
# two tasks on this node even with fewer cores; a step never waits long for the previous one's end
SRUN=(timeout 90 srun --mpi=pmix --overcommit -n 2 --quiet)
elapsed() { echo $(($(date +%s) - $1)); }

out=$("${SRUN[@]}" "$T" "$TINY" --synthetic --steps 3 --tp 2 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "srun run: exit $rc ($out)"
grep -q "step 3/3" <<<"$out" || fail "srun run: no step 3/3 line: $out"
[[ $rc -eq 0 ]] && echo "ok: srun -n 2 --tp 2 trains"

out=$(OASES_TEST_FAULT=1:3:error "${SRUN[@]}" "$T" "$TINY" "${D[@]}" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "failing rank (slurm): exit $rc ($out)"
[[ $(grep -c "^error:" <<<"$out") -eq 1 ]] || fail "failing rank (slurm): expected one error line: $out"
grep -q "^error: rank 1: injected failure at step 4" <<<"$out" || fail "failing rank (slurm) message: $out"
echo "ok: failing rank (slurm) -> exit $rc"

start=$(date +%s)
out=$(OASES_TEST_FAULT=1:3:hang "${SRUN[@]}" "$T" "$TINY" "${D[@]}" --comm-timeout 5 2>&1); rc=$?
t=$(elapsed "$start")
[[ $rc -eq 2 ]] || fail "hung rank (slurm): exit $rc ($out)"
grep -qE "^error: rank 0: all-reduce in group \[0, 1\] \(member 0 of 2\): waited 5 s \(--comm-timeout\) for rank 1, which did not arrive" <<<"$out" ||
  fail "hung rank (slurm) message: $out"
((t >= 5 && t < 25)) || fail "hung rank (slurm): stopped after $t s, expected 5 to 25"
echo "ok: hung rank (slurm) -> exit $rc after $t s"

for mode in kill exit; do
  start=$(date +%s)
  out=$(OASES_TEST_FAULT=1:3:$mode "${SRUN[@]}" "$T" "$TINY" "${D[@]}" --comm-timeout 60 2>&1); rc=$?
  t=$(elapsed "$start")
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "dead rank ($mode, slurm): exit $rc ($out)"
  want="task 1: Killed"
  [[ $mode == exit ]] && want="task 1: Exited with exit code 9"
  grep -qE "^srun: error: .*: $want" <<<"$out" || fail "dead rank ($mode, slurm): no line '$want': $out"
  ((t < 20)) || fail "dead rank ($mode, slurm): stopped after $t s (the timeout is 60 s: Slurm must see the death)"
  echo "ok: dead rank ($mode, slurm) -> exit $rc after $t s"
done
finish
