#!/usr/bin/env bash
# A virtual environment with a current PyTorch 2.x from PyPI for bench/train's second PyTorch peer,
# in build/bench-venv (or $OASES_BENCH_VENV). Idempotent: does nothing when torch 2.x already
# imports and multiplies there. Uses Debian's /usr/bin/python3, without its site packages (so
# Debian's torch 1.13 stays out of it).
#
# PyPI's Linux wheel is the CUDA build. It is installed first with --no-deps plus only its
# non-CUDA requirements (read from the wheel's own metadata); when it cannot be imported so (the
# CUDA build loads libtorch_cuda.so, which needs the CUDA libraries it declares), torch's declared
# dependencies are installed too (a few GB, unused on the CPU).
#   OASES_BENCH_TORCH_SPEC  pip requirement (default: torch>=2,<3)
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=${OASES_BENCH_VENV:-build/bench-venv}
SPEC=${OASES_BENCH_TORCH_SPEC:-torch>=2,<3}
PY=$VENV/bin/python
die() { echo "setup_torch2: $*" >&2; exit 2; }
works() {
  "$PY" - 2>/dev/null <<'EOF'
import sys, torch
assert int(torch.__version__.split(".")[0]) >= 2
(torch.randn(2, 2) @ torch.randn(2, 2)).sum().item()
print(torch.__version__)
EOF
}
why() { "$PY" -c "import torch" 2>&1 | tail -1; }

if v=$(works); then
  echo "setup_torch2: torch $v in $VENV"
  exit 0
fi
[[ -x /usr/bin/python3 ]] || die "needs /usr/bin/python3 (Debian's python3)"
if [[ ! -x $PY ]]; then
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV" || die "cannot create $VENV (Debian: apt-get install python3-venv)"
fi
# pip's output only when it fails (installing without the CUDA packages makes its resolver list
# every missing one, which is intended here)
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
pip() { "$PY" -m pip --disable-pip-version-check -q "$@" >"$LOG" 2>&1 || { tail -5 "$LOG" >&2; return 1; }; }
echo "setup_torch2: installing $SPEC from PyPI into $VENV (without its CUDA packages first) ..."
pip install --no-deps "$SPEC" || die "pip install --no-deps '$SPEC' failed (PyPI unreachable?)"
# torch's own requirements, less the CUDA ones (nvidia-*, cuda-*, triton) and extras
deps=$("$PY" - <<'EOF'
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
for line in requires("torch") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    name = r.name.lower()
    if name.startswith(("nvidia-", "cuda-")) or name == "triton":
        continue
    print(str(r).split(";")[0])
EOF
) || die "cannot read torch's requirements"
# numpy is optional for torch; without it every import warns
# shellcheck disable=SC2086
pip install $deps numpy || die "pip install of torch's requirements failed: $deps"
if ! v=$(works); then
  ver=$("$PY" -c "from importlib.metadata import version; print(version('torch'))")
  echo "setup_torch2: torch $ver does not import without its CUDA packages ($(why)); installing torch's declared dependencies (a few GB, unused on the CPU) ..."
  pip install "torch==$ver" || die "pip install torch==$ver with its dependencies failed"
  v=$(works) || die "torch in $VENV does not work: $(why)"
fi
echo "setup_torch2: torch $v in $VENV"
