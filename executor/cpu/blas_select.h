// Every oases tool runs OpenBLAS's best kernels for the CPU by itself. OpenBLAS reads
// OPENBLAS_CORETYPE only while it loads, before main(); when it has fallen back to a pre-AVX2 core
// (kernels/cpu/blas_core.h) on a CPU with AVX2 or AVX-512, the tool sets OPENBLAS_CORETYPE to the
// core the CPU can run and executes itself again (execv of /proc/self/exe, same pid, same
// arguments), once. Under mpirun or srun each rank does so before MPI_Init, which the launcher
// never notices: the pid stays.
//
// Environment:
//   OPENBLAS_CORETYPE   set by the user: always obeyed, never changed
//   OASES_BLAS_AUTO=0   keep whatever OpenBLAS detected (also "off", "no", "false")
//   OASES_BLAS_REEXEC   set on the re-executed process (to the core OpenBLAS had detected): it
//                       never re-executes again, and removes the guard and its OPENBLAS_CORETYPE
//                       from its environment, so programs it starts see the user's environment
//   OASES_TEST_BLAS_DETECTED=CORE   tests only: treat CORE as what OpenBLAS detected, so the
//                       re-execution can be tested where OpenBLAS knows the CPU
#pragma once

#include <optional>
#include <string>

namespace oases {

// What the choice depends on: this process's OpenBLAS, the CPU and the environment.
struct BlasCoreInputs {
  std::string detected;                      // the core OpenBLAS runs now (kernels::blas_core())
  bool selectable = true;                    // a DYNAMIC_ARCH OpenBLAS
  std::string cpu_core;                      // kernels::blas_core_for_cpu(): "SkylakeX", "Haswell" or ""
  std::optional<std::string> user_coretype;  // OPENBLAS_CORETYPE
  std::optional<std::string> reexec_guard;   // OASES_BLAS_REEXEC
  std::optional<std::string> auto_setting;   // OASES_BLAS_AUTO
};

struct BlasCoreChoice {
  bool reexec = false;  // set OPENBLAS_CORETYPE=force and the guard, and execute again
  std::string force;
  std::string note;     // how the core in use was chosen, e.g. "auto: detected Prescott on an AVX-512 CPU"
  std::string warning;  // one line for stderr when the core is worse than the CPU allows, else empty
};

// The decision alone (no environment, no exec): the unit tests drive every case through it.
BlasCoreChoice choose_blas_core(const BlasCoreInputs& in);

// The first statement of every tool's main(), before MPI_Init, any thread and any BLAS call: may
// not return (re-executes the program), else records how the core was chosen for
// blas_core_report(). When the re-execution fails the tool goes on as detected, with one warning.
void select_blas_core(char** argv);

// "OpenBLAS core SkylakeX (auto: detected Prescott on an AVX-512 CPU)": the core in use and how it
// was chosen ("as detected" when select_blas_core did not run).
std::string blas_core_report();

}  // namespace oases
