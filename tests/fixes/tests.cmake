# Real security fixes, short version (examples/fixes/run.sh --quick): Debian's
# dnsmasq source package fetched with apt-get source (network: the Debian
# archive), built with this tree's moltcc, two of its security fixes built
# from their patch files and applied live under a checking load (each
# changes a reply: checked before and after), and a fix a hot patch cannot
# carry refused with its reason.  Fails on any failed reply, a demo that did
# not change, a refusal for another reason, or a fix blocked by moltcc.
# Plain build tree only (the servers it builds are not sanitized).  Its work
# directory, outside the repository (/var/tmp/molt-fixes-ctest-<tag of the
# build tree>), keeps the fetched package and the build for the next run.
#   by hand:  ctest --test-dir build -L realworld --output-on-failure
# The work directory and ports (27400..32389, below the ephemeral range)
# are per build tree, so that two checkouts or worktrees can run the test
# at the same time.
if(NOT MOLT_SANITIZE)
  string(SHA1 molt_fixes_key "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${molt_fixes_key}" 0 8 molt_fixes_tag)
  string(SUBSTRING "${molt_fixes_key}" 0 2 molt_fixes_byte)
  math(EXPR molt_fixes_port "27400 + 100 * (0x${molt_fixes_byte} % 50)")
  add_test(NAME realworld_fixes
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/fixes/run.sh --quick --strict)
  set_tests_properties(realworld_fixes PROPERTIES TIMEOUT 1800 LABELS "realworld"
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_FIXES_WORK=/var/tmp/molt-fixes-ctest-${molt_fixes_tag};MOLT_FIXES_PORT=${molt_fixes_port}")
endif()
