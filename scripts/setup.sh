#!/usr/bin/env bash
# Installs what Oases needs on Debian 12. Idempotent: packages already present are skipped.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libonnx-dev python3-onnx libonnx-testdata
  libprotobuf-dev protobuf-compiler
  libboost-graph-dev
  libgtest-dev googletest libgmock-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  coinor-libcbc-dev libglpk-dev
  libbenchmark-dev graphviz
  python3-numpy
  chromium
  slurmctld slurmd slurm-client munge
  clang libclang-rt-14-dev
)
# slurmctld slurmd slurm-client munge: a single-node Slurm cluster (scripts/slurm_local.sh) for the
# e2e test of ranks under `srun --mpi=pmix` (tests/e2e/test_rank_faults_slurm.sh; ~20 s to install).
# Their packages enable systemd units; nothing is started here (containers have no systemd).
# clang libclang-rt-14-dev: the libFuzzer targets and CI's ASan+UBSan pass (scripts/fuzz_configure.sh).
# chromium: headless, renders the plan HTML in tests/e2e/test_plan_outputs.sh (~12 s to install).
# Optional extra: PyTorch for references and benchmarks (large; OASES_SETUP_EXTRA=1).
EXTRA=(python3-torch)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all required Debian packages present"
fi

if [[ "${OASES_SETUP_EXTRA:-0}" == "1" ]]; then
  missing=()
  for p in "${EXTRA[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi
