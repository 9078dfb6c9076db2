# moltcc tests: pytest files in tests/moltcc (real compiles with the real
# compiler; the end-to-end test patches a running program).  Included from
# tests/CMakeLists.txt.  They use this build tree: <build>/bin/moltcc (from
# tools/moltcc/moltcc.cmake) when it exists, libmolt, moltstamp and the CLI.
#   by hand:  MOLT_BUILD_DIR=build python3 -m pytest -q tests/moltcc
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  add_test(NAME moltcc_pytest
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(moltcc_pytest PROPERTIES TIMEOUT 900 LABELS "moltcc"
    ENVIRONMENT "MOLT_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()
