#!/usr/bin/env bash
# Zero-bubble pipelines (--pipeline zb-h1, planner/pipeline.h): each backward split into B (the
# input gradient, sent to the stage before at once) and W (the weight gradients, in the stage's
# waits). On a tied GPT-2-style and an untied LLaMA-style 4-block model it reproduces the
# single-rank losses over 20 steps (1e-6 relative) and gradients (fp32, 2e-6 relative, as
# test_pipeline.sh explains) at pp 2 and 4, with tp 2 x dp 2 and the oases schedule inside the
# stages, with the distributed optimizer, on stage meshes, as threads and under mpirun; its stage
# arenas stay within 15% of 1F1B's largest (the W's held are 1F1B's first-stage peak); a plan file
# carries it to oases-train.
# ctest: COST 28 (seconds on 2 cores, 2026-11-28: the longest scripts start first)
source "$(dirname "$0")/lib.sh"
pipeline_tests  # (lib.sh) T, mpirun, common, run
RUN_FLAGS=(--pipeline zb-h1)

for model in gpt2_4l llama_4l; do
  M=$OASES_SOURCE_DIR/models/train/$model/model.onnx
  one_rank_reference "$model" "$M"
  run "$model pp2" "$model" "$T" "$M" --local-ranks 2 -- --pp 2
  run "$model pp4 M8" "$model" "$T" "$M" --local-ranks 4 -- --pp 4 --micro-batches 8
  run "$model pp2 tp2 dp2 oases" "$model" "$T" "$M" --local-ranks 8 -- --pp 2 --tp 2 --dp 2 --micro-batches 4 --schedule oases --chunks 2
  run "$model pp2 dp2 zero" "$model" "$T" "$M" --local-ranks 4 -- --pp 2 --dp 2 --micro-batches 4 --zero 1
  run "$model stage meshes 2x1,1x2" "$model" "$T" "$M" --local-ranks 4 -- --pp 2 --stage-meshes 2x1,1x2 --micro-batches 4
  run "$model mpi pp2 tp2" "$model" "${MPIRUN[@]}" -np 4 "$T" "$M" -- --pp 2 --tp 2 --micro-batches 4
done

# memory: the largest stage arena under zb-h1 against 1F1B's (pp 4, 8 micro-batches)
M=$OASES_SOURCE_DIR/models/train/gpt2_4l/model.onnx
for p in 1f1b zb-h1; do
  "$T" "$M" "${common[@]}" --local-ranks 4 --pp 4 --micro-batches 8 --pipeline $p --steps 1 --memory-report >"$WORK/mem_$p.txt" 2>&1 \
    || fail "memory report ($p)"
done
/usr/bin/python3 - "$WORK/mem_1f1b.txt" "$WORK/mem_zb-h1.txt" <<'EOF' || fail "zb-h1's arenas"
import re, sys
def arenas(path):
    rows = re.findall(r"^stage (\d) \([\w-]+\): .* at most (\d+) micro-batches in flight, arena ([\d.]+) KiB", open(path).read(), re.M)
    assert len(rows) == 4, open(path).read()
    return {int(s): (int(m), float(k)) for s, m, k in rows}
one, zb = arenas(sys.argv[1]), arenas(sys.argv[2])
assert all(zb[s][0] <= 4 for s in zb), zb  # held to the W: 1F1B's first-stage peak (4 stages)
r = max(k for _, k in zb.values()) / max(k for _, k in one.values())
assert r <= 1.15, f"zb-h1's largest arena {r:.2f}x 1F1B's: {zb} vs {one}"
print(f"ok: zb-h1's largest stage arena {r:.2f}x 1F1B's ({', '.join(f'{zb[s][1]:.0f}' for s in sorted(zb))} KiB vs "
      f"{', '.join(f'{one[s][1]:.0f}' for s in sorted(one))})")
EOF

# a plan file's pipeline schedule
"$T" "$M" "${common[@]}" --steps 1 --local-ranks 2 --pp 2 --pipeline zb-h1 --export-plan "$WORK/zb.plan.json" >/dev/null || fail "export a zb-h1 plan"
grep -q '"schedule": "zb-h1"' "$WORK/zb.plan.json" && echo "ok: the exported plan names zb-h1" || fail "the exported plan lacks zb-h1"
out=$("$T" "$M" "${common[@]}" --steps 1 --local-ranks 2 --plan "$WORK/zb.plan.json" --memory-report 2>&1) || fail "run a zb-h1 plan: $out"
grep -q "(zb-h1)" <<<"$out" && echo "ok: oases-train --plan runs zb-h1" || fail "the zb-h1 plan did not run zb-h1: $out"
expect_error "--pipeline zb-h2" "pipeline" "$T" "$M" "${common[@]}" --steps 1 --local-ranks 2 --pp 2 --pipeline zb-h2
finish
