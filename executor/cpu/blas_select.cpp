#include "executor/cpu/blas_select.h"

#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/blas_core.h"

namespace oases {

namespace {

constexpr const char* kCoreType = "OPENBLAS_CORETYPE";
constexpr const char* kGuard = "OASES_BLAS_REEXEC";
constexpr const char* kAuto = "OASES_BLAS_AUTO";
constexpr const char* kTestDetected = "OASES_TEST_BLAS_DETECTED";

// Set once by select_blas_core, before any thread: read-only afterwards.
std::string g_note;

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

bool switched_off(const std::string& v) {
  for (const char* off : {"0", "off", "no", "false"}) {
    if (strcasecmp(v.c_str(), off) == 0) return true;
  }
  return false;
}

std::string isa_of(const std::string& core, const std::string& fallback) {
  std::string_view isa = kernels::blas_core_isa(core);
  if (isa.empty()) isa = kernels::blas_core_isa(fallback);
  return isa.empty() ? std::string("x86-64") : std::string(isa);
}

BlasCoreInputs inputs_from_environment() {
  BlasCoreInputs in;
  in.detected = kernels::blas_core();
  in.selectable = kernels::blas_core_selectable();
  in.cpu_core = kernels::blas_core_for_cpu();
  in.user_coretype = env(kCoreType);
  in.reexec_guard = env(kGuard);
  in.auto_setting = env(kAuto);
  return in;
}

}  // namespace

BlasCoreChoice choose_blas_core(const BlasCoreInputs& in) {
  BlasCoreChoice c;
  const bool weak = kernels::blas_core_is_pre_avx2(in.detected);
  if (in.reexec_guard) {
    // the re-executed process: reports, never executes again (even if the core did not change)
    std::string asked = in.user_coretype.value_or("");
    std::string isa = isa_of(asked, in.cpu_core);
    c.note = fmt::format("auto: detected {} on an {} CPU", *in.reexec_guard, isa);
    if (weak) {
      c.note += fmt::format("; OPENBLAS_CORETYPE={} did not take", asked);
      c.warning = fmt::format(
          "OpenBLAS runs its {} kernels although OPENBLAS_CORETYPE={} was set for this {} CPU: matrix products run "
          "several times slower",
          in.detected, asked, isa);
    }
    return c;
  }
  if (in.user_coretype) {
    c.note = fmt::format("OPENBLAS_CORETYPE={} from the environment", *in.user_coretype);
    return c;
  }
  if (!weak || in.cpu_core.empty()) {
    c.note = "as detected";
    return c;
  }
  std::string isa = isa_of(in.cpu_core, "");
  if (in.auto_setting && switched_off(*in.auto_setting)) {
    c.note = fmt::format("as detected; {}={} keeps it on this {} CPU, which could run {}", kAuto, *in.auto_setting, isa, in.cpu_core);
    return c;
  }
  if (!in.selectable) {
    c.note = fmt::format("as detected; not a DYNAMIC_ARCH OpenBLAS, which cannot switch to {}", in.cpu_core);
    c.warning = fmt::format(
        "OpenBLAS runs its {} kernels on this {} CPU and, built without DYNAMIC_ARCH, cannot switch to {}: matrix "
        "products run several times slower",
        in.detected, isa, in.cpu_core);
    return c;
  }
  c.reexec = true;
  c.force = in.cpu_core;
  c.note = fmt::format("auto: detected {} on an {} CPU", in.detected, isa);
  return c;
}

void select_blas_core(char** argv) {
  BlasCoreInputs in = inputs_from_environment();
  if (auto pretend = env(kTestDetected); pretend && !in.reexec_guard) in.detected = *pretend;
  BlasCoreChoice c = choose_blas_core(in);
  if (in.reexec_guard) {
    // ours, not the user's: programs this one starts choose for themselves
    unsetenv(kGuard);
    unsetenv(kCoreType);
  }
  if (c.reexec) {
    setenv(kCoreType, c.force.c_str(), 1);
    setenv(kGuard, in.detected.c_str(), 1);
    std::fflush(stdout);
    std::fflush(stderr);
    execv("/proc/self/exe", argv);  // returns only on failure
    int err = errno;
    unsetenv(kCoreType);
    unsetenv(kGuard);
    c.note = fmt::format("as detected; running again with {}={} failed: {}", kCoreType, c.force, std::strerror(err));
    c.warning = fmt::format(
        "OpenBLAS runs its {} kernels on this {} CPU and running again with {}={} failed ({}): matrix products run "
        "several times slower; set {}={} yourself",
        in.detected, isa_of(c.force, ""), kCoreType, c.force, std::strerror(err), kCoreType, c.force);
  }
  if (!c.warning.empty()) std::fprintf(stderr, "warning: %s\n", c.warning.c_str());
  g_note = c.note;
}

std::string blas_core_report() {
  std::string note = g_note;
  if (note.empty()) {  // a program that does not select (a test): how its core came to be
    BlasCoreChoice c = choose_blas_core(inputs_from_environment());
    note = c.reexec ? "as detected" : c.note;
  }
  return fmt::format("OpenBLAS core {} ({})", kernels::blas_core(), note);
}

}  // namespace oases
