# cmake -D EXE=... -D OUT=... -D LABEL=... -D RUNNER=... -D WORKDIR=... -P oases_gtest_suites_list.cmake
# Writes OUT: one add_test per GoogleTest suite of EXE (see oases_gtest_suites.cmake).
execute_process(COMMAND "${EXE}" --gtest_list_tests
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${errors}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(count 0)
foreach(line IN LISTS lines)
  # suite lines start in column one and end the name with a dot ("Suite.", "Inst/Suite.  # TypeParam = ...")
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script
      "add_test([==[${suite}]==] bash [==[${RUNNER}]==] [==[${EXE}]==] [==[--gtest_filter=${suite}.*]==])\n"
      "set_tests_properties([==[${suite}]==] PROPERTIES LABELS [==[${LABEL}]==] SKIP_RETURN_CODE 77 "
      "WORKING_DIRECTORY [==[${WORKDIR}]==])\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests listed no suite")
endif()
file(WRITE "${OUT}.tmp" "${script}")
file(RENAME "${OUT}.tmp" "${OUT}")
