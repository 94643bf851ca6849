#!/usr/bin/env bash
# Output files are written like checkpoints (graph/atomic_file.h): a full disk (/dev/full, which the
# tools write in place) or a file-size limit (a regular file: written to FILE.tmp and renamed) is a
# one-line `error:` naming the file and exit 2, leaving neither an empty nor a cut file, nor a
# .tmp; an output path that cannot be created is refused before any work.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/train/gpt2_bytes/model.onnx
DATA=$OASES_SOURCE_DIR/data/kjv_genesis.txt
T=$OASES_BIN/oases-train
IMPORT=$OASES_BIN/oases-import
PLAN=$OASES_BIN/oases-plan
train=(--data "$DATA" --batch 2 --seq 16 -q)
dims=(--dim batch=2 --dim sequence=8)
full="/dev/full: cannot write: No space left on device"

# --- a full disk ----------------------------------------------------------------------------
for flag in --log-json --save --export-plan --export-onnx; do
  expect_error "$flag on a full disk" "^error: $full" "$T" "$MODEL" "${train[@]}" --steps 2 "$flag" /dev/full
done
expect_error "--trace on a full disk" "^error: $full" "$T" "$MODEL" "${train[@]}" --steps 3 --trace-steps 1 --trace /dev/full
expect_error "oases-import --json on a full disk" "^error: $full" "$IMPORT" "$MODEL" "${dims[@]}" --json /dev/full
expect_error "oases-import --dot on a full disk" "^error: $full" "$IMPORT" "$MODEL" "${dims[@]}" --dot /dev/full
for flag in --out --html --dot; do
  expect_error "oases-plan $flag on a full disk" "^error: $full" "$PLAN" "$MODEL" --tp 2 "$flag" /dev/full
done

# --- a regular file that cannot grow: 1 KiB limit (SIGXFSZ ignored, so write() says EFBIG) --------
limited() { (ulimit -f 1 && trap '' XFSZ && exec "$@"); }
no_leftovers() {
  local f
  for f in "$@"; do [[ ! -e $f ]] || fail "$f left behind"; done
}
expect_error "oases-import --json past the size limit" "^error: .*/summary\.json: cannot write: File too large" \
  limited "$IMPORT" "$MODEL" "${dims[@]}" --json "$WORK/summary.json"
no_leftovers "$WORK/summary.json" "$WORK/summary.json.tmp"
expect_error "oases-import --dot past the size limit" "^error: .*/graph\.dot: cannot write: File too large" \
  limited "$IMPORT" "$MODEL" "${dims[@]}" --dot "$WORK/graph.dot"
no_leftovers "$WORK/graph.dot" "$WORK/graph.dot.tmp"
# a step log that cannot grow keeps its old lines whole
head -c 900 /dev/zero | tr '\0' 'x' >"$WORK/log.jsonl"
echo >>"$WORK/log.jsonl"
cp "$WORK/log.jsonl" "$WORK/log.before"
expect_error "--log-json past the size limit" "^error: .*/log\.jsonl: cannot write: File too large" \
  limited "$T" "$MODEL" "${train[@]}" --steps 3 --log-json "$WORK/log.jsonl"
cmp -s "$WORK/log.jsonl" "$WORK/log.before" || fail "--log-json: the old log was changed by the failed run"
no_leftovers "$WORK/log.jsonl.tmp"
# and one that can: the run's lines follow the old ones
"$T" "$MODEL" "${train[@]}" --steps 2 --log-json "$WORK/log.jsonl" || fail "--log-json: a run with room failed"
[[ $(wc -l <"$WORK/log.jsonl") -eq 3 ]] || fail "--log-json: expected the old line and 2 steps, got $(wc -l <"$WORK/log.jsonl") lines"
no_leftovers "$WORK/log.jsonl.tmp"

# --- paths refused before any work ----------------------------------------------------------
expect_error "oases-import --json in a missing folder" "^error: --json .*/nodir/s\.json: the folder .*/nodir does not exist" \
  "$IMPORT" "$MODEL" "${dims[@]}" --json "$WORK/nodir/s.json"
expect_error "oases-import --dot onto a folder" "^error: --dot .*: is a folder, not a file" "$IMPORT" "$MODEL" "${dims[@]}" --dot "$WORK"
for flag in --out --html --dot --trace; do
  expect_error "oases-plan $flag in a missing folder" "^error: $flag .*/nodir/p: the folder .*/nodir does not exist" \
    "$PLAN" "$MODEL" --tp 2 "$flag" "$WORK/nodir/p"
done
expect_error "oases-profile --out in a missing folder" "^error: --out .*/nodir/p\.json: the folder .*/nodir does not exist" \
  "$OASES_BIN/oases-profile" --out "$WORK/nodir/p.json"
touch "$WORK/a_file"
expect_error "oases-run --write-outputs under a file" "^error: --write-outputs .*/a_file/out: .*/a_file is not a folder" \
  "$OASES_BIN/oases-run" "$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx" --data-set "$WORK" --write-outputs "$WORK/a_file/out"
finish
