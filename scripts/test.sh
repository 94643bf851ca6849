#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest: unit, conformance, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_python.sh
bash scripts/build.sh
cd "${OASES_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
