#!/usr/bin/env bash
# A damaged checkpoint is never resumed from: one flipped bit in tensor data, an offset, the sampler
# state or the step, a truncation, a negative step, a header that is JSON but not an object, and
# optimizer state of the wrong size or missing each make `oases-train --resume` exit 2 with one
# line naming the file (and the tensor or field). A version 1 file (no checksums) resumes with a
# warning.
source "$(dirname "$0")/lib.sh"
: "${OASES_TEST_BIN:?}"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=$OASES_SOURCE_DIR/data/kjv_genesis.txt
T=$OASES_BIN/oases-train
TAMPER=$OASES_TEST_BIN/oases_tamper_checkpoint
run=(--data "$DATA" --batch 2 --seq 16 -q)

"$T" "$MODEL" "${run[@]}" --steps 1 --save "$WORK/ck" || fail "making a checkpoint"
"$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/ck" || fail "resuming from the good checkpoint"

damaged() { "$TAMPER" "$WORK/ck" "$WORK/$1" "$1" || fail "cannot write the '$1' checkpoint"; }
for d in flip-data flip-offset flip-sampler flip-step truncate negative-step not-object moment-size moment-missing v1; do
  damaged $d
done
expect_error "bit flipped in tensor data" "/flip-data: corrupt checkpoint: tensor '.*': its checksum does not match" \
  "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/flip-data"
for d in flip-offset flip-sampler flip-step; do
  expect_error "bit flipped ($d)" "/$d: corrupt checkpoint: the header's checksum does not match" \
    "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/$d"
done
expect_error "truncated" "/truncate: truncated checkpoint: tensor '.*' ends at byte" "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/truncate"
expect_error "negative step" "/negative-step: corrupt checkpoint header: 'step' is -1 \(must be >= 0\)" \
  "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/negative-step"
expect_error "header not an object" "/not-object: corrupt checkpoint header: a JSON array, not an object" \
  "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/not-object"
expect_error "moment of the wrong size" "/moment-size: optimizer state '.*\.m' is float32 \[[0-9]+\], parameter '.*' needs float32 \[" \
  "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/moment-size"
expect_error "moment missing" "/moment-missing: adamw optimizer state '.*\.m' is missing" \
  "$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/moment-missing"

err=$("$T" "$MODEL" "${run[@]}" --steps 2 --resume "$WORK/v1" 2>&1 >/dev/null) || fail "version 1 checkpoint: not resumed: $err"
grep -q "^warning: .*/v1: format version 1 carries no checksums" <<<"$err" || fail "version 1 checkpoint: no warning: $err"
echo "ok: version 1 -> $err"
finish
