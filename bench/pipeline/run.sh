#!/usr/bin/env bash
# Pipeline stages on 4 MPI ranks emulating 2 hosts (tensor parallelism inside a host, the stages
# joined by an emulated link): gpipe vs 1f1b vs eager-1f1b, each measured with and without the link
# (the difference: the transfer time left exposed), the planner's prediction beside each, and the
# planner's pipeline plan against its best one-mesh plan. See bench_pipeline.py for the method.
#
#   bash bench/pipeline/run.sh [--links "bw=1.25,latency=50;bw=0.02,latency=50"] [--steps 10] [--json out.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${OASES_BUILD_DIR:-build}
[[ -x $BUILD/bin/oases-train ]] || bash scripts/build.sh
exec /usr/bin/python3 bench/pipeline/bench_pipeline.py --bin "$BUILD/bin" "$@"
