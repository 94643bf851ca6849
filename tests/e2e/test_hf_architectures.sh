#!/usr/bin/env bash
# More Hugging Face architectures (models/hf/dynamo_* and torchscript_*, made by models/make_hf.sh):
# tiny random Qwen2, Mistral, GPT-NeoX, Gemma, Bloom, GPT-J, Falcon, DistilBERT, RoBERTa, ViT and T5
# exported by torch's dynamo exporter (opset 20) and its TorchScript exporter (opset 17). For each
# model that is supported:
#   - one block found per layer (parallel attention + MLP counted once),
#   - forward equal to ONNX Runtime's (test_data_set_0) within FWD_RTOL of the largest logit,
#   - gradients equal to PyTorch's (GRAD_RTOL) for exactly PyTorch's parameters (grads/: PyTorch's gradients
#     mapped onto the initializers holding them; a buffer trained, or a parameter not trained,
#     makes the two sets differ), and the count of trained parameters equal to PyTorch's
#     (params.json),
#   - buffers bit-identical after two optimizer steps (--export-onnx),
#   - tp 2, and tp 2 with the oases schedule and 2 chunks, giving the single-rank losses.
# Each model not supported yet must fail with a one-line error naming what is missing, exit 2
# (UNSUPPORTED below: the stage it fails at and the words its message must hold).
# ctest: COST 32 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
# Tolerances (measured with OpenBLAS's SkylakeX / Haswell / Prescott kernels, 2026-11-26): the logits
# within 1e-6 of the largest logit (worst 3.1e-7 / 3.1e-7 / 4.0e-7: dynamo_roberta, torchscript_distilbert),
# each gradient within 3e-6 of its largest magnitude (compare_grads; worst 1.4e-6 / 2.0e-6 / 9.6e-7,
# all T5; the others at most 7.9e-7).
FWD_RTOL=1e-6
GRAD_RTOL=3e-6
declare -A UNSUPPORTED
# shellcheck source=/dev/null
source "$(dirname "$0")/hf_architectures_expected.sh"

expect_failure() {  # name stage rc output
  local name=$1 stage=$2 rc=$3 out=$4 want=${UNSUPPORTED[$1]#*:}
  local want_stage=${UNSUPPORTED[$1]%%:*}
  local lines
  lines=$(printf '%s\n' "$out" | grep -c .)
  if [[ $stage != "$want_stage" ]]; then
    fail "$name: failed at $stage (expected at $want_stage): $out"
  elif [[ $rc != 2 || $lines != 1 || $out != *"$want"* ]]; then
    fail "$name: $stage should fail with exit 2 and one line naming '$want'; got exit $rc: $out"
  else
    echo "ok: $name: not supported yet, says so at $stage: $out"
  fi
}

for d in "$OASES_SOURCE_DIR"/models/hf/dynamo_*/ "$OASES_SOURCE_DIR"/models/hf/torchscript_*/; do
  d=${d%/}
  name=$(basename "$d")
  [[ -f $d/params.json ]] || continue  # the first five architectures: test_hf_exports.sh
  before=$FAILURES
  forward_within "$d/model.onnx" "$d/test_data_set_0" "$FWD_RTOL"
  rc=$?
  if [[ $rc != 0 ]]; then
    out=$(grep -v '^ran \|^output ' <<<"$FORWARD_OUT")  # an unsupported model's error line alone
    if [[ -n ${UNSUPPORTED[$name]:-} ]]; then
      expect_failure "$name" forward "$rc" "$out"
    else
      fail "$name: forward: more than $FWD_RTOL of the largest logit from ONNX Runtime's ($FORWARD_WORST): $FORWARD_OUT"
    fi
    continue
  fi
  [[ -f $d/params.json ]] || continue
  # one block per layer, parallel attention + MLP (GPT-NeoX, GPT-J, Falcon) included. T5: its
  # self-attention adds the trained relative position bias, which the fused attention op cannot
  # differentiate as a mask, so it stays unfused (and replicated under tp): the 2 cross-attentions
  # and 4 MLPs are found.
  want_blocks="2 transformer blocks (2 attention, 2 MLP)"
  [[ $name == *_t5 ]] && want_blocks="4 transformer blocks (2 attention, 4 MLP)"
  found=$("$OASES_BIN/oases-import" "$d/model.onnx" --verbose --dim batch=2 --dim seq=16 2>&1 | grep find-transformer-blocks)
  [[ $found == *"$want_blocks"* ]] || fail "$name: expected $want_blocks: $found"
  out=$("$OASES_BIN/oases-train" "$d/model.onnx" --inputs "$d/test_data_set_0" --steps 0 --dump-grads "$WORK/grads.$name" 2>&1)
  rc=$?
  if [[ $rc != 0 ]]; then
    out=$(printf '%s\n' "$out" | grep -v '^  buffer ' | grep -v 'parameters (')
    if [[ -n ${UNSUPPORTED[$name]:-} ]]; then expect_failure "$name" gradients "$rc" "$out"; else fail "$name: gradients: $out"; fi
    continue
  fi
  [[ -n ${UNSUPPORTED[$name]:-} && ${UNSUPPORTED[$name]%%:*} != tp ]] && fail "$name: expected to fail (${UNSUPPORTED[$name]}) but trains"
  $PY "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$d/grads" "$WORK/grads.$name" "$name vs PyTorch" --rtol "$GRAD_RTOL" ||
    fail "$name: gradients differ from PyTorch's (or other initializers are trained)"
  want=$($PY -c "import json,sys; print(len(json.load(open(sys.argv[1]))['parameters']))" "$d/params.json")
  got=$(printf '%s\n' "$out" | sed -n 's/^\([0-9]*\) parameters\{0,1\} (.*/\1/p' | head -1)
  [[ $got == "$want" ]] || fail "$name: trains $got parameters, PyTorch $want: $out"
  # buffers untouched by two optimizer steps
  "$OASES_BIN/oases-train" "$d/model.onnx" --inputs "$d/test_data_set_0" --steps 2 --lr 1e-2 -q --export-onnx "$WORK/$name.onnx" >/dev/null 2>&1 ||
    fail "$name: training --export-onnx failed"
  $PY - "$d/model.onnx" "$WORK/$name.onnx" "$d/params.json" <<'PY' || fail "$name: a buffer changed, or a parameter did not"
import json, sys
import numpy as np, onnx
from onnx import numpy_helper
a, b = (dict((t.name, numpy_helper.to_array(t)) for t in onnx.load(p).graph.initializer) for p in sys.argv[1:3])
held = {m["initializer"] for m in json.load(open(sys.argv[3]))["parameters"].values() if m}
for k, v in a.items():
    if v.dtype != np.float32 or k not in b:
        continue
    assert k in held or np.array_equal(v, b[k]), f"buffer {k} changed"
    assert k not in held or not np.array_equal(v, b[k]), f"parameter {k} did not change"
PY
  if [[ ${UNSUPPORTED[$name]:-} == tp:* ]]; then
    out=$("$OASES_BIN/oases-train" "$d/model.onnx" --synthetic --steps 2 --batch 2 --seq 16 --local-ranks 2 --tp 2 -q 2>&1 >/dev/null)
    expect_failure "$name" tp "$?" "$out"
    continue
  fi
  ref=""
  for layout in "" "--local-ranks 2 --tp 2" "--local-ranks 2 --tp 2 --schedule oases --chunks 2"; do
    rm -f "$WORK/l.jsonl"
    # shellcheck disable=SC2086
    "$OASES_BIN/oases-train" "$d/model.onnx" --synthetic --steps 2 --batch 2 --seq 16 $layout -q --log-json "$WORK/l.jsonl" >/dev/null ||
      {
        fail "$name [$layout]: training failed"
        continue
      }
    losses=$($PY -c "import json,sys; print(' '.join(f\"{json.loads(l)['loss']:.5e}\" for l in open(sys.argv[1])))" "$WORK/l.jsonl")
    if [[ -z $ref ]]; then
      ref=$losses
      continue
    fi
    $PY - "$ref" "$losses" <<'PY' || fail "$name [$layout]: losses $losses differ from one rank's $ref"
import sys
a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
assert len(a) == len(b) == 2 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (a, b)
PY
  done
  [[ $FAILURES == "$before" ]] && echo "ok: $name: forward = ONNX Runtime (within $FORWARD_WORST of the largest logit), gradients = PyTorch's on its $want parameters, buffers held, tp 2 = one rank"
done
finish
