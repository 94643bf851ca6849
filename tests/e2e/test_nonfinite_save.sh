#!/usr/bin/env bash
# A checkpoint is never saved from a state whose loss or validation loss is not finite (issue 30):
# `--lr 1e30 --save CK` once printed `val loss nan`, wrote over the last good checkpoint and exited
# 0, and the next resume stopped at once. Now the save is refused with one line, exit code 2, and
# CK keeps its bytes: at the end of the run, at --save-every (a state not validated since its
# update is validated first), under --on-nonfinite skip, with tp ranks and with pipeline stages
# (every stage file and the manifest). The kept checkpoint still resumes.
source "$(dirname "$0")/lib.sh"
MODEL=$OASES_SOURCE_DIR/models/small/gpt2_tiny/model.onnx
T=$OASES_BIN/oases-train
RUN=("$T" "$MODEL" --synthetic -q)

# same_files NAME FILE...: each FILE is byte-identical to its copy FILE.before
same_files() {
  local name=$1 f
  shift
  for f in "$@"; do
    if cmp -s "$f" "$f.before"; then echo "ok: $name: $(basename "$f") unchanged"; else fail "$name: $(basename "$f") was replaced"; fi
  done
}

CK=$WORK/ck
"${RUN[@]}" --steps 2 --save "$CK" || fail "a good checkpoint"
cp "$CK" "$CK.before"
NOT_WRITTEN="^error: .*/ck: not written: the validation loss after step [0-9]+ is nan \\(a checkpoint is never saved from a non-finite state\\)$"

# the issue's run: one step at lr 1e30 (the weights stay finite, the validation loss is NaN)
expect_error "lr 1e30, saved at the end" "$NOT_WRITTEN" "${RUN[@]}" --steps 1 --lr 1e30 --save "$CK"
same_files "lr 1e30" "$CK"
expect_error "lr 1e30, resumed and saved at the end" "$NOT_WRITTEN" "${RUN[@]}" --steps 3 --lr 1e30 --resume "$CK" --save "$CK"
same_files "lr 1e30 resumed" "$CK"
# --save-every 1: the step-1 state (its training loss was finite, its validation loss is not)
expect_error "lr 1e30, --save-every 1" "$NOT_WRITTEN" "${RUN[@]}" --steps 3 --lr 1e30 --save-every 1 --save "$CK"
same_files "lr 1e30 --save-every 1" "$CK"
# --on-nonfinite skip: the steps after the first are skipped with a warning; still nothing saved
out=$("${RUN[@]}" --steps 3 --lr 1e30 --on-nonfinite skip --save "$CK" 2>&1)
rc=$?
last=$(tail -n 1 <<<"$out")
if [[ $rc -eq 2 && $last =~ $NOT_WRITTEN ]]; then echo "ok: --on-nonfinite skip -> $last"; else fail "--on-nonfinite skip: rc $rc: $out"; fi
same_files "--on-nonfinite skip" "$CK"
out=$("${RUN[@]}" --steps 3 --lr 1e30 --on-nonfinite skip --save-every 1 --save "$CK" 2>&1)
rc=$?
last=$(tail -n 1 <<<"$out")
if [[ $rc -eq 2 && $last =~ $NOT_WRITTEN ]]; then echo "ok: --on-nonfinite skip --save-every 1 -> $last"; else fail "--on-nonfinite skip --save-every 1: rc $rc: $out"; fi
same_files "--on-nonfinite skip --save-every 1" "$CK"
# tp 2 and dp 2 ranks: every rank refuses alike, one line
expect_error "lr 1e30, tp 2" "$NOT_WRITTEN" "${RUN[@]}" --steps 1 --lr 1e30 --local-ranks 2 --tp 2 --save "$CK"
expect_error "lr 1e30, dp 2" "$NOT_WRITTEN" "${RUN[@]}" --steps 1 --lr 1e30 --local-ranks 2 --dp 2 --save "$CK"
same_files "tp 2, dp 2" "$CK"
# the kept checkpoint resumes and trains on
"${RUN[@]}" --steps 3 --resume "$CK" --save "$WORK/after" || fail "the kept checkpoint does not resume"

# pipeline stages: the manifest and every stage file are kept
PP=$WORK/pp
"${RUN[@]}" --steps 2 --pp 2 --local-ranks 2 --save "$PP" || fail "a good pipeline checkpoint"
files=("$PP" "$PP".stage*)
[[ ${#files[@]} -eq 3 ]] || fail "a pipeline checkpoint of 2 stages is 3 files: ${files[*]}"
for f in "${files[@]}"; do cp "$f" "$f.before"; done
NOT_WRITTEN_PP=${NOT_WRITTEN/\/ck:/\/pp:}
expect_error "lr 1e30, pp 2" "$NOT_WRITTEN_PP" "${RUN[@]}" --steps 2 --pp 2 --local-ranks 2 --lr 1e30 --save-every 1 --save "$PP"
same_files "pp 2" "${files[@]}"
finish
