#!/usr/bin/env bash
# Every oases tool picks OpenBLAS's kernels for the CPU by itself (executor/cpu/blas_select.h):
# where OpenBLAS fell back to a pre-AVX2 core (Prescott, ...) on a CPU with AVX2 or AVX-512, the
# tool executes itself again, once, with OPENBLAS_CORETYPE=Haswell or SkylakeX. Checked through
# the tools' "OpenBLAS core C (how it was chosen)" line (--version; oases-run -v; oases-train):
#   - the core in the end: the CPU's best where OpenBLAS misdetects, what OpenBLAS detected
#     otherwise (the witness: OpenBLAS loaded by Debian's Python, which chooses nothing)
#   - OPENBLAS_CORETYPE set by the user is obeyed; OASES_BLAS_AUTO=0 keeps the detected core
#   - the re-executed process never executes again (OASES_BLAS_REEXEC), even when the asked core
#     did not take; a forced re-execution (OASES_TEST_BLAS_DETECTED) switches where OpenBLAS knows
#     the CPU too, so the mechanism is tested on every machine with AVX2
#   - a failed re-execution (no /proc) warns once and goes on with the detected core
#   - real work after the switch: oases-run, oases-train with thread ranks and under mpirun (a
#     missing mpirun fails the test: openmpi-bin is a required package)
source "$(dirname "$0")/lib.sh"
TOOLS=(oases-import oases-plan oases-run oases-train oases-profile oases-reshard oases-gpu-info)
TINY=$OASES_SOURCE_DIR/models/small/gpt2_tiny
PRE_AVX2='^(Unknown|Katmai|Coppermine|Northwood|Prescott|Banias|Atom|Core2|Penryn|Dunnington|Nehalem|Athlon|Opteron|Opteron_SSE3|Barcelona|Nano|Bobcat|Sandybridge)$'
CLEAN=(env -u OPENBLAS_CORETYPE -u OASES_BLAS_AUTO -u OASES_BLAS_REEXEC -u OASES_TEST_BLAS_DETECTED)

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ $flags == *" $1 "* ]]; }
BEST="" ISA=""
if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
  BEST=SkylakeX ISA=AVX-512
elif has avx2 && has fma; then
  BEST=Haswell ISA=AVX2
fi

# What OpenBLAS detects by itself, from a process that does not choose.
lib=$(ldd "$OASES_BIN/oases-import" | awk '/libopenblas/ {print $3; exit}')
# OpenBLAS is required (CMake's find_package(OpenBLAS REQUIRED)) and /usr/bin/python3 is Debian's:
# a tool without libopenblas, or a library Python cannot load, is a failure, not a skip
[[ -n $lib ]] || { fail "oases-import links no libopenblas (ldd: $(ldd "$OASES_BIN/oases-import" | grep -i blas))"; finish; }
detected=$("${CLEAN[@]}" /usr/bin/python3 -c '
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' "$lib") || { fail "cannot load $lib from /usr/bin/python3"; finish; }
dynamic=0
"${CLEAN[@]}" "$OASES_BIN/oases-import" --version | grep -q DYNAMIC_ARCH && dynamic=1
echo "CPU: ${BEST:-no AVX2} ($ISA); OpenBLAS detects $detected; DYNAMIC_ARCH: $dynamic"

# core_line TOOL [VAR=VALUE ...]: the "OpenBLAS core" line of TOOL --version, stderr into $WORK/err
core_line() {
  local tool=$1
  shift
  "${CLEAN[@]}" "$@" timeout 60 "$OASES_BIN/$tool" --version 2>"$WORK/err" | grep '^OpenBLAS core '
}
# expect_line NAME EXPECTED TOOL [VAR=VALUE ...]
expect_line() {
  local name=$1 want=$2
  shift 2
  local got
  got=$(core_line "$@")
  if [[ $got == "$want" ]]; then echo "ok: $name: $got"; else fail "$name: '$got', expected '$want' (stderr: $(cat "$WORK/err"))"; fi
}

# --- the default: each tool ends on the core the CPU deserves
switches=0
if [[ -n $BEST && $dynamic == 1 && $detected =~ $PRE_AVX2 ]]; then
  switches=1
  want_core=$BEST
  want="OpenBLAS core $BEST (auto: detected $detected on an $ISA CPU)"
else
  want_core=$detected
  want="OpenBLAS core $detected (as detected)"
fi
for tool in "${TOOLS[@]}"; do
  expect_line "$tool --version" "$want" "$tool"
  [[ -s $WORK/err ]] && fail "$tool --version: unexpected stderr: $(cat "$WORK/err")"
done
if [[ -n $BEST && $dynamic == 1 && $want_core =~ $PRE_AVX2 ]]; then
  fail "an $ISA CPU and the tools still run OpenBLAS's $want_core kernels"
fi

# --- the user's OPENBLAS_CORETYPE is obeyed, even a generic core; the opt-out keeps the detected one
if [[ $dynamic == 1 ]]; then
  cores=(Prescott)
  [[ -n $BEST ]] && cores+=("$BEST")
  for c in "${cores[@]}"; do
    expect_line "OPENBLAS_CORETYPE=$c" "OpenBLAS core $c (OPENBLAS_CORETYPE=$c from the environment)" oases-train OPENBLAS_CORETYPE=$c
  done
fi
if ((switches)); then
  want_off="OpenBLAS core $detected (as detected; OASES_BLAS_AUTO=0 keeps it on this $ISA CPU, which could run $BEST)"
else
  want_off="OpenBLAS core $detected (as detected)"
fi
expect_line "OASES_BLAS_AUTO=0" "$want_off" oases-run OASES_BLAS_AUTO=0
expect_line "OASES_BLAS_AUTO=1" "$want" oases-run OASES_BLAS_AUTO=1

# --- a forced re-execution switches on any machine with AVX2 (the hook pretends OpenBLAS detected Prescott)
if [[ -n $BEST && $dynamic == 1 ]]; then
  expect_line "forced re-execution" "OpenBLAS core $BEST (auto: detected Prescott on an $ISA CPU)" oases-plan OASES_TEST_BLAS_DETECTED=Prescott
fi

# --- no loop: the re-executed process never executes again, even when the asked core did not take
# (here: "asked" for Prescott); one warning, exit 0, within the timeout
line=$(core_line oases-import OASES_BLAS_REEXEC=Prescott OPENBLAS_CORETYPE=Prescott OASES_TEST_BLAS_DETECTED=Prescott)
rc=${PIPESTATUS[0]}
if [[ $dynamic == 1 ]]; then
  [[ $line =~ ^"OpenBLAS core Prescott (auto: detected Prescott on an "[-A-Za-z0-9]+" CPU; OPENBLAS_CORETYPE=Prescott did not take)"$ ]] \
    || fail "guard set, core did not take: '$line'"
  [[ $(grep -c . "$WORK/err") == 1 && $(cat "$WORK/err") == "warning: OpenBLAS runs its Prescott kernels although OPENBLAS_CORETYPE=Prescott"* ]] \
    || fail "guard set, core did not take: expected one warning line, got: $(cat "$WORK/err")"
  echo "ok: no second re-execution: $line"
fi

# --- a failed re-execution (no /proc, in a mount namespace of its own): one warning, the detected
# core, and the tool goes on
if ((switches)) && unshare -m true 2>/dev/null; then
  out=$("${CLEAN[@]}" timeout 60 unshare -m sh -c 'umount -l /proc && exec "$0" --version' "$OASES_BIN/oases-import" 2>"$WORK/err")
  rc=$?
  line=$(grep '^OpenBLAS core ' <<<"$out")
  [[ $rc == 0 && $line == "OpenBLAS core $detected (as detected; running again with OPENBLAS_CORETYPE=$BEST failed: "*")" ]] \
    || fail "failed re-execution: exit $rc, '$line'"
  [[ $(grep -c . "$WORK/err") == 1 && $(cat "$WORK/err") == "warning: OpenBLAS runs its $detected kernels on this $ISA CPU and running again with"* ]] \
    || fail "failed re-execution: expected one warning line, got: $(cat "$WORK/err")"
  echo "ok: failed re-execution goes on: $line"
else
  echo "note: the failed re-execution was not tried (OpenBLAS needs no switch here, or no unshare -m)"
fi

# --- real work on the chosen core: the forward pass (checks its outputs), training on thread ranks
out=$("${CLEAN[@]}" timeout 120 "$OASES_BIN/oases-run" "$TINY/model.onnx" --data-set "$TINY/test_data_set_0" -v 2>&1) \
  || fail "oases-run: $out"
grep -qF "blas: $want;" <<<"$out" && echo "ok: oases-run -v: $want" || fail "oases-run -v: no 'blas: $want;' in: $out"
train=(--synthetic --steps 2 --batch 2 --seq 16)
out=$("${CLEAN[@]}" timeout 120 "$OASES_BIN/oases-train" "$TINY/model.onnx" "${train[@]}" --local-ranks 2 --tp 2 2>&1) \
  || fail "oases-train --local-ranks 2: $out"
grep -qxF "blas: $want" <<<"$out" && echo "ok: oases-train --local-ranks 2: $want" || fail "oases-train --local-ranks 2: no 'blas: $want' in: $out"

# --- under mpirun: each rank re-executes before MPI_Init (same pid, the launcher does not notice);
# openmpi-bin is a required package (scripts/setup.sh): without mpirun this test fails
if ! command -v mpirun >/dev/null; then
  fail "mpirun missing: install openmpi-bin (scripts/setup.sh); the MPI part did not run"
else
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
  out=$("${CLEAN[@]}" timeout 120 "${MPIRUN[@]}" "$OASES_BIN/oases-import" --version 2>&1) || fail "mpirun oases-import --version: $out"
  n=$(grep -cxF "$want" <<<"$out")
  [[ $n == 2 ]] && echo "ok: mpirun -np 2 oases-import --version: both ranks '$want'" || fail "mpirun --version: $n of 2 ranks on '$want': $out"
  out=$("${CLEAN[@]}" timeout 180 "${MPIRUN[@]}" "$OASES_BIN/oases-train" "$TINY/model.onnx" "${train[@]}" --tp 2 2>&1) \
    || fail "mpirun -np 2 oases-train: $out"
  grep -qxF "blas: $want" <<<"$out" && echo "ok: mpirun -np 2 oases-train: $want" || fail "mpirun -np 2 oases-train: no 'blas: $want' in: $out"
fi
finish
