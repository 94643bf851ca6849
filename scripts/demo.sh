#!/usr/bin/env bash
# Sets up, builds and runs the main job on a bundled model: a GPT-2-style byte-level model
# (models/train/gpt2_bytes) is imported, planned for tensor parallelism over 2 ranks and trained
# on the book of Genesis (data/kjv_genesis.txt) with the oases schedule (2 chunks per batch,
# collectives on a communication thread), then exported back to ONNX.
# Writes into ${OASES_BUILD_DIR:-build}/demo: plan.json, plan.html (open in a browser),
# trace.json (open in https://ui.perfetto.dev), checkpoint.ckpt, trained.onnx, log.jsonl.
#   bash scripts/demo.sh [--steps N]   (default 300, a few minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=300
[[ ${1:-} == --steps ]] && STEPS=$2
bash scripts/setup.sh
bash scripts/build.sh
BIN=${OASES_BUILD_DIR:-build}/bin
OUT=${OASES_BUILD_DIR:-build}/demo
MODEL=models/train/gpt2_bytes/model.onnx
mkdir -p "$OUT"
echo "== the model"
"$BIN/oases-import" "$MODEL" --dim batch=16 --dim sequence=64
echo "== the plan: Megatron's split over tp = 2"
"$BIN/oases-plan" "$MODEL" --tp 2 --batch 16 --seq 64 --out "$OUT/plan.json" --html "$OUT/plan.html"
echo "== training: 2 ranks, tp = 2, schedule oases, 2 chunks"
"$BIN/oases-train" "$MODEL" --data data/kjv_genesis.txt --batch 16 --seq 64 --steps "$STEPS" --lr 3e-3 --warmup 20 \
  --local-ranks 2 --tp 2 --plan "$OUT/plan.json" --schedule oases --chunks 2 --val-every 50 \
  --trace "$OUT/trace.json" --overlap-report --log-json "$OUT/log.jsonl" \
  --save "$OUT/checkpoint.ckpt" --export-onnx "$OUT/trained.onnx"
echo "== wrote $OUT/{plan.json,plan.html,trace.json,checkpoint.ckpt,trained.onnx,log.jsonl}"
