#!/usr/bin/env bash
# Stopping after 10 of 20 steps and resuming from the checkpoint gives the losses of an
# uninterrupted run bit for bit (SGD with momentum and AdamW).
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=$OASES_SOURCE_DIR/data/kjv_genesis.txt
for opt in adamw sgd; do
  common=(--data "$DATA" --steps 20 --batch 4 --seq 32 --optimizer $opt --lr 1e-2 --warmup 3 --seed 5 -q)
  "$OASES_BIN/oases-train" "$MODEL" "${common[@]}" --log-json "$WORK/full_$opt.jsonl" || fail "$opt: full run"
  "$OASES_BIN/oases-train" "$MODEL" "${common[@]}" --stop-after 10 --save "$WORK/ck_$opt" --log-json "$WORK/part_$opt.jsonl" || fail "$opt: first half"
  [[ -f "$WORK/ck_$opt" && ! -e "$WORK/ck_$opt.tmp" ]] || fail "$opt: checkpoint not written atomically"
  "$OASES_BIN/oases-train" "$MODEL" "${common[@]}" --resume "$WORK/ck_$opt" --log-json "$WORK/part_$opt.jsonl" || fail "$opt: resumed half"
  python3 - "$WORK/full_$opt.jsonl" "$WORK/part_$opt.jsonl" <<'PY' || fail "$opt: resumed losses differ"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
assert a == b, list(zip(a, b))
print("identical losses over 20 steps")
PY
done
finish
