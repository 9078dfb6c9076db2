# Patch builder, the fix side: the compile record of program builds
# (test_record_*) and a fix as changed files, affected TUs and build
# trees (test_fix_*), with real make, diff, git and compiles.  Their own
# helper module is fixtools.py (not a conftest).  Nothing they build runs
# under a sanitizer, so they are registered in the plain build tree only.
#   by hand:  MOLT_BUILD_DIR=build python3 -m pytest -q tests/patchbuild/test_fix_*.py tests/patchbuild/test_record_*.py
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND NOT MOLT_SANITIZE)
  file(GLOB MOLT_FIX_TESTS ${CMAKE_CURRENT_LIST_DIR}/test_fix_*.py
                           ${CMAKE_CURRENT_LIST_DIR}/test_record_*.py)
  add_test(NAME patchbuild_fix_pytest
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${MOLT_FIX_TESTS})
  set_tests_properties(patchbuild_fix_pytest PROPERTIES TIMEOUT 600 LABELS "patchbuild;moltcc"
    ENVIRONMENT "MOLT_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()
