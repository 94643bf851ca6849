#!/usr/bin/env bash
# The check that runs everywhere: oases-gpu-info loads the CUDA libraries this build links and
# reads their versions. With the CUDA backend built, the versions that need no GPU (CUDA runtime,
# cuBLAS, cuBLASLt, cuDNN, NCCL) must be read and agree with the headers the build used, and every
# cuBLAS function the kernels call must be found (cuBLAS is opened on first use); without the
# backend it must say "built without CUDA". Devices are reported, never required.
source "$(dirname "$0")/lib.sh"
"$OASES_BIN/oases-gpu-info" --json > "$WORK/info.json" || fail "oases-gpu-info failed"
"$OASES_BIN/oases-gpu-info" || fail "oases-gpu-info (text) failed"
/usr/bin/python3 - "$WORK/info.json" <<'PY' || fail "library versions"
import json, sys
j = json.load(open(sys.argv[1]))
if not j["built"]:
    assert "built without CUDA" in j["devices"]["error"], j
    print("built without CUDA: nothing to load")
    sys.exit(0)
libs = {l["library"]: l for l in j["libraries"]}
for name in ("cudart", "cublas", "cublasLt", "cudnn", "nccl"):
    assert name in libs, name
    l = libs[name]
    assert l["read"], f"{name}: could not read its version: {l['note']}"
    if l["compiled"]:
        assert l["version"].split(".")[0] == l["compiled"].split(".")[0], f"{name}: loaded {l['version']}, built against {l['compiled']}"
    print(f"{name}: {l['version']}" + (f" (built against {l['compiled']})" if l["compiled"] else ""))
d = j["devices"]
print("devices:", d["count"], d.get("names") or d.get("error"))
PY
# cuBLAS is opened on first use (kernels/cuda/cublas_lazy.cpp; the versions above went through it):
# a run that never calls it does not map cuBLASLt's ~150 MiB
if grep -q '"built": true' "$WORK/info.json"; then
  LD_DEBUG=files "$OASES_BIN/oases-train" --help >/dev/null 2>"$WORK/ld.txt" || fail "oases-train --help"
  if grep -q "libcublas" "$WORK/ld.txt"; then
    fail "oases-train --help maps cuBLAS: $(grep -m1 libcublas "$WORK/ld.txt")"
  else
    echo "ok: oases-train starts without cuBLAS"
  fi
fi
finish
