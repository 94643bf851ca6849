# Sourced by scripts/fuzz.sh and scripts/sanitize.sh (ci): configures the one clang build folder
# that instruments every library with -fsanitize=fuzzer-no-link,address,undefined (OASES_FUZZ=ON).
# It serves the libFuzzer targets and CI's lean ASan+UBSan pass (unit tests, oases-train under
# thread and MPI ranks), so CI compiles the libraries under ASan once, not twice.
# -O1 with line tables: libFuzzer's usual choice (symbolised reports, a cold build about a third
# faster than -O2 -g), the hot libraries' -O3 too (OASES_HOT_OPT empty), unity builds (sixteen
# sources a unit, CMakeLists.txt: a cold build's compile work about 45% less; these folders are
# built once, not edited). No CUDA. Sets FUZZ_BUILD_DIR.
FUZZ_BUILD_DIR=${OASES_FUZZ_BUILD_DIR:-build-fuzz}
if [[ ! -f "$FUZZ_BUILD_DIR/CMakeCache.txt" ]]; then
  fuzz_gen=()
  command -v ninja >/dev/null && fuzz_gen=(-G Ninja)
  command -v ccache >/dev/null && fuzz_gen+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  CC=clang CXX=clang++ cmake -S . -B "$FUZZ_BUILD_DIR" "${fuzz_gen[@]}" -DCMAKE_BUILD_TYPE=Fuzz \
    -DCMAKE_CXX_FLAGS_FUZZ="-O1 -gline-tables-only" -DCMAKE_C_FLAGS_FUZZ="-O1 -gline-tables-only" \
    -DOASES_FUZZ=ON -DOASES_CUDA=OFF -DCMAKE_UNITY_BUILD=ON -DOASES_HOT_OPT= >/dev/null
fi
