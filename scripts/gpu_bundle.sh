#!/usr/bin/env bash
# scripts/gpu_bundle.sh [OUT.tar.xz]: packs a CUDA build of the tools and GPU tests, with the shared
# libraries they need that a GPU machine without this project's Debian -dev packages lacks
# (OpenBLAS, ONNX, protobuf, fmt, gfortran, ...), into one archive; CUDA, cuBLAS, cuDNN, NCCL and NVRTC
# are taken from the GPU machine. How docs/GPU.md's first runs were made: on the GPU machine,
#
#   mkdir -p /tmp/oases && tar -C /tmp/oases -xJf oases-gpu.tar.xz
#   source /tmp/oases/env.sh            # PATH, OASES_BIN, OASES_BUNDLE_INFO, LD_LIBRARY_PATH (finds the
#                                       # CUDA libraries: cudart, cuBLAS, cuDNN and its sub-libraries,
#                                       # NCCL, NVRTC and its builtins)
#   bash scripts/gpu_checks.sh          # from a checkout of the same commit (models, test data); it
#                                       # writes its record under docs/gpu-runs (OASES_GPU_RUN_DIR)
#
# The build: ${OASES_GPU_BUILD_DIR:-build-gpu}, configured here if missing with the CUDA backend,
# without MPI (one process; NCCL across GPUs needs an MPI build on the GPU machine itself) and for
# ${OASES_CUDA_ARCHS:-90}. oases_gpu_tests finds the committed models through $OASES_SOURCE_DIR,
# which scripts/gpu_checks.sh sets to the checkout it runs from (else the path it was built at).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-oases-gpu.tar.xz}
BUILD=${OASES_GPU_BUILD_DIR:-build-gpu}
TARGETS=(oases-train oases-run oases-gpu-info oases-profile oases-plan oases_gpu_tests)
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  command -v ccache >/dev/null && GEN+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DOASES_MPI=OFF -DOASES_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${OASES_CUDA_ARCHS:-90}" >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib"
for t in "${TARGETS[@]}"; do cp "$BUILD/bin/$t" "$STAGE/bin/"; done
strip "$STAGE"/bin/*
# the libraries outside glibc, libstdc++ and CUDA's own
ldd "$STAGE"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++* | libgcc_s* | libz.so*) ;;
    libcuda* | libcublas* | libcudnn* | libnccl* | libnvrtc* | libnvJitLink*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done
# what the binaries were built from: gpu_checks.sh heads its record with it
ARCHS=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
{
  echo "built from $(git rev-parse HEAD 2>/dev/null || echo "an unknown commit")$(git diff --quiet HEAD 2>/dev/null || echo " (tree dirty)")"
  echo "on $(date -u '+%Y-%m-%d %H:%M UTC'), CUDA architectures ${ARCHS:-80;90 (the project default)}"
} >"$STAGE/BUILD_INFO"
cat >"$STAGE/env.sh" <<'EOF'
# source me: the bundle's tools on PATH, its libraries and the machine's CUDA libraries found
# (cudart, cuBLAS, cuBLASLt, cuDNN with its sub-libraries, NCCL, NVRTC with its builtins, which
# cuDNN's runtime-compiled engines load, nvJitLink), in one pass over the file system
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_dirs=$_here/lib
_need="libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13"
_also="libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9 libcudnn_engines_precompiled.so.9 libcudnn_ops.so.9 libcudnn_heuristic.so.9 libnvrtc-builtins.so.13.0 libnvJitLink.so.13"
_expr=()
for _n in $_need $_also; do _expr+=(${_expr[0]:+-o} -name "$_n"); done
_found=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o \( "${_expr[@]}" \) -print 2>/dev/null)
_add() { case ":$_dirs:" in *":$1:"*) ;; *) _dirs=$_dirs:$1 ;; esac; }
_pick() { grep -m1 "/$1\$" <<<"$_found"; }
for _n in $_need; do
  _f=$(_pick "$_n")
  if [[ -n $_f ]]; then _add "$(dirname "$_f")"; else echo "env.sh: $_n not found" >&2; fi
done
# the helpers: from the folder of the library they belong to when it has them, else wherever found
for _n in $_also; do
  _have=""
  IFS=: read -ra _ds <<<"$_dirs"
  for _d in "${_ds[@]}"; do [[ -e $_d/$_n ]] && _have=1 && break; done
  [[ -n $_have ]] && continue
  _f=$(_pick "$_n")
  if [[ -n $_f ]]; then _add "$(dirname "$_f")"; else echo "env.sh: $_n not found (cuDNN or NVRTC may fail at run time)" >&2; fi
done
# Python keeps the machine's own path (scripts/gpu_checks.sh runs it so): PyTorch brings its own
# cuDNN and refuses to load beside an older one found here first
export OASES_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
export LD_LIBRARY_PATH=$_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$_here/bin:$PATH OASES_BIN=$_here/bin OASES_BUNDLE_INFO=$_here/BUILD_INFO
unset _here _dirs _n _f _need _also _expr _found _have _ds _d
unset -f _add _pick
EOF
tar -C "$STAGE" -cJf "$OUT" .
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): ${TARGETS[*]} and $(ls "$STAGE/lib" | wc -l) libraries"
