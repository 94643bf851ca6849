#!/usr/bin/env bash
# The planner's memory per rank against the built programs' (issue 33 item 4), on the two bundled
# 4-block models: bench/plan/memory_table.py builds every one-mesh layout (schedule x chunks K in
# {1, 2, 4, 8} x tp in {1, 2, 4}, sequence parallelism on and off, 4 GPUs) and every pipeline's
# stage programs (pp 2 and 4, gpipe / 1f1b / eager-1f1b / zb-h1 / 1f1b with 2 virtual stages, M of
# pp and 2 pp, three inner schedules, ZeRO-1 where there is dp) and prints the cost model's memory
# beside the program's (parameters, gradients, moments and the activation arena). Every row must
# agree within 15%, and every layout the table asks for must build but those the model and batch do
# not divide (llama_4l's two kv heads over tp 4; gpt2_4l's 16 sequences over dp 4 x K 8).
# ctest: COST 47 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"

TABLE=$OASES_SOURCE_DIR/bench/plan/memory_table.py
check() {  # check LABEL MIN_ROWS ARGS...: the table's last line says no row is off, and every row was built
  local label=$1 min_rows=$2
  shift 2
  /usr/bin/python3 "$TABLE" --bin "$OASES_BIN" "$@" >"$WORK/table.txt" 2>&1 || {
    fail "$label: memory_table.py failed: $(tail -1 "$WORK/table.txt")"
    return
  }
  local last
  last=$(tail -1 "$WORK/table.txt")
  if [[ ! $last =~ ^worst:.*\ 0\ of\ ([0-9]+)\ (rows|stages)\ off\ by\ more\ than\ 15%$ ]]; then
    fail "$label: $last"
    grep "off by more than 15%" "$WORK/table.txt" | head -5
    return
  fi
  local rows=${BASH_REMATCH[1]}
  local unbuilt
  unbuilt=$(grep "not planned" "$WORK/table.txt" | grep -vE "no tp degree, chunk count and schedule divide the model|block ranges; the model has" | head -3)
  if [[ -n $unbuilt ]]; then
    fail "$label: layouts not built: $unbuilt"
  elif [[ $rows -lt $min_rows ]]; then
    fail "$label: only $rows rows"
  else
    echo "ok $label: $last"
  fi
}

GPT=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
LLAMA=$OASES_SOURCE_DIR/models/train/llama_4l/model.onnx
check "gpt2_4l one mesh" 85 --model "$GPT"
check "gpt2_4l pipelines" 276 --model "$GPT" --pipelines
check "llama_4l one mesh" 54 --model "$LLAMA" --batch 64 --seq 128
check "llama_4l pipelines" 276 --model "$LLAMA" --batch 64 --seq 128 --pipelines
finish
