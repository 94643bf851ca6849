#!/usr/bin/env bash
# The cuDNN frontend (header-only C++, NVIDIA's graph API over cuDNN: the fused attention of
# kernels/cuda/attention_cudnn.cpp) into .deps/cudnn_frontend/include, which cmake/oases_cuda.cmake
# finds. Taken from the PyPI wheel nvidia-cudnn-frontend (its include/ folder); the wheel is always
# the same file (the headers are the same in every platform's wheel), checked against its SHA-256.
#
# Idempotent: nothing is fetched when the pinned version is already there. Skipped where no CUDA
# compiler is found (OASES_CUDNN_FRONTEND=1 fetches anyway, =0 never). Never fatal: without the
# headers the CUDA build still works and the cuDNN attention path says "built without the cuDNN
# frontend".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 0
VERSION=1.32.0
WHEEL=nvidia_cudnn_frontend-${VERSION}-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
DEST=.deps/cudnn_frontend

want=${OASES_CUDNN_FRONTEND:-auto}
if [[ $want == 0 ]]; then
  echo "setup_cudnn_frontend: skipped (OASES_CUDNN_FRONTEND=0)"
  exit 0
fi
if [[ $want == auto ]] && ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup_cudnn_frontend: skipped (no nvcc: the CPU build does not use it; OASES_CUDNN_FRONTEND=1 fetches anyway)"
  exit 0
fi
if [[ -f $DEST/VERSION && $(cat "$DEST/VERSION") == "$VERSION" && -f $DEST/include/cudnn_frontend.h ]]; then
  echo "setup_cudnn_frontend: cuDNN frontend $VERSION present in $DEST"
  exit 0
fi

# pip: the project's virtual environment (scripts/setup_python.sh), else the system's
PIP=()
if [[ -x .venv/bin/pip ]]; then
  PIP=(.venv/bin/pip)
elif /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
  PIP=(/usr/bin/python3 -m pip)
elif python3 -m pip --version >/dev/null 2>&1; then
  PIP=(python3 -m pip)
else
  echo "setup_cudnn_frontend: no pip found; the CUDA build goes without the cuDNN frontend"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
timeout -k 10 600 "${PIP[@]}" download -q --disable-pip-version-check --timeout 30 --retries 2 --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
  --python-version 311 --implementation cp --abi cp311 -d "$TMP" "nvidia-cudnn-frontend==$VERSION" 2>&1 | tail -2
if [[ ! -f $TMP/$WHEEL ]]; then
  echo "setup_cudnn_frontend: could not download $WHEEL (offline?); the CUDA build goes without the cuDNN frontend"
  exit 0
fi
if [[ $(sha256sum "$TMP/$WHEEL" | cut -d' ' -f1) != "$SHA256" ]]; then
  echo "setup_cudnn_frontend: $WHEEL does not have the pinned SHA-256; not installed"
  exit 0
fi
# a wheel is a zip: take include/ only, then swap it in whole
/usr/bin/python3 - "$TMP/$WHEEL" "$TMP/out" <<'EOF' || { echo "setup_cudnn_frontend: cannot unpack the wheel"; exit 0; }
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit("no include/cudnn_frontend.h in the wheel")
    for n in names:
        z.extract(n, sys.argv[2])
EOF
echo "$VERSION" >"$TMP/out/VERSION"
mkdir -p .deps
rm -rf "$DEST"
mv "$TMP/out" "$DEST"
echo "setup_cudnn_frontend: cuDNN frontend $VERSION in $DEST/include"
