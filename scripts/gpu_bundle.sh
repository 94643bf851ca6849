#!/usr/bin/env bash
# scripts/gpu_bundle.sh [OUT.tar.xz]: packs a CUDA build of the tools and GPU tests, with the shared
# libraries they need that a GPU machine without this project's Debian -dev packages lacks
# (OpenBLAS, ONNX, protobuf, fmt, gfortran, ...), into one archive; CUDA, cuBLAS, cuDNN, NCCL and NVRTC
# are taken from the GPU machine. How docs/GPU.md's first runs were made: on the GPU machine,
#
#   mkdir -p /tmp/oases && tar -C /tmp/oases -xJf oases-gpu.tar.xz
#   source /tmp/oases/env.sh            # PATH, OASES_BIN, LD_LIBRARY_PATH (finds the CUDA libraries)
#   bash scripts/gpu_checks.sh          # from a checkout of the same commit (models, test data)
#
# The build: ${OASES_GPU_BUILD_DIR:-build-gpu}, configured here if missing with the CUDA backend,
# without MPI (one process; NCCL across GPUs needs an MPI build on the GPU machine itself) and for
# ${OASES_CUDA_ARCHS:-90}. The test binaries carry this checkout's path for their data
# (OASES_SOURCE_DIR): check the commit out at the same path there, or link it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-oases-gpu.tar.xz}
BUILD=${OASES_GPU_BUILD_DIR:-build-gpu}
TARGETS=(oases-train oases-run oases-gpu-info oases_gpu_tests)
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
cat >"$STAGE/env.sh" <<'EOF'
# source me: the bundle's tools on PATH, its libraries and the machine's CUDA libraries found
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_dirs=$_here/lib
for _n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
  _f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$_n" -print 2>/dev/null | head -1)
  if [[ -n $_f ]]; then _dirs=$_dirs:$(dirname "$_f"); else echo "env.sh: $_n not found" >&2; fi
done
export LD_LIBRARY_PATH=$_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$_here/bin:$PATH OASES_BIN=$_here/bin
unset _here _dirs _n _f
EOF
tar -C "$STAGE" -cJf "$OUT" .
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): ${TARGETS[*]} and $(ls "$STAGE/lib" | wc -l) libraries"
