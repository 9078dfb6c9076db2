# Patch builder tests (plain build tree only: nothing they build runs under a
# sanitizer, so a sanitized tree would only repeat the same compiles):
#   patchbuild_compare  the object comparison (moltcc.patch.objdiff) and the
#                       DWARF checks (moltcc.patch.typecheck) on small C files
#                       compiled for real with gcc and clang-14; lifetimes
#                       (moltcc.patch.lifetime) on a source read by libclang
#   patchbuild_fix      the compile record of program builds (test_record_*)
#                       and a fix as changed files, affected TUs and build
#                       trees (test_fix_*), with real make, diff, git, compiles
#   patchbuild_corpus   patches built from fixes (test_corpus_*): small real
#                       programs changed one way, patched while they run with
#                       molt apply, or refused
#   by hand:  MOLT_BUILD_DIR=build python3 -m pytest -q tests/patchbuild
if(NOT MOLT_SANITIZE)
  file(GLOB MOLT_COMPARE_TESTS ${CMAKE_CURRENT_LIST_DIR}/test_objdiff*.py
                               ${CMAKE_CURRENT_LIST_DIR}/test_typecheck*.py
                               ${CMAKE_CURRENT_LIST_DIR}/test_lifetime*.py)
  file(GLOB MOLT_FIX_TESTS ${CMAKE_CURRENT_LIST_DIR}/test_fix_*.py
                           ${CMAKE_CURRENT_LIST_DIR}/test_record_*.py)
  file(GLOB MOLT_CORPUS_TESTS ${CMAKE_CURRENT_LIST_DIR}/test_corpus_*.py)
  molt_pytest(patchbuild_compare ${MOLT_COMPARE_TESTS} TIMEOUT 900 LABELS patchbuild moltcc)
  molt_pytest(patchbuild_fix ${MOLT_FIX_TESTS} TIMEOUT 900 LABELS patchbuild moltcc)
  molt_pytest(patchbuild_corpus ${MOLT_CORPUS_TESTS} TIMEOUT 900 LABELS patchbuild moltcc)
endif()
