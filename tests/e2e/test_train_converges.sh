#!/usr/bin/env bash
# A tiny GPT trained on the bundled text (fixed seed) must bring its validation loss from ~5.5
# (uniform over bytes) below 2.6 within 200 steps.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
"$OASES_BIN/oases-train" "$MODEL" --data "$OASES_SOURCE_DIR/data/kjv_genesis.txt" --steps 200 --batch 8 --seq 64 \
  --lr 3e-3 --seed 1 --val-every 100 --val-batches 8 --log-json "$WORK/log.jsonl" --log-every 50 || fail "training failed"
/usr/bin/python3 - "$WORK/log.jsonl" <<'PY' || fail "validation loss did not fall below the bound"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 200, len(rows)
for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "ms"):
    assert all(key in r for r in rows), key
val = [r["val_loss"] for r in rows if "val_loss" in r]
print("validation losses:", val)
assert val[-1] < 2.6, val
PY
finish
