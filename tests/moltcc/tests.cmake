# moltcc tests: pytest files in tests/moltcc (real compiles with the real
# compiler; the end-to-end test patches a running program).  Included from
# tests/CMakeLists.txt.  They use this build tree (harness.tree):
# <build>/bin/moltcc (from tools/moltcc/moltcc.cmake) when it exists,
# libmolt, moltstamp and the CLI.
#   by hand:  MOLT_BUILD_DIR=build python3 -m pytest -q tests/moltcc
molt_pytest(moltcc_pytest ${CMAKE_CURRENT_LIST_DIR}
  --ignore=${CMAKE_CURRENT_LIST_DIR}/test_program_build.py
  TIMEOUT 900 LABELS moltcc cli)
# Full updates, build side: --molt-program images, --molt-from/--molt-xf
# migration code, and one molt run / molt update end to end
# (test_program_build.py, fixtures in program/); a separate entry so that
# ctest can run it next to the rest of the full-update tests
# (ctest -L fullupdate).
molt_pytest(moltcc_program_build ${CMAKE_CURRENT_LIST_DIR}/test_program_build.py
  TIMEOUT 600 LABELS moltcc fullupdate cli)
