#!/usr/bin/env bash
# oases-reshard: the paper's microbenchmark layouts (scaled down), even and uneven shapes, each
# strategy, moved on thread ranks and MPI processes and checked bit for bit against arange
# (the tool exits 0 only when every destination tile is exact); host emulation; bad input.
source "$(dirname "$0")/lib.sh"
R="$OASES_BIN/oases-reshard"

# name: src-mesh src dst-mesh dst world
CASES=(
  "2x4 S0RR 2x4 S0RR 16"
  "2x4 RRR 2x4 S0RR 16"
  "2x4 RS0R 2x4 S0RR 16"
  "2x4 RS01R 2x4 S01RR 16"
  "2x4 S1RR 2x4 S0RR 16"
  "2x4 RS0R 2x4 RRS0 16"
  "2x4 S0RR 3x4 S0RR 20"
  "1x4 RRR 2x4 RRR 12"
  "1 RRR 4x2 RRR 9"
  "2x2 S0R:P1 2x2 RS1 8"
)

run_case() {  # label world args...
  local label=$1 world=$2
  shift 2
  local out
  out=$("$@" 2>&1)
  local rc=$?
  if [[ $rc != 0 || $(grep -c 'bit-exact' <<<"$out") != 3 ]]; then
    fail "$label (world $world): exit $rc: $out"
  else
    echo "ok: $label"
  fi
}

for c in "${CASES[@]}"; do
  read -r sm src dm dst world <<<"$c"
  for shape in 8,8,4 7,5,3; do
    [[ $src == *:P* ]] && shape=${shape%,*}
    run_case "threads $sm $src -> $dm $dst [$shape]" "$world" \
      "$R" --shape "$shape" --src-mesh "$sm" --src "$src" --dst-mesh "$dm" --dst "$dst" --local-ranks "$world" --hosts 2 --compare --repeat 1 -q
  done
  shape=8,8,4
  [[ $src == *:P* ]] && shape=8,8
  "$R" --shape "$shape" --src-mesh "$sm" --src "$src" --dst-mesh "$dm" --dst "$dst" --plan-only --hosts 3 >/dev/null ||
    fail "plan-only $sm $src -> $dm $dst"
done

# overlapping meshes (a rank in both: its part is a local copy) and placed meshes
run_case "overlapping meshes" 8 "$R" --shape 8,6 --src-mesh 2x4 --src S0R --dst-mesh 4x2 --dst RS1 --src-ranks 0,1,2,3,4,5,6,7 \
  --dst-ranks 7,6,5,4,3,2,1,0 --local-ranks 8 --compare --repeat 1 -q
# host emulation: the cards are held, the result still exact, and broadcast beats send/recv
# where receivers replicate the data (predicted and measured)
out=$("$R" --shape 64,64,16 --src-mesh 1x2 --src S0RR --dst-mesh 2x2 --dst RRR --local-ranks 6 --hosts 3 --emulate-link bw=0.05,latency=50 --compare --repeat 1 -q 2>&1)
rc=$?
if [[ $rc != 0 ]]; then
  fail "emulated hosts: exit $rc: $out"
else
  python3 - "$out" <<'PY' || fail "emulated hosts: broadcast not faster than send/recv: $out"
import sys
rows = {l.split()[0]: l.split() for l in sys.argv[1].splitlines() if l.split() and l.split()[0] in ("sendrecv", "allgather", "broadcast")}
m = {k: float(v[1]) for k, v in rows.items()}
p = {k: float(v[2]) for k, v in rows.items()}
assert all(v[-1] == "bit-exact" for v in rows.values())
assert p["broadcast"] * 2 < p["sendrecv"] and m["broadcast"] * 1.5 < m["sendrecv"], (m, p)
PY
  echo "ok: emulated hosts: $(grep -E '^(sendrecv|broadcast)' <<<"$out" | tr -s ' ' | tr '\n' ';')"
fi

# MPI processes (openmpi-bin is a required package, scripts/setup.sh: without mpirun this test fails)
if ! command -v mpirun >/dev/null; then
  fail "mpirun missing: install openmpi-bin (scripts/setup.sh); the MPI cases did not run"
else
  MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
  run_case "mpirun 2x2 S0RR -> 2x2 RS0R, 2 hosts" 8 "${MPI[@]}" -np 8 "$R" --shape 12,8,4 --src-mesh 2x2 --src S0RR --dst-mesh 2x2 --dst RS0R \
    --hosts 2 --emulate-link bw=1.25,latency=50 --compare --repeat 1 -q
  run_case "mpirun 1x2 RRR -> 2x2 S01RR uneven" 6 "${MPI[@]}" -np 6 "$R" --shape 7,5,3 --src-mesh 1x2 --src RRR --dst-mesh 2x2 --dst S01RR \
    --hosts 3 --compare --repeat 1 -q
  run_case "mpirun partial source" 8 "${MPI[@]}" -np 8 "$R" --shape 9,4 --src-mesh 2x2 --src RS0:P1 --dst-mesh 2x2 --dst S1R --compare --repeat 1 -q
  # mpirun adds its own lines about the exit: the tool's is one line starting error:, exit 2
  out=$("${MPI[@]}" -np 4 "$R" --shape 8,8 --src-mesh 2x4 --src S0R --dst-mesh 2x4 --dst RS0 2>&1 >/dev/null)
  rc=$?
  if [[ $rc != 2 || $(grep -c '^error: .*need 16 ranks.*has 4' <<<"$out") != 1 ]]; then fail "mpirun: too few ranks: exit $rc: $out"; else echo "ok: mpirun: too few ranks"; fi
fi

# bad input: one line, exit 2
expect_error "layout that names an axis off the mesh" "--src: layout 'S2R'" "$R" --shape 8,8 --src-mesh 2x2 --src S2R --dst-mesh 2x2 --dst RR --plan-only
expect_error "layout with too few tokens" "has 1 dimensions" "$R" --shape 8,8 --src-mesh 2x2 --src S0 --dst-mesh 2x2 --dst RR --plan-only
expect_error "axis used twice" "uses mesh axis 'm0' twice" "$R" --shape 8,8 --src-mesh 2x2 --src S0S0 --dst-mesh 2x2 --dst RR --plan-only
expect_error "segments that do not tile" "is not R, S<axes>" "$R" --shape 8,8 --src-mesh 2x2 --src S0X --dst-mesh 2x2 --dst RR --plan-only
expect_error "bad mesh" "--dst-mesh: mesh '2x0'" "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 2x0 --dst RR --plan-only
expect_error "mesh placed off the world" "need 100 ranks.*has 8" "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 2x2 --dst RR --dst-ranks 4,5,6,99 --local-ranks 8
expect_error "a rank twice in one mesh" "placed on rank 5 twice" "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 2x2 --dst RR --dst-ranks 4,5,5,6 --plan-only
expect_error "partial destination" "destination layout .* partial sum" "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 2x2 --dst RR:P0 --plan-only
expect_error "unknown strategy" "--strategy 'fastest'" "$R" --shape 8,8 --src-mesh 2 --src S0R --dst-mesh 2 --dst RR --strategy fastest --plan-only
expect_error "negative dimension" "--shape '8,-1'" "$R" --shape 8,-1 --src-mesh 2 --src S0R --dst-mesh 2 --dst RR --plan-only
expect_error "huge tensor" "more than 2\^31" "$R" --shape 100000,100000 --src-mesh 2 --src S0R --dst-mesh 2 --dst RR --plan-only
# meshes bounded as a plan's are (2^20 ranks, in all and per axis), refused at once: under
# `timeout 10` a refusal that is slow reads as exit 124 (the first case once ran for minutes)
expect_error "huge source mesh" "^error: --src-mesh: mesh '1000000x1000000': more than 1048576 ranks in all$" \
  timeout 10 "$R" --shape 8,8 --src-mesh 1000000x1000000 --src S0R --dst-mesh 2x2 --dst RR --plan-only
expect_error "huge destination mesh" "--dst-mesh: mesh '1024x1024x2': more than 1048576 ranks in all" \
  timeout 10 "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 1024x1024x2 --dst RR --plan-only
expect_error "axis past 2^20" "--src-mesh: mesh '99999999': axis size 99999999 is outside 1 … 1048576" \
  timeout 10 "$R" --shape 8,8 --src-mesh 99999999 --src S0R --dst-mesh 2x2 --dst RR --plan-only
expect_error "negative axis" "--src-mesh: mesh '2x-2'" timeout 10 "$R" --shape 8,8 --src-mesh 2x-2 --src S0R --dst-mesh 2x2 --dst RR --plan-only
expect_error "zero axis" "--src-mesh: mesh '0x2': axis size 0" timeout 10 "$R" --shape 8,8 --src-mesh 0x2 --src S0R --dst-mesh 2x2 --dst RR --plan-only
expect_error "meshes past 2^20 world ranks" "--src-mesh 1024x1024 and --dst-mesh 2x2 take world ranks 0 … 1048579, more than 1048576" \
  timeout 10 "$R" --shape 8,8 --src-mesh 1024x1024 --src S0R --dst-mesh 2x2 --dst RR --plan-only
expect_error "rank past 2^20" "--dst-ranks '4,5,6,1048576': 1048576 is outside 0 … 1048575" \
  timeout 10 "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 2x2 --dst RR --dst-ranks 4,5,6,1048576 --plan-only
expect_error "partial axis off the mesh" "--src: layout 'S0R:P5' names mesh axis 5 of a mesh with 2 axes" \
  timeout 10 "$R" --shape 8,8 --src-mesh 2x2 --src S0R:P5 --dst-mesh 2x2 --dst RR --plan-only
expect_error "spec axis off the mesh" "--dst: spec '\[S\(m2\), R\]': mesh axis 'm2' does not exist" \
  timeout 10 "$R" --shape 8,8 --src-mesh 2x2 --src S0R --dst-mesh 2x2 --dst "[S(m2), R]" --plan-only
expect_error "shape of 33 dimensions" "--shape: 33 dimensions, more than 32" \
  timeout 10 "$R" --shape 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1 --src-mesh 2 --src R --dst-mesh 2 --dst R --plan-only
expect_error "dimension past 2^40" "--shape '1099511627777,1': 1099511627777 is outside" \
  timeout 10 "$R" --shape 1099511627777,1 --src-mesh 2 --src S0R --dst-mesh 2 --dst RR --plan-only
# a run's tiles within --max-memory, refused before anything is allocated (--plan-only allocates none)
expect_error "tiles past --max-memory" "--shape 64,64: the tiles of this process's 2 ranks would take 32768 bytes, over --max-memory 31744 bytes$" \
  timeout 10 "$R" --shape 64,64 --src-mesh 1 --src RR --dst-mesh 1 --dst RR --local-ranks 2 --max-memory 31K
"$R" --shape 64,64 --src-mesh 1 --src RR --dst-mesh 1 --dst RR --local-ranks 2 --max-memory 32K -q >/dev/null || fail "tiles of exactly --max-memory"
# 17 replicas of 8 GiB: past the default (half the RAM, at most 64 GiB) on any machine
expect_error "tiles past the default memory" "--shape 2147483647: the tiles of this process's 17 ranks would take 146028887996 bytes, over --max-memory [0-9]+ bytes \(the default\)" \
  timeout 10 "$R" --shape 2147483647 --src-mesh 1 --src R --dst-mesh 8x2 --dst R --local-ranks 17
expect_error "bad --max-memory" "--max-memory: 'lots' is not a byte count" \
  timeout 10 "$R" --shape 8,8 --src-mesh 2 --src S0R --dst-mesh 2 --dst RR --max-memory lots --plan-only
"$R" --shape 2147483647 --src-mesh 1 --src R --dst-mesh 8x2 --dst R --plan-only -q >/dev/null || fail "plan-only: a large shape is not allocated"
finish
