#!/usr/bin/env bash
# The distributed optimizer (--zero 1, ZeRO stage 1): optimizer state sharded over the dp group,
# gradients reduce-scattered, parameters all-gathered after the update. On a tied GPT-2-style and an
# untied LLaMA-style 4-block model it reproduces the single-rank losses over 20 steps (1e-6
# relative) and gradients (fp32, 2e-6 relative, as test_pipeline.sh explains) at dp 2 and 4, with
# tp 2 and sequence parallelism, inside the oases schedule, under pipeline stages (a tied table
# across stages included), on stage meshes, with SGD and clipping, as threads and under mpirun;
# each rank holds 1/dp of the optimizer state (--memory-report, within 5%); checkpoints stay
# layout-free (saved under --zero 1 at dp 4, resaved at dp 2 without it and back, bit for bit; a
# resumed run continues the straight one); bad settings are one-line errors (exit 2).
# ctest: COST 40 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
T=$OASES_BIN/oases-train
need_mpirun
common=(--synthetic --batch 16 --seq 32 --lr 1e-3 -q)
RUN_FLAGS=(--zero 1)
run() { run_vs_one_rank "$@"; }  # (lib.sh) 20 steps and the first step's gradients, under --zero 1, against one rank's

for model in gpt2_4l llama_4l; do
  M=$OASES_SOURCE_DIR/models/train/$model/model.onnx
  for opt in adamw sgd; do
    ref=$model-$opt
    extra=(--optimizer $opt)
    [[ $opt == sgd ]] && extra+=(--clip 0.5 --weight-decay 0.01)
    "$T" "$M" "${common[@]}" "${extra[@]}" --steps 20 --log-json "$WORK/$ref.jsonl" --dump-grads "$WORK/$ref.grads" || fail "$ref single rank"
    run "$model $opt dp2" "$ref" "$T" "$M" --local-ranks 2 -- --dp 2 "${extra[@]}"
    [[ $opt == sgd ]] && continue
    run "$model dp4" "$ref" "$T" "$M" --local-ranks 4 -- --dp 4 "${extra[@]}"
    run "$model tp2 dp2 sp" "$ref" "$T" "$M" --local-ranks 4 -- --tp 2 --dp 2 --sequence-parallel "${extra[@]}"
    run "$model dp2 oases K2" "$ref" "$T" "$M" --local-ranks 2 -- --dp 2 --schedule oases --chunks 2 "${extra[@]}"
    run "$model pp2 dp2 1f1b" "$ref" "$T" "$M" --local-ranks 4 -- --pp 2 --dp 2 --pipeline 1f1b "${extra[@]}"
    run "$model pp2 tp2 dp2 eager-1f1b oases" "$ref" "$T" "$M" --local-ranks 8 -- --pp 2 --tp 2 --dp 2 --micro-batches 4 \
      --pipeline eager-1f1b --schedule oases --chunks 2 "${extra[@]}"
    run "$model stage meshes 1x2,2x1" "$ref" "$T" "$M" --local-ranks 4 -- --pp 2 --stage-meshes 1x2,2x1 "${extra[@]}"
    run "$model mpi tp2 dp2" "$ref" "${MPIRUN[@]}" -np 4 "$T" "$M" -- --tp 2 --dp 2 "${extra[@]}"
  done
done

# each rank holds 1/dp of the optimizer state (the tied table's too, on both stages)
M=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
for layout in "--dp 4" "--tp 2 --dp 2" "--pp 2 --dp 2"; do
  # shellcheck disable=SC2086
  out=$("$T" "$M" "${common[@]}" --local-ranks 4 $layout --zero 1 --steps 1 --memory-report 2>&1) || fail "memory report ($layout)"
  /usr/bin/python3 - "$layout" "$out" <<'EOF' || fail "optimizer state under --zero 1 ($layout)"
import re, sys
layout, out = sys.argv[1], sys.argv[2]
dp = int(re.search(r"--dp (\d+)", layout).group(1))
rows = re.findall(r"optimizer state ([\d.]+) MiB \(ZeRO-1: its pieces; whole it would be ([\d.]+) MiB\)", out)
assert rows, out
for held, whole in rows:
    ratio = float(whole) / float(held)
    assert abs(ratio - dp) <= 0.05 * dp, f"{layout}: {held} MiB held of {whole} MiB: {ratio:.2f}x, not {dp}x"
print(f"ok {layout}: optimizer state cut {', '.join(f'{float(w) / float(h):.2f}x' for h, w in rows)} (dp {dp})")
EOF
done

# checkpoints are layout-free: saved under --zero 1 at dp 4, resaved at dp 2 without it, and back
"$T" "$M" "${common[@]}" --steps 20 --stop-after 10 --local-ranks 4 --dp 4 --zero 1 --save "$WORK/z4.ckpt" || fail "zero dp4 save"
"$T" "$M" "${common[@]}" --steps 10 --local-ranks 2 --dp 2 --resume "$WORK/z4.ckpt" --save "$WORK/d2.ckpt" || fail "dp2 resave"
"$T" "$M" "${common[@]}" --steps 10 --local-ranks 4 --dp 4 --zero 1 --resume "$WORK/d2.ckpt" --save "$WORK/z4b.ckpt" || fail "zero dp4 resave"
"$T" "$M" "${common[@]}" --steps 10 --local-ranks 4 --pp 2 --dp 2 --zero 1 --resume "$WORK/z4.ckpt" --save "$WORK/pz.ckpt" || fail "pp zero resave"
"$T" "$M" "${common[@]}" --steps 10 --resume "$WORK/pz.ckpt" --save "$WORK/one.ckpt" || fail "one-rank resave"
for c in d2 z4b one; do same_checkpoint "$WORK/z4.ckpt" "$WORK/$c.ckpt" || fail "checkpoint resaved as $c differs"; done
"$T" "$M" "${common[@]}" --steps 20 --local-ranks 2 --dp 2 --zero 1 --resume "$WORK/z4.ckpt" --log-json "$WORK/resumed.jsonl" || fail "resume"
"$T" "$M" "${common[@]}" --steps 20 --log-json "$WORK/straight.jsonl" || fail "straight run"
resumed_continues "$WORK/straight.jsonl" "$WORK/resumed.jsonl" "under --zero 1 at dp 2" || fail "resumed losses"

# a plan file's "zero": 1 turns it on
"$T" "$M" "${common[@]}" --steps 1 --local-ranks 2 --dp 2 --export-plan "$WORK/exported.json" >/dev/null || fail "export a plan"
/usr/bin/python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); p["zero"] = 1; json.dump(p, open(sys.argv[2], "w"))' \
  "$WORK/exported.json" "$WORK/zero.json" || fail "plan with zero 1 written"
out=$("$T" "$M" "${common[@]}" --steps 1 --local-ranks 2 --plan "$WORK/zero.json" --memory-report 2>&1) || fail "plan with zero 1"
grep -q "ZeRO-1: its pieces" <<<"$out" && echo "ok: a plan's \"zero\": 1 shards the state" || fail "a plan's zero 1 did not shard: $out"

# planned with it (oases-plan --zero 1): the plan file carries it, the replayed stage programs' memory
# (moments of the pieces) is what the search priced within 15%, and oases-train --plan runs it sharded
vocabulary_heavy_stack
for z in 0 1; do
  "$OASES_BIN/oases-plan" "$V" --gpus 4 --cluster "$WORK/pcie.json" --batch 32 --seq 64 --memory 0.065 --pp 2 --dtype fp32 --simulate \
    --simulate-pipelines 1 --zero $z --out "$WORK/pp$z.plan.json" >"$WORK/plan$z.txt" 2>&1 || fail "oases-plan --zero $z"
done
/usr/bin/python3 - "$WORK/pp0.plan.json" "$WORK/pp1.plan.json" <<'EOF' || fail "oases-plan --zero 1"
import json, sys
plans = [json.load(open(f)) for f in sys.argv[1:3]]
assert "zero" not in plans[0] and plans[1].get("zero") == 1, (plans[0].get("zero"), plans[1].get("zero"))
EOF
for z in 0 1; do stage_memory_within "$WORK/plan$z.txt" "zero $z" || fail "oases-plan --zero $z: stage memory"; done
out=$("$T" "$V" --synthetic --plan "$WORK/pp1.plan.json" --local-ranks 4 --steps 2 --memory-report -q 2>&1) || fail "oases-train --plan (zero 1): $out"
if grep -q "ZeRO-1: its pieces" <<<"$out"; then echo "ok: oases-train --plan runs the planned ZeRO-1"; else fail "the planned ZeRO-1 did not shard: $out"; fi

# the pipeline search weighs the distributed optimizer by itself (--zero auto): 8 GPUs under 40 MiB,
# where no one-mesh plan fits, take it; the plan runs sharded
"$OASES_BIN/oases-plan" "$V" --gpus 8 --cluster "$WORK/pcie.json" --batch 32 --seq 64 --memory 0.04 --dtype fp32 \
  --out "$WORK/auto.plan.json" >"$WORK/auto.txt" 2>&1 || fail "oases-plan --zero auto"
if grep -q "ZeRO-1" "$WORK/auto.txt" && grep -q '"zero": 1' "$WORK/auto.plan.json"; then
  echo "ok: the pipeline search chose ZeRO-1 under 40 MiB: $(grep -m1 'ZeRO-1' "$WORK/auto.txt" | sed 's/^ *//' | cut -c1-120)"
else
  fail "the pipeline search did not take ZeRO-1 under 40 MiB: $(cat "$WORK/auto.txt")"
fi
out=$("$T" "$V" --synthetic --plan "$WORK/auto.plan.json" --local-ranks 8 --steps 2 --memory-report -q 2>&1) || fail "run the auto plan: $out"
grep -q "ZeRO-1: its pieces" <<<"$out" && echo "ok: the auto plan runs sharded" || fail "the auto plan did not shard: $out"
# a hand-made pipeline priced with it (Megatron-LM's --use-distributed-optimizer): less memory
for ref in 2,2,4,1f1b,plain 2,2,4,1f1b,plain,zero; do
  "$OASES_BIN/oases-plan" "$V" --gpus 8 --cluster "$WORK/pcie.json" --batch 32 --seq 64 --dtype fp32 --no-pipeline \
    --reference-pipeline $ref >"$WORK/ref_${ref//,/_}.txt" 2>&1 || fail "--reference-pipeline $ref"
done
/usr/bin/python3 - "$WORK/ref_2_2_4_1f1b_plain.txt" "$WORK/ref_2_2_4_1f1b_plain_zero.txt" <<'EOF' || fail "--reference-pipeline ...,zero"
import re, sys
def ref(path):
    t = open(path).read()
    m = re.search(r"^  reference\s+step\s+([\d.]+) ms .*memory ([\d.]+) MiB", t, re.M)
    assert m, t
    return float(m.group(1)), float(m.group(2)), "ZeRO-1" in t
(s0, m0, z0), (s1, m1, z1) = ref(sys.argv[1]), ref(sys.argv[2])
assert not z0 and z1 and m1 < m0, (s0, m0, z0, s1, m1, z1)
print(f"ok: the reference pipeline with ZeRO-1 {m1} MiB ({s1} ms) against {m0} MiB ({s0} ms) without")
EOF

# bad settings
expect_error "--zero 2" "zero" "$T" "$M" "${common[@]}" --steps 1 --zero 2
printf '{"format": "oases-plan", "version": 2, "mesh": {"axes": ["dp", "tp"], "sizes": [2, 1], "ranks": 2}, "zero": 2}' >"$WORK/bad_zero.json"
expect_error "plan with zero 2" "bad_zero.json: zero" "$T" "$M" "${common[@]}" --steps 1 --local-ranks 2 --plan "$WORK/bad_zero.json"
expect_error "--zero 1 on a GPU" "zero 1.*CPU ranks only" "$T" "$M" "${common[@]}" --steps 1 --zero 1 --device cuda
finish
