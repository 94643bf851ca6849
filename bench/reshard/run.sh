#!/usr/bin/env bash
# Cross-mesh resharding (oases-reshard) on MPI ranks spread over emulated hosts joined by a
# 10 Gbit/s link: broadcast + load balancing vs send/recv vs local all-gather, the simulator's
# prediction beside each measured time, and the ratio to the link's lower bound.
#
#   bash bench/reshard/run.sh [--mib 64] [--repeat 3] [--bw 1.25] [--only RS0R] [--json results.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${OASES_BUILD_DIR:-build}
[[ -x $BUILD/bin/oases-reshard ]] || bash scripts/build.sh
exec /usr/bin/python3 bench/reshard/bench_reshard.py --bin "$BUILD/bin" "$@"
