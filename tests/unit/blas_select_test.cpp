// The OpenBLAS core choice of executor/cpu/blas_select.h: every case of choose_blas_core (which
// re-executes, which obeys the user, which never loops), and the OpenBLAS and CPU probes of
// kernels/cpu/blas_core.h against this process. The tools' actual re-execution (a fresh process,
// mpirun, thread ranks) is tested by tests/e2e/test_blas_core.sh.
#include <gtest/gtest.h>

#include "executor/cpu/blas_select.h"
#include "kernels/cpu/blas_core.h"

namespace oases {
namespace {

BlasCoreInputs misdetected_avx512() {
  BlasCoreInputs in;
  in.detected = "Prescott";
  in.selectable = true;
  in.cpu_core = "SkylakeX";
  return in;
}

TEST(BlasCore, PreAvx2Cores) {
  for (const char* weak : {"Prescott", "prescott", "Core2", "Nehalem", "Sandybridge", "Atom", "Barcelona", "Unknown"}) {
    EXPECT_TRUE(kernels::blas_core_is_pre_avx2(weak)) << weak;
  }
  // AVX2 and later, AMD's own lines, and names OpenBLAS may add later: never replaced
  for (const char* good : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "Excavator", "Zen5", ""}) {
    EXPECT_FALSE(kernels::blas_core_is_pre_avx2(good)) << good;
  }
}

TEST(BlasCore, IsaNames) {
  EXPECT_EQ(kernels::blas_core_isa("SkylakeX"), "AVX-512");
  EXPECT_EQ(kernels::blas_core_isa("Haswell"), "AVX2");
  EXPECT_EQ(kernels::blas_core_isa("Prescott"), "");
}

TEST(BlasCore, CpuCoreFollowsTheCpuFlags) {
  __builtin_cpu_init();
  std::string core = kernels::blas_core_for_cpu();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vl");
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(core, avx512 ? "SkylakeX" : avx2 ? "Haswell" : "");
}

// This test binary does not select (no select_blas_core in gtest's main): its OpenBLAS runs what
// it detected or what the environment asked for, and the report says which.
TEST(BlasCore, ReportNamesTheCoreInUse) {
  std::string core = kernels::blas_core();
  ASSERT_FALSE(core.empty());
  std::string report = blas_core_report();
  EXPECT_EQ(report.rfind("OpenBLAS core " + core + " (", 0), 0u) << report;
  EXPECT_EQ(report.back(), ')') << report;
  EXPECT_NE(kernels::blas_config().find("OpenBLAS"), std::string::npos) << kernels::blas_config();
}

TEST(BlasCoreChoice, MisdetectedAvx512CpuReexecutesWithSkylakeX) {
  BlasCoreChoice c = choose_blas_core(misdetected_avx512());
  EXPECT_TRUE(c.reexec);
  EXPECT_EQ(c.force, "SkylakeX");
  EXPECT_EQ(c.note, "auto: detected Prescott on an AVX-512 CPU");
  EXPECT_TRUE(c.warning.empty());
}

TEST(BlasCoreChoice, MisdetectedAvx2CpuReexecutesWithHaswell) {
  BlasCoreInputs in = misdetected_avx512();
  in.detected = "Sandybridge";
  in.cpu_core = "Haswell";
  BlasCoreChoice c = choose_blas_core(in);
  EXPECT_TRUE(c.reexec);
  EXPECT_EQ(c.force, "Haswell");
  EXPECT_EQ(c.note, "auto: detected Sandybridge on an AVX2 CPU");
}

TEST(BlasCoreChoice, KnownCoreIsKept) {
  for (const char* good : {"SkylakeX", "Cooperlake", "Haswell", "Zen"}) {
    BlasCoreInputs in = misdetected_avx512();
    in.detected = good;
    BlasCoreChoice c = choose_blas_core(in);
    EXPECT_FALSE(c.reexec) << good;
    EXPECT_EQ(c.note, "as detected") << good;
    EXPECT_TRUE(c.warning.empty()) << good;
  }
}

TEST(BlasCoreChoice, CpuWithoutAvx2KeepsTheGenericCore) {
  BlasCoreInputs in = misdetected_avx512();
  in.cpu_core = "";
  BlasCoreChoice c = choose_blas_core(in);
  EXPECT_FALSE(c.reexec);
  EXPECT_EQ(c.note, "as detected");
}

TEST(BlasCoreChoice, UserCoreTypeIsObeyed) {
  for (const char* asked : {"Prescott", "Haswell", "", "NoSuchCore"}) {
    BlasCoreInputs in = misdetected_avx512();
    in.user_coretype = asked;
    BlasCoreChoice c = choose_blas_core(in);
    EXPECT_FALSE(c.reexec) << asked;
    EXPECT_EQ(c.note, std::string("OPENBLAS_CORETYPE=") + asked + " from the environment");
    EXPECT_TRUE(c.warning.empty()) << asked;
  }
}

TEST(BlasCoreChoice, OptOut) {
  for (const char* off : {"0", "off", "OFF", "no", "false"}) {
    BlasCoreInputs in = misdetected_avx512();
    in.auto_setting = off;
    BlasCoreChoice c = choose_blas_core(in);
    EXPECT_FALSE(c.reexec) << off;
    EXPECT_EQ(c.note, std::string("as detected; OASES_BLAS_AUTO=") + off + " keeps it on this AVX-512 CPU, which could run SkylakeX");
    EXPECT_TRUE(c.warning.empty()) << off;
  }
  BlasCoreInputs in = misdetected_avx512();
  in.auto_setting = "1";
  EXPECT_TRUE(choose_blas_core(in).reexec);
}

TEST(BlasCoreChoice, FixedOpenBlasCannotSwitchAndSaysSo) {
  BlasCoreInputs in = misdetected_avx512();
  in.selectable = false;
  BlasCoreChoice c = choose_blas_core(in);
  EXPECT_FALSE(c.reexec);
  EXPECT_NE(c.warning.find("DYNAMIC_ARCH"), std::string::npos) << c.warning;
}

// The re-executed process: reports the switch and never executes again, even when OpenBLAS
// still runs the generic core (an OpenBLAS without the asked core): no loop.
TEST(BlasCoreChoice, ReexecutedProcessNeverReexecutes) {
  BlasCoreInputs in = misdetected_avx512();
  in.detected = "SkylakeX";
  in.user_coretype = "SkylakeX";  // set by the first process
  in.reexec_guard = "Prescott";
  BlasCoreChoice c = choose_blas_core(in);
  EXPECT_FALSE(c.reexec);
  EXPECT_EQ(c.note, "auto: detected Prescott on an AVX-512 CPU");
  EXPECT_TRUE(c.warning.empty());

  in.detected = "Prescott";
  c = choose_blas_core(in);
  EXPECT_FALSE(c.reexec);
  EXPECT_EQ(c.note, "auto: detected Prescott on an AVX-512 CPU; OPENBLAS_CORETYPE=SkylakeX did not take");
  EXPECT_NE(c.warning.find("Prescott kernels although OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << c.warning;

  in.auto_setting = "1";
  in.user_coretype.reset();
  EXPECT_FALSE(choose_blas_core(in).reexec);
}

}  // namespace
}  // namespace oases
