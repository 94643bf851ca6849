#!/usr/bin/env bash
# Configures and builds Oases into ${OASES_BUILD_DIR:-build} (Release, Ninja when available).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${OASES_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# ccache, when installed, makes rebuilds in other checkouts of the same sources cheap
command -v ccache >/dev/null && GEN+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
