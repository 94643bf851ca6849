#!/usr/bin/env bash
# End-to-end test on every committed model under models/small/<name>/:
#   - oases-run on each test_data_set_*/ against PyTorch's reference outputs, default tolerance
#     (rtol 1e-4, atol 1e-5);
#   - oases-import -v, checked against <name>/expect.txt (written by models/export.py from the
#     PyTorch configuration): number of blocks, hidden size and vocabulary, counts of fused ops,
#     every block's attention / MLP / norms, tied or untied head; and no op of a decomposed
#     LayerNorm, RMSNorm, GELU, SiLU or attention left in the canonical graph (every fusion fired).
# Needs only the built tools: no network, no PyTorch, no Python.
# Environment: OASES_BIN (folder of oases-import, oases-run), OASES_SOURCE_DIR (repository root).
set -uo pipefail
BIN=${OASES_BIN:-build/bin}
SRC=${OASES_SOURCE_DIR:-.}
SMALL=$SRC/models/small
# ops that must not survive canonicalisation on these models: each is part of a decomposition
# that a fusion should have replaced (ReduceMean/Pow/Sqrt: norms; Erf/Tanh: GELU; Sigmoid: SiLU;
# Softmax: attention; Trilu: a causal mask built at run time)
LEFTOVER_OPS=(ReduceMean Pow Sqrt Reciprocal Erf Tanh Sigmoid Softmax Trilu)

pass=0
fail=0
failures=()
ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  failures+=("$1")
  echo "FAIL: $1"
}

[[ -x $BIN/oases-import && -x $BIN/oases-run ]] || { echo "FAIL: no oases-import/oases-run in $BIN"; echo "0 passed, 1 failed"; exit 1; }
shopt -s nullglob
models=("$SMALL"/*/model.onnx)
[[ ${#models[@]} -ge 10 ]] || bad "expected at least 10 committed models under $SMALL, found ${#models[@]}"

for model in "${models[@]}"; do
  dir=$(dirname "$model")
  name=$(basename "$dir")
  expect=$dir/expect.txt
  if [[ ! -f $expect ]]; then
    bad "$name: no expect.txt"
    continue
  fi
  dims=$(sed -n 's/^dims//p' "$expect")

  # --- forward pass against the reference, on every data set -----------------------------------
  sets=("$dir"/test_data_set_*)
  [[ ${#sets[@]} -ge 1 ]] || bad "$name: no test_data_set_*"
  for ds in "${sets[@]}"; do
    out=$("$BIN/oases-run" "$model" --data-set "$ds" 2>&1)
    rc=$?
    if [[ $rc -eq 0 ]]; then
      ok
      echo "ok:   $name/$(basename "$ds"): $(echo "$out" | grep -E '^output' | tr -s ' ' | paste -sd ';')"
    else
      bad "$name/$(basename "$ds"): oases-run exit $rc: $(echo "$out" | grep -E 'MISMATCH|error' | head -3 | paste -sd ';')"
    fi
  done

  # --- import and structure ----------------------------------------------------------------------
  # shellcheck disable=SC2086  # dims holds several words
  summary=$("$BIN/oases-import" "$model" -v $dims 2>&1)
  rc=$?
  if [[ $rc -ne 0 ]]; then
    bad "$name: oases-import exit $rc: $(echo "$summary" | head -2 | paste -sd ';')"
    continue
  fi
  ops_line=$(echo "$summary" | grep -E '^ops ' | sed 's/^ops *//')
  block_lines=$(echo "$summary" | grep -E '^  block +[0-9]+:')
  nblocks=$(echo "$block_lines" | grep -c . || true)
  problems=()
  while IFS= read -r line; do
    [[ -z $line || $line == \#* ]] && continue
    key=${line%% *}
    rest=${line#* }
    [[ $key == "$line" ]] && rest=""
    case $key in
      dims) ;;
      blocks)
        echo "$summary" | grep -qE "^blocks +${rest//(/\\(}" || problems+=("expected 'blocks $rest', got '$(echo "$summary" | grep -E '^blocks' | tr -s ' ')'")
        want=${rest%% *}
        [[ $nblocks -eq $want ]] || problems+=("expected $want block lines, got $nblocks")
        ;;
      op)
        op=${rest% *}
        n=${rest##* }
        got=$(echo ", $ops_line," | grep -oE ", ${op//./\\.} [0-9]+," | grep -oE '[0-9]+' || echo 0)
        [[ $got -eq $n ]] || problems+=("expected $n × $op in the canonical graph, got $got")
        ;;
      block)
        have=$(echo "$block_lines" | grep -cF -- "$rest" || true)
        [[ $have -eq $nblocks && $nblocks -gt 0 ]] || problems+=("'$rest' in $have of $nblocks block lines")
        ;;
      head)
        hl=$(echo "$summary" | grep -E '^  head ')
        if [[ -z $hl ]]; then
          problems+=("no LM head found")
        elif [[ $rest == tied ]]; then
          [[ $hl == *"(tied to the token embedding)"* ]] || problems+=("head not found tied: $hl")
        else
          [[ $hl != *"tied"* ]] || problems+=("head found tied, expected untied: $hl")
        fi
        ;;
      *) problems+=("unknown expect.txt line '$line'") ;;
    esac
  done <"$expect"
  for op in "${LEFTOVER_OPS[@]}"; do
    if echo ", $ops_line," | grep -qE ", $op [0-9]+,"; then problems+=("$op left in the canonical graph (a fusion did not fire)"); fi
  done
  if [[ ${#problems[@]} -eq 0 ]]; then
    ok
    echo "ok:   $name: $(echo "$summary" | grep -E '^blocks' | tr -s ' '); ops $ops_line"
  else
    for p in "${problems[@]}"; do bad "$name: $p"; done
    echo "$summary" | sed 's/^/      /'
  fi
done

# a model with symbolic dimensions says which to bind when they are not given
dyn=$SMALL/llama_dynamo_dynamic/model.onnx
if [[ -f $dyn ]]; then
  msg=$("$BIN/oases-import" "$dyn" 2>&1)
  rc=$?
  if [[ $rc -eq 2 && $msg == *"symbolic dimension 'batch'"*"--dim batch=N"* ]]; then ok; else bad "llama_dynamo_dynamic without --dim: exit $rc, '$msg'"; fi
fi

echo
if [[ $fail -gt 0 ]]; then
  echo "failures:"
  printf '  %s\n' "${failures[@]}"
fi
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
