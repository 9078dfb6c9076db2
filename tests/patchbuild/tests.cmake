# Patch builder unit tests: the object comparison (moltcc_objdiff) and the
# DWARF checks (moltcc_typecheck) on small C files compiled for real with
# gcc and clang-14, woven by this build tree's moltcc.  No program runs and
# nothing links against libmolt, so a sanitized build tree would repeat the
# same compiles: they are registered in the plain build tree only.
#   by hand:  MOLT_BUILD_DIR=build python3 -m pytest -q tests/patchbuild
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND NOT MOLT_SANITIZE)
  add_test(NAME patchbuild_pytest
    COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(patchbuild_pytest PROPERTIES TIMEOUT 900 LABELS "patchbuild;moltcc"
    ENVIRONMENT "MOLT_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()
