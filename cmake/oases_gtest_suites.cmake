# oases_gtest_suites(TARGET LABEL): one CTest test per GoogleTest suite of TARGET (the suites are
# listed after each build, as gtest_discover_tests lists tests). A test per case started the binary
# once per case, and each start mapped cuBLAS/cuBLASLt then (~25k page faults, 0.15-0.3 s of a core;
# they are opened on first use now): 1065 starts were about 200 s of a 2-core CI machine's time for
# 2 s of testing. A suite whose every case
# skipped (GTEST_SKIP) is reported skipped, never passed (tests/run_gtest_suite.sh); the log of a
# partly skipped suite lists its skipped cases. Run one case: BINARY --gtest_filter=Suite.Case.
set(OASES_GTEST_SUITES_LISTER ${CMAKE_CURRENT_LIST_DIR}/oases_gtest_suites_list.cmake)

function(oases_gtest_suites target label)
  set(list_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D EXE=$<TARGET_FILE:${target}> -D OUT=${list_file} -D LABEL=${label}
            -D RUNNER=${CMAKE_SOURCE_DIR}/tests/run_gtest_suite.sh -D WORKDIR=${CMAKE_CURRENT_BINARY_DIR}
            -P ${OASES_GTEST_SUITES_LISTER}
    BYPRODUCTS ${list_file}
    VERBATIM)
  file(WRITE ${include_file}
    "if(EXISTS \"${list_file}\")\n"
    "  include(\"${list_file}\")\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
