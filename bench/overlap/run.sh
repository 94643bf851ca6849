#!/usr/bin/env bash
# The Oases schedules on scaled-down versions of the paper's seven GPT stacks, tp 2 and 4, with an
# emulated PCIe RTX 3090 link (figures and calibration: bench/overlap/bench_overlap.py).
#
#   bash bench/overlap/run.sh [--only 3072] [--tp 2] [--steps 8] [--repeat 2] [--chunks 2] [--json results.json]
#
# Needs PyTorch to export the stacks (OASES_SETUP_EXTRA=1 bash scripts/setup.sh installs Debian's).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${OASES_BUILD_DIR:-build}
[[ -x $BUILD/bin/oases-train ]] || bash scripts/build.sh
mkdir -p "$BUILD/bench/overlap"
exec /usr/bin/python3 bench/overlap/bench_overlap.py --bin "$BUILD/bin" --work "$BUILD/bench/overlap" "$@"
