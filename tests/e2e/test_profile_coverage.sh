#!/usr/bin/env bash
# Profiles cover every architecture (issue 33, item 5): `oases-profile --model M` measures every op
# shape `oases-plan M --profile` prices (planner/coverage.h: one list for both), so the pair runs on
# every committed model of models/small, models/train and models/hf, and on a LLaMA stack with
# full multi-head attention made by models/export.py (train/llama_4l is its grouped-query one).
# Small shapes: 2 ranks, 2 x 16 tokens; the profile's runs at tp 2 with one chunk and one timed
# repetition (the planner's other shapes, tp 1, sequence parallelism, chunk counts and pipeline
# stages, are timed alone); the machine measured once (--machine: its rates, collectives and cores
# from one profile). Each plan must be written. No model is refused by the planner:
# torchscript_vit's symbolic batch is bound with --dim batch=2 (FLAGS).
# Then the issue's reproduction (llama_4l at 8 x 32, --degrees 2 --chunks 1,2) plans, and a plan
# its profile does not cover (another batch) stops with one line naming the op, its shape and
# where the planner prices it, and the command it recommends writes a profile that covers it.
# ctest: COST 30 (seconds on 2 cores, 2026-11-29: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
P=$OASES_BIN/oases-plan
F=$OASES_BIN/oases-profile
FAST=(--reps 1 --sizes 4096)  # the op and collective samples' precision is not what is tested
declare -A FLAGS=([torchscript_vit]="--dim batch=2")
t_start=$SECONDS

# pair DIR NAME: profile then plan (output in $WORK/NAME.*), exit code of the first that fails
pair() {
  local d=$1 n=$2
  # shellcheck disable=SC2086
  "$F" --backend cpu --model "$d/model.onnx" --ranks 2 --batch 2 --seq 16 --degrees 2 --chunks 1 "${FAST[@]}" ${FLAGS[$n]:-} \
    --machine "$WORK/machine.json" --out "$WORK/$n.profile.json" >"$WORK/$n.profile.txt" 2>&1 || return 1
  # shellcheck disable=SC2086
  "$P" "$d/model.onnx" --gpus 2 --batch 2 --seq 16 ${FLAGS[$n]:-} --profile "$WORK/$n.profile.json" --out "$WORK/$n.plan.json" \
    >"$WORK/$n.plan.txt" 2>&1 || return 2
}

dirs=()
for d in "$OASES_SOURCE_DIR"/models/{small,train,hf}/*/; do
  [[ -f $d/model.onnx ]] && dirs+=("${d%/}")
done
[[ ${#dirs[@]} -ge 40 ]] || fail "expected at least 40 committed models, found ${#dirs[@]}"
if /usr/bin/python3 -c "import torch, onnx" 2>/dev/null; then
  /usr/bin/python3 "$OASES_SOURCE_DIR/models/export.py" --family llama --dynamic --hidden 64 --layers 2 --heads 4 --kv-heads 4 --vocab 256 \
    --max-pos 64 --seed 5 --tied no --no-data --out "$WORK/export_llama_mha" >/dev/null 2>&1 || fail "models/export.py: LLaMA MHA stack"
  [[ -f $WORK/export_llama_mha/model.onnx ]] && dirs+=("$WORK/export_llama_mha")
else
  echo "note: no torch for /usr/bin/python3: the exported LLaMA MHA stack is left out"
fi

"$F" --backend cpu --ranks 2 "${FAST[@]}" --out "$WORK/machine.json" >/dev/null || fail "oases-profile of the machine alone"
# a machine's measurements serve only the ranks, threads and link they were made with
expect_error "--machine of other ranks" "^error: --machine .*machine\.json: measured for 2 rank\(s\) of 1 thread\(s\), not 4 of 1$" \
  "$F" --backend cpu --model "$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx" --ranks 4 --threads 1 --batch 4 --seq 16 \
  --machine "$WORK/machine.json" --out "$WORK/x.json"
expect_error "--machine of another link" "^error: --machine .*machine\.json: measured with --emulate-link '', not 'bw=1,latency=50'$" \
  "$F" --backend cpu --model "$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx" --ranks 2 --batch 2 --seq 16 \
  --emulate-link bw=1,latency=50 --machine "$WORK/machine.json" --out "$WORK/x.json"

# two pairs at a time: much of a profile waits on its runs' thread ranks
for d in "${dirs[@]}"; do
  n=$(basename "$d")
  while (($(jobs -rp | wc -l) >= 2)); do wait -n; done
  (
    s=$SECONDS
    pair "$d" "$n"
    echo "$? $((SECONDS - s))" >"$WORK/$n.rc"
  ) &
done
wait
for d in "${dirs[@]}"; do
  n=$(basename "$d")
  read -r rc secs <"$WORK/$n.rc"
  case $rc in
    0)
      if /usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['format'] == 'oases-plan'" "$WORK/$n.plan.json" 2>/dev/null; then
        echo "ok: $n (${secs}s): $(grep -o 'the planner prices [0-9]* op shapes' "$WORK/$n.profile.txt"), plan written"
      else
        fail "$n: no plan in $WORK/$n.plan.json"
      fi
      ;;
    1) fail "$n: oases-profile: $(tail -1 "$WORK/$n.profile.txt")" ;;
    *) fail "$n: oases-plan --profile: $(tail -1 "$WORK/$n.plan.txt")" ;;
  esac
done

# the issue's reproduction
L=$OASES_SOURCE_DIR/models/train/llama_4l/model.onnx
"$F" --backend cpu --model "$L" --ranks 2 --batch 8 --seq 32 --degrees 2 --chunks 1,2 "${FAST[@]}" --out "$WORK/p.json" >/dev/null ||
  fail "oases-profile llama_4l --batch 8 --seq 32 --degrees 2 --chunks 1,2"
"$P" "$L" --gpus 2 --profile "$WORK/p.json" --batch 8 --seq 32 --out "$WORK/plan.json" >/dev/null && [[ -s $WORK/plan.json ]] ||
  fail "oases-plan llama_4l --profile (the issue's reproduction)"

# a plan the profile does not cover: named with its shape and place, and the command recommended covers it
expect_error "a batch the profile did not measure" \
  "p\.json: the profile does not cover [0-9]+ of the [0-9]+ op shapes the planner prices \(.*\); the first: [A-Za-z.]+ float32\[[0-9x]+\].* -> .* in [a-z0-9.]+ at tp [12] x dp [12], [0-9]+ chunks?.*; it measured .*llama_4l/model.onnx on 2 ranks at batch 8 x 32 \(measure them: oases-profile --backend cpu --model .*llama_4l/model.onnx --ranks 2 --batch 16 --seq 32 --out .*p\.json\)$" \
  "$P" "$L" --gpus 2 --profile "$WORK/p.json" --batch 16 --seq 32 --out "$WORK/plan16.json"
cmd=$("$P" "$L" --gpus 2 --profile "$WORK/p.json" --batch 16 --seq 32 --out "$WORK/plan16.json" 2>&1 | sed -n 's/.*(measure them: oases-profile \(.*\) --out .*)$/\1/p')
if [[ -z $cmd ]]; then
  fail "no oases-profile command recommended"
else
  # shellcheck disable=SC2086
  "$F" $cmd "${FAST[@]}" --chunks 1 --out "$WORK/p16.json" >/dev/null || fail "the recommended command: oases-profile $cmd"
  "$P" "$L" --gpus 2 --profile "$WORK/p16.json" --batch 16 --seq 32 --out "$WORK/plan16.json" >/dev/null && [[ -s $WORK/plan16.json ]] ||
    fail "the recommended profile does not cover the plan"
fi
echo "took $((SECONDS - t_start)) s"
finish
