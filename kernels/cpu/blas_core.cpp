#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <strings.h>

#include <array>

namespace oases::kernels {

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string blas_config() {
  const char* config = openblas_get_config();
  return config ? config : "";
}

bool blas_core_selectable() {
  return blas_config().find("DYNAMIC_ARCH") != std::string::npos;
}

bool blas_core_is_pre_avx2(std::string_view core) {
  // OpenBLAS's x86 core names (driver/others/dynamic.c) whose kernels stop at SSE or AVX. The
  // Bulldozer line (Bulldozer, Piledriver, Steamroller, Excavator) is left out: those are AMD's own
  // FMA4/AVX kernels for AMD's own CPUs, not a fallback.
  static constexpr std::array<std::string_view, 18> kPreAvx2 = {
      "Unknown",    "Katmai",  "Coppermine", "Northwood", "Prescott",     "Banias",    "Atom", "Core2",  "Penryn",
      "Dunnington", "Nehalem", "Athlon",     "Opteron",   "Opteron_SSE3", "Barcelona", "Nano", "Bobcat", "Sandybridge"};
  for (std::string_view c : kPreAvx2) {
    if (c.size() == core.size() && strncasecmp(c.data(), core.data(), c.size()) == 0) return true;
  }
  return false;
}

std::string blas_core_for_cpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

std::string_view blas_core_isa(std::string_view core) {
  if (core == "SkylakeX") return "AVX-512";
  if (core == "Haswell") return "AVX2";
  return "";
}

}  // namespace oases::kernels
