# moltcc tests: pytest files in tests/moltcc (real compiles with the real
# compiler; the end-to-end test patches a running program).  Included from
# tests/CMakeLists.txt.  They use this build tree: <build>/bin/moltcc (from
# tools/moltcc/moltcc.cmake) when it exists, libmolt, moltstamp and the CLI.
#   by hand:  MOLT_BUILD_DIR=build python3 -m pytest -q tests/moltcc
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  add_test(NAME moltcc_pytest
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}
            --ignore=${CMAKE_CURRENT_LIST_DIR}/test_program_build.py)
  set_tests_properties(moltcc_pytest PROPERTIES TIMEOUT 900 LABELS "moltcc"
    ENVIRONMENT "MOLT_BUILD_DIR=${CMAKE_BINARY_DIR}")
  # Full updates, build side: --molt-program images, --molt-from/--molt-xf
  # migration code, and one molt run / molt update end to end
  # (test_program_build.py, fixtures in program/); a separate entry so that
  # ctest can run it next to the rest (ctest -L full-updates).
  add_test(NAME moltcc_program_build
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
            ${CMAKE_CURRENT_LIST_DIR}/test_program_build.py)
  set_tests_properties(moltcc_program_build PROPERTIES TIMEOUT 600
    LABELS "moltcc;full-updates" ENVIRONMENT "MOLT_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()
