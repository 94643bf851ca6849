#!/usr/bin/env bash
# Mixed precision on the CPU (the same graph rewrite the GPU runs): bf16 and fp16 (with dynamic loss
# scaling) train the byte-level GPT and follow the fp32 losses; parameters stay fp32.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=$OASES_SOURCE_DIR/data/kjv_genesis.txt
for dtype in fp32 bf16 fp16; do
  "$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 30 --batch 4 --seq 32 --lr 3e-3 --seed 3 -q --dtype $dtype \
    --log-json "$WORK/$dtype.jsonl" || fail "$dtype training failed"
done
/usr/bin/python3 - "$WORK" <<'PY' || fail "mixed-precision losses do not follow fp32"
import json, sys
rows = {d: [json.loads(l) for l in open(f"{sys.argv[1]}/{d}.jsonl")] for d in ("fp32", "bf16", "fp16")}
ref = [r["loss"] for r in rows["fp32"]]
assert ref[-1] < ref[0] - 0.5, ref
for d in ("bf16", "fp16"):
    got = [r["loss"] for r in rows[d]]
    assert len(got) == 30
    worst = max(abs(a - b) / a for a, b in zip(ref, got))
    print(d, "first/last loss", got[0], got[-1], "worst relative difference to fp32", round(worst, 4))
    assert worst < 0.05, (d, worst)
assert all("loss_scale" in r for r in rows["fp16"]), "fp16 logs its loss scale"
assert not any("loss_scale" in r for r in rows["bf16"]), "bf16 needs no loss scale"
print("fp16 loss scales:", sorted({r["loss_scale"] for r in rows["fp16"]}), "skipped:", sum(r["skipped"] for r in rows["fp16"]))
PY
expect_error "unknown dtype" "dtype" "$OASES_BIN/oases-train" "$MODEL" --data "$DATA" --steps 1 --dtype int8
finish
