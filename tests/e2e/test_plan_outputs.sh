#!/usr/bin/env bash
# oases-plan writes a plan (JSON), a Graphviz DOT and a self-contained HTML page; the page renders
# in headless Chromium to a screenshot that is not blank. The JSON holds per value its spec and
# local shape, per op its layout, every collective with its bytes, per-rank parameter memory, and
# the Megatron count of all-reduces (2 forward and 2 backward per block).
source "$(dirname "$0")/lib.sh"
P=$OASES_BIN/oases-plan
for model in gpt2_tiny llama_gqa; do
  M=$OASES_SOURCE_DIR/models/small/$model/model.onnx
  "$P" "$M" --tp 2 --dp 2 --strategy megatron --out "$WORK/$model.json" --html "$WORK/$model.html" --dot "$WORK/$model.dot" \
    || fail "$model: oases-plan failed"
  /usr/bin/python3 - "$WORK/$model.json" "$model" <<'PY' || fail "$model: plan content"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["format"] == "oases-plan" and p["version"] == 1
assert p["mesh"] == {"axes": ["dp", "tp"], "sizes": [2, 2], "ranks": 4}
for v in p["values"]:
    assert {"name", "shape", "spec", "local_shape"} <= v.keys(), v
for o in p["ops"]:
    assert {"name", "op", "inputs", "outputs", "layout", "phase"} <= o.keys(), o
assert p["memory"]["parameter_bytes_per_rank"] < p["memory"]["parameter_bytes_total"]
for c in p["collectives"]:
    assert c["payload_bytes"] > 0 and c["ring_bytes_per_rank"] >= 0, c
# Megatron: per block, the tp group all-reduces once after each row-parallel projection (forward)
# and once for each column-parallel projection's input gradient (backward)
for b in p["blocks"]:
    tp = [c for c in b["collectives"] if c["mesh_axis"] == "tp" and c["op"] == "AllReduce"]
    fwd = sum(c["phase"] == "forward" for c in tp)
    bwd = sum(c["phase"] == "backward" for c in tp)
    assert (fwd, bwd) == (2, 2), (sys.argv[2], b["index"], fwd, bwd, [(c["op"], c["phase"], c["scope"]) for c in b["collectives"]])
    assert b["attention"]["heads_per_rank"] * 2 == b["attention"]["heads"]
print(sys.argv[2], "plan ok:", len(p["values"]), "values,", len(p["collectives"]), "collectives")
PY
  # graphviz is a required package (scripts/setup.sh): without `dot` the DOT file goes unchecked, a failure
  if command -v dot >/dev/null; then
    dot -Tsvg "$WORK/$model.dot" -o "$WORK/$model.svg" || fail "$model: dot rejects the DOT file"
  else
    fail "$model: graphviz 'dot' is missing (scripts/setup.sh installs it): the DOT file cannot be checked"
  fi
  # self-contained: nothing is loaded from the network (src/href/CSS url()/@import to http(s) or protocol-relative //)
  if grep -qiE "(src|href)[[:space:]]*=[[:space:]]*[\"']?(https?:)?//|url\([[:space:]]*[\"']?(https?:)?//|@import" "$WORK/$model.html"; then
    fail "$model: the HTML page loads a remote resource: $(grep -oiE "(src|href)[[:space:]]*=[[:space:]]*[\"']?(https?:)?//[^\"' >]*|url\([^)]*\)|@import[^;]*" "$WORK/$model.html" | head -1)"
  fi
done
BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
# chromium is a required package (scripts/setup.sh), like graphviz: without it the page goes unrendered, a failure
if [[ -z $BROWSER ]]; then
  fail "no headless Chromium (scripts/setup.sh installs it): the HTML page cannot be rendered"
  finish
fi
"$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,900 \
  --screenshot="$WORK/plan.png" "file://$WORK/gpt2_tiny.html" >/dev/null 2>&1 || fail "chromium could not render the page"
/usr/bin/python3 - "$WORK/plan.png" <<'PY' || fail "the screenshot is blank"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
    if kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
bpp = {2: 3, 6: 4}[ctype]
assert depth == 8, depth
stride = w * bpp
# undo the PNG row filters to get real pixel values
img, prev, pos = [], bytearray(stride), 0
for y in range(h):
    f = raw[pos]
    line = bytearray(raw[pos + 1:pos + 1 + stride])
    pos += 1 + stride
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    img.append(bytes(line))
    prev = line
colours = {row[x:x + 3] for row in img[::5] for x in range(0, stride, bpp * 3)}
print(f"screenshot {w}x{h}: {len(colours)} distinct colours")
assert len(colours) > 20, f"only {len(colours)} colours: the page is blank"
PY
finish
