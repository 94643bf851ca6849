#!/usr/bin/env bash
# The Oases paper's seven GPT stacks (models/make_oases_stacks.py), generated into a temporary
# folder with zero-filled sparse external weights, each imported by oases-import: the summary
# must show the right blocks, hidden size, heads, vocabulary and fusions, without reading the
# weights (peak memory stays far below the weights' size). Needs python3 with onnx and numpy
# (Debian's python3-onnx), no PyTorch, no network.
set -uo pipefail
BIN=${OASES_BIN:-build/bin}
SRC=${OASES_SOURCE_DIR:-.}
PY=${OASES_ONNX_PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $1"; }

if ! "$PY" "$SRC/models/make_oases_stacks.py" --out "$TMP" >"$TMP/make.log" 2>&1; then
  cat "$TMP/make.log"
  echo "0 passed, 1 failed"
  exit 1
fi
cat "$TMP/make.log"
for spec in 1024:24 2048:24 3072:24 4096:16 6144:16 8192:8 12288:4; do
  h=${spec%:*}
  l=${spec#*:}
  name=gpt_h${h}_l${l}
  model=$TMP/$name/model.onnx
  weights=$(stat -c %s "$TMP/$name/weights.bin")
  start=$EPOCHREALTIME
  if [[ -x /usr/bin/time ]]; then  # GNU time (Debian package 'time') measures the peak memory
    out=$(/usr/bin/time -f "maxrss_kb %M" "$BIN/oases-import" "$model" --dim batch=8 --dim sequence=1024 -v 2>&1)
  else
    out=$("$BIN/oases-import" "$model" --dim batch=8 --dim sequence=1024 -v 2>&1)
  fi
  rc=$?
  secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  rss=$(echo "$out" | sed -n 's/^maxrss_kb //p')
  problems=()
  [[ $rc -eq 0 ]] || problems+=("exit $rc: $(echo "$out" | grep error | head -1)")
  grep -qE "^blocks +$l \(hidden $h, vocabulary 50257\)" <<<"$out" || problems+=("no 'blocks $l (hidden $h, vocabulary 50257)'")
  nb=$(echo "$out" | grep -cE "^  block +[0-9]+: attention $((h / 64)) heads x 64 causal, qkv fused; mlp gelu_tanh $((4 * h)); norms layernorm, layernorm$" || true)
  [[ $nb -eq $l ]] || problems+=("$nb of $l block lines as expected")
  grep -q "(tied to the token embedding)" <<<"$out" || problems+=("tied head not found")
  grep -qE "fuse-attention +fused $l attention \($l causal" <<<"$out" || problems+=("attention not fused as causal in every block")
  # the weights stay unread: peak memory far below their size (and below 1 GiB)
  if [[ -n $rss ]]; then
    [[ $rss -lt 1048576 && $((rss * 1024)) -lt $weights ]] || problems+=("peak memory ${rss} KB for ${weights} bytes of weights")
  else
    rss="(not measured: no /usr/bin/time)"
  fi
  if [[ ${#problems[@]} -eq 0 ]]; then
    pass=$((pass + 1))
    echo "ok:   $name: $(echo "$out" | grep -E '^parameters' | tr -s ' '), imported in ${secs} s, peak memory ${rss} KB"
  else
    for p in "${problems[@]}"; do bad "$name: $p"; done
    echo "$out" | head -20 | sed 's/^/      /'
  fi
done
echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
