#!/usr/bin/env bash
# Hugging Face models as users export them (models/hf, made by models/make_hf.sh): tiny random
# GPT-2, LLaMA (grouped-query), BERT, OPT and Phi from `transformers`, written by `optimum-cli export onnx`
# (opset 18) and by torch.onnx.export (TorchScript exporter, opset 17, dynamic axes). Each must
# import with attention found in every block, run its forward equal to ONNX Runtime's (a padded
# row included), give PyTorch's gradients (optimum exports, models/hf/*/grads), and train under tp 2
# with the oases schedule and 2 chunks, dp 2 and tp 2 x dp 2 sequence-parallel with the single-rank
# losses.
source "$(dirname "$0")/lib.sh"
# The tolerances the README states (measured with OpenBLAS's SkylakeX / Haswell / Prescott kernels,
# 2026-11-26): the logits within 1e-6 of the largest logit (worst 3.6e-7 / 3.6e-7 / 4.1e-7,
# torchscript_phi), each gradient within 1e-6 of its largest magnitude (compare_grads;
# worst 5.2e-7 / 5.9e-7 / 7.4e-7: optimum_llama, optimum_opt, optimum_llama).
FWD_RTOL=1e-6
GRAD_RTOL=1e-6
for d in "$OASES_SOURCE_DIR"/models/hf/*/; do
  d=${d%/}
  name=$(basename "$d")
  [[ -f $d/model.onnx ]] || continue
  # the other architectures (params.json, ViT): tests/e2e/test_hf_architectures.sh
  [[ -f $d/params.json || $name == dynamo_* || $name == *_vit ]] && continue
  before=$FAILURES
  found=$("$OASES_BIN/oases-import" "$d/model.onnx" --verbose --shape input_ids=2,16 --shape attention_mask=2,16 2>&1 | grep find-transformer-blocks)
  [[ $found == *"2 transformer blocks (2 attention, 2 MLP)"* ]] || fail "$name: blocks not found: $found"
  if forward_within "$d/model.onnx" "$d/test_data_set_0" "$FWD_RTOL"; then
    echo "ok $name: forward within $FORWARD_WORST of the largest logit"
  else
    fail "$name: forward differs from ONNX Runtime by more than $FWD_RTOL of the largest logit ($FORWARD_WORST): $FORWARD_OUT"
  fi
  if [[ -d $d/grads ]]; then  # PyTorch's gradients (optimum exports): autodiff, re-tied heads, merged initializers
    "$OASES_BIN/oases-train" "$d/model.onnx" --inputs "$d/test_data_set_0" --steps 0 --dump-grads "$WORK/grads.$name" -q >/dev/null \
      || fail "$name: --dump-grads failed"
    /usr/bin/python3 "$OASES_SOURCE_DIR/tests/e2e/compare_grads.py" "$d/grads" "$WORK/grads.$name" "$name vs PyTorch" --rtol "$GRAD_RTOL" \
      || fail "$name: gradients differ from PyTorch's"
  fi
  ref=""
  for layout in "" "--local-ranks 2 --tp 2 --schedule oases --chunks 2" "--local-ranks 2 --dp 2" "--local-ranks 4 --tp 2 --dp 2 --sequence-parallel"; do
    rm -f "$WORK/l.jsonl"
    # shellcheck disable=SC2086
    "$OASES_BIN/oases-train" "$d/model.onnx" --synthetic --steps 3 --batch 4 --seq 16 $layout -q --log-json "$WORK/l.jsonl" \
      || { fail "$name [$layout]: training failed"; continue; }
    losses=$(/usr/bin/python3 -c "import json,sys; print(' '.join(f\"{json.loads(l)['loss']:.5e}\" for l in open(sys.argv[1])))" "$WORK/l.jsonl")
    if [[ -z $ref ]]; then ref=$losses; continue; fi
    /usr/bin/python3 - "$ref" "$losses" <<'PY' || fail "$name [$layout]: losses $losses differ from one rank's $ref"
import sys
a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
assert len(a) == len(b) == 3 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (a, b)
PY
  done
  [[ $FAILURES == "$before" ]] && echo "ok: $name: attention found, forward equal to ONNX Runtime, gradients as PyTorch's (where given), tp/dp/chunked losses equal"
done
finish
