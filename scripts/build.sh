#!/usr/bin/env bash
# Configures and builds Oases into ${OASES_BUILD_DIR:-build} (Release, Ninja when available).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${OASES_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
