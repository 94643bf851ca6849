// Which OpenBLAS kernel set ("core") runs, and which one this CPU could run.
// An OpenBLAS built with DYNAMIC_ARCH (Debian's is) picks its core once, when the library loads:
// the one OPENBLAS_CORETYPE names, else the one for the CPU model it recognises. A model it does
// not know gets a generic pre-AVX2 core: OpenBLAS 0.3.21 on Emerald Rapids (family 6, model 207)
// runs its Prescott (SSE3) kernels, about a quarter of the SkylakeX (AVX-512) kernels' sgemm rate.
// executor/cpu/blas_select.h decides what to do about it.
#pragma once

#include <string>
#include <string_view>

namespace oases::kernels {

// The core OpenBLAS runs in this process, e.g. "SkylakeX", "Prescott" (openblas_get_corename).
std::string blas_core();

// OpenBLAS's build configuration, e.g. "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64".
std::string blas_config();

// True when OpenBLAS was built with DYNAMIC_ARCH, i.e. OPENBLAS_CORETYPE chooses among its cores.
bool blas_core_selectable();

// True for OpenBLAS's cores without AVX2 kernels (Prescott, Core2, Nehalem, Sandybridge, the old AMD
// ones, ...): what OpenBLAS falls back to on a CPU it does not know. A name it does not list
// (Haswell, Zen, SkylakeX, Cooperlake, a newer one) is not.
bool blas_core_is_pre_avx2(std::string_view core);

// The OpenBLAS core this CPU can run: "SkylakeX" with AVX-512 F, BW, DQ and VL, else "Haswell" with
// AVX2 and FMA, else "" (the CPU and the OS both must enable them: __builtin_cpu_supports checks
// both).
std::string blas_core_for_cpu();

// "AVX-512" for SkylakeX, "AVX2" for Haswell: the instruction set a blas_core_for_cpu() core needs.
std::string_view blas_core_isa(std::string_view core);

}  // namespace oases::kernels
