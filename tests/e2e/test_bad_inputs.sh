#!/usr/bin/env bash
# Every way a model or data set can be broken must give exit code 2 and one line `error: …` on
# stderr naming the culprit (file, node, op, opset, value or dim) — never a crash, never a huge
# allocation. A wrong result (output mismatch) gives exit code 1.
#
# Env: OASES_BIN (the tools), OASES_TEST_BIN (oases_make_bad_inputs, which writes the inputs).
set -uo pipefail

BIN=${OASES_BIN:?OASES_BIN must point at the built tools}
TBIN=${OASES_TEST_BIN:-$BIN/../tests/bin}
IMPORT="$BIN/oases-import"
RUN="$BIN/oases-run"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oases_bad_inputs_XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Keep the inputs from taking the machine down if a check for size is ever lost: 8 GiB of
# address space is far more than any of these needs and far less than the tensors they claim.
# (Sanitizer builds reserve terabytes of shadow address space: they run without the limit.)
if bash -c 'ulimit -v 8388608 && "$0" --help' "$IMPORT" >/dev/null 2>&1; then ulimit -v 8388608; fi

"$TBIN/oases_make_bad_inputs" "$WORK/in" || { echo "FAIL: cannot generate the inputs"; exit 1; }
D="$WORK/in"

failures=0
checks=0

# expect RC NEEDLE... -- COMMAND...: runs COMMAND; its exit code must be RC; for RC 2, stderr must
# be exactly one line starting with "error: " and containing every NEEDLE (fixed strings).
expect() {
  local want_rc=$1
  shift
  local needles=()
  while [[ $1 != "--" ]]; do
    needles+=("$1")
    shift
  done
  shift
  checks=$((checks + 1))
  local out="$WORK/stdout" err="$WORK/stderr"
  "$@" >"$out" 2>"$err"
  local rc=$?
  local problems=()
  [[ $rc -eq $want_rc ]] || problems+=("exit code $rc, want $want_rc")
  if [[ $want_rc -eq 2 ]]; then
    local lines
    lines=$(wc -l <"$err")
    [[ $lines -eq 1 ]] || problems+=("stderr has $lines lines, want 1")
    head -c 7 "$err" | grep -q '^error: ' || problems+=("stderr does not start with 'error: '")
    for n in "${needles[@]}"; do
      grep -qF -- "$n" "$err" || problems+=("stderr does not name '$n'")
    done
  fi
  if [[ ${#problems[@]} -gt 0 ]]; then
    failures=$((failures + 1))
    echo "FAIL: $*"
    for p in "${problems[@]}"; do echo "      $p"; done
    echo "      stderr: $(head -c 2000 "$err")"
  else
    if [[ $want_rc -eq 2 ]]; then
      echo "ok:   $(head -c 300 "$err" | head -1)"
    else
      echo "ok:   exit $rc: ${*##*/}"
    fi
  fi
}

# --- the good model works (else every check below proves nothing) ---------------------------
expect 0 -- "$IMPORT" "$D/good.onnx"
expect 0 -- "$RUN" "$D/good.onnx" --data-set "$D/good_data"

# --- oases-import ---------------------------------------------------------------------------
expect 2 "no_such_model.onnx" -- "$IMPORT" "$D/no_such_model.onnx"
expect 2 "empty.onnx" "empty" -- "$IMPORT" "$D/empty.onnx"
expect 2 "truncated.onnx" -- "$IMPORT" "$D/truncated.onnx"
expect 2 "garbage.onnx" -- "$IMPORT" "$D/garbage.onnx"
expect 2 "a_folder" -- bash -c "mkdir -p '$WORK/a_folder' && exec '$IMPORT' '$WORK/a_folder'"
expect 2 "unsupported.onnx" "FrobnicateOp" "first_unsupported" "WibbleOp" "second_unsupported" \
  "FusedThing" "foreign_node" "com.example.unknown" "[If] node 'branching_node'" -- "$IMPORT" "$D/unsupported.onnx"
expect 2 "opset12.onnx" "opset 12" -- "$IMPORT" "$D/opset12.onnx"
expect 2 "opset22.onnx" "opset 22" -- "$IMPORT" "$D/opset22.onnx"
expect 2 "cycle.onnx" "cycle" "cycle_" -- "$IMPORT" "$D/cycle.onnx"
expect 2 "short_initializer.onnx" "short_weight" "raw_data" -- "$IMPORT" "$D/short_initializer.onnx"
expect 2 "undefined_value.onnx" "reads_ghost" "ghost_value" -- "$IMPORT" "$D/undefined_value.onnx"
expect 2 "matmul_mismatch.onnx" "MatMul" "mismatched_matmul" -- "$IMPORT" "$D/matmul_mismatch.onnx"
expect 2 "unbound_dim.onnx" "batch" "tokens" -- "$IMPORT" "$D/unbound_dim.onnx"
expect 2 "seq_len" "tokens" -- "$IMPORT" "$D/unbound_dim.onnx" --dim batch=2
expect 0 -- "$IMPORT" "$D/unbound_dim.onnx" --dim batch=2 --dim seq_len=5
expect 0 -- "$IMPORT" "$D/unbound_dim.onnx" --shape tokens=2,5
expect 2 "--dim" "batch" -- "$IMPORT" "$D/unbound_dim.onnx" --dim batch=two
expect 2 "--shape" "tokens" -- "$IMPORT" "$D/unbound_dim.onnx" --shape tokens=2,x
expect 2 "tokens" "rank" -- "$IMPORT" "$D/unbound_dim.onnx" --shape tokens=2,5,7
expect 2 "nobody" -- "$IMPORT" "$D/unbound_dim.onnx" --shape nobody=2,5
expect 2 "no_input_shape.onnx" "'x'" "--shape" -- "$IMPORT" "$D/no_input_shape.onnx"
expect 0 -- "$IMPORT" "$D/no_input_shape.onnx" --shape x=2,3
expect 0 -- "$RUN" "$D/no_input_shape.onnx" --data-set "$D/good_data"
expect 2 "input_0.pb" "'x'" "int64" -- "$RUN" "$D/no_input_shape.onnx" --data-set "$D/data_wrong_dtype"
# with no shape in the model, a data shape that does not fit the weights is caught by the node
expect 2 "no_input_shape.onnx" "[MatMul] node 'matmul'" "[6]" -- "$RUN" "$D/no_input_shape.onnx" --data-set "$D/data_wrong_rank"
expect 1 -- "$RUN" "$D/no_input_shape.onnx" --data-set "$D/data_wrong_shape"
for kind in dotdot absolute symlink; do
  expect 2 "$kind.onnx" "escaping_weight" "outside.bin" -- "$IMPORT" "$D/escape/model/$kind.onnx"
done
expect 2 "huge_initializer.onnx" "huge_weight" -- "$IMPORT" "$D/huge_initializer.onnx"
expect 2 "big_short_initializer.onnx" "big_short_weight" -- "$IMPORT" "$D/big_short_initializer.onnx"
expect 2 "big_short_initializer.onnx" "big_short_weight" "raw_data" -- "$IMPORT" "$D/big_short_initializer.onnx" --max-memory 64G
expect 2 "huge_constant.onnx" "make_huge" -- "$IMPORT" "$D/huge_constant.onnx"
expect 2 "huge_input.onnx" "huge_input" -- "$IMPORT" "$D/huge_input.onnx"
expect 2 "huge_intermediate.onnx" "huge_fill" -- "$IMPORT" "$D/huge_intermediate.onnx"
expect 2 "gather_elements_oob.onnx" "[GatherElements] node 'gather_rows'" "[3, 3]" "[2, 3]" "axis 0" -- "$IMPORT" "$D/gather_elements_oob.onnx"
expect 2 "negative_split.onnx" "[Split] node 'negative_split'" "-2" "negative" -- "$IMPORT" "$D/negative_split.onnx"
# zero-sized dims from the command line (the attention fusion and the training graph divide by them)
expect 2 "--dim" "batch=0" "at least 1" -- "$IMPORT" "$D/unbound_dim.onnx" --dim batch=0 --dim seq_len=5
expect 2 "--shape" "tokens=2,0" "at least 1" -- "$IMPORT" "$D/unbound_dim.onnx" --shape tokens=2,0
# memory limits: the default is half the RAM; --max-memory sets it (per tensor and activation arena)
expect 2 "constant_of_shape_16g.onnx" "[ConstantOfShape] node 'fill_16g'" "17179869184 bytes" "1073741824" -- \
  "$IMPORT" "$D/constant_of_shape_16g.onnx" --max-memory 1G
expect 2 "--max-memory" "lots" -- "$IMPORT" "$D/good.onnx" --max-memory lots
expect 2 "--max-memory" "-5" -- "$IMPORT" "$D/good.onnx" --max-memory -5

# --- oases-run: the same model errors, then bad data sets --------------------------------------
expect 2 "no_such_model.onnx" -- "$RUN" "$D/no_such_model.onnx" --data-set "$D/good_data"
expect 2 "garbage.onnx" -- "$RUN" "$D/garbage.onnx" --data-set "$D/good_data"
expect 2 "FrobnicateOp" "WibbleOp" "com.example.unknown" -- "$RUN" "$D/unsupported.onnx" --data-set "$D/good_data"
expect 2 "mismatched_matmul" -- "$RUN" "$D/matmul_mismatch.onnx" --data-set "$D/good_data"
expect 2 "escaping_weight" -- "$RUN" "$D/escape/model/dotdot.onnx" --data-set "$D/good_data"
expect 2 "no_such_folder" -- "$RUN" "$D/good.onnx" --data-set "$D/no_such_folder"
expect 2 "input_0.pb" -- "$RUN" "$D/good.onnx" --data-set "$D/data_garbage"
expect 2 "input_0.pb" "'x'" "int64" "float32" -- "$RUN" "$D/good.onnx" --data-set "$D/data_wrong_dtype"
expect 2 "input_0.pb" "'x'" "[3, 3]" "[2, 3]" -- "$RUN" "$D/good.onnx" --data-set "$D/data_wrong_shape"
expect 2 "input_0.pb" "'x'" "[6]" "[2, 3]" -- "$RUN" "$D/good.onnx" --data-set "$D/data_wrong_rank"
expect 2 "input_0.pb" -- "$RUN" "$D/good.onnx" --data-set "$D/data_huge_input"
expect 2 "good_data" -- "$RUN" "$D/good.onnx" --data-set "$D/good_data/input_0.pb"
expect 1 -- "$RUN" "$D/good.onnx" --data-set "$D/data_mismatch"
# a NaN tolerance would pass any output
expect 2 "--rtol" "finite" -- "$RUN" "$D/good.onnx" --data-set "$D/data_mismatch" --rtol nan --atol nan
expect 2 "--atol" "finite" -- "$RUN" "$D/good.onnx" --data-set "$D/data_mismatch" --atol inf
expect 2 "--atol" "finite" -- "$RUN" "$D/good.onnx" --data-set "$D/data_mismatch" --atol -1
expect 2 "--threads" "100000" -- "$RUN" "$D/good.onnx" --data-set "$D/good_data" --threads 100000
expect 2 "fill_16g" "17179869184 bytes" -- "$RUN" "$D/constant_of_shape_16g.onnx" --data-set "$D/good_data" --max-memory 1G
expect 0 -- "$RUN" "$D/two_outputs.onnx" --data-set "$D/two_outputs_data"
# zero rows: MatMul, a broadcast Add, Softmax and a mean over no rows run (and give empty outputs, NaN means)
expect 0 -- "$RUN" "$D/empty_rows.onnx" --data-set "$D/empty_rows_data"
expect 2 "activation arena" "102400" "--max-memory" -- "$RUN" "$D/two_outputs.onnx" --data-set "$D/two_outputs_data" --max-memory 100K

echo "$checks checks, $failures failed"
[[ $failures -eq 0 ]]
