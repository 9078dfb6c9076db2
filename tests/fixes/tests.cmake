# Real security fixes, short version (examples/fixes/run.sh --quick): Debian's
# dnsmasq source package fetched with apt-get source (network: the Debian
# archive), built with this tree's moltcc, two of its security fixes built
# from their patch files and applied live under a checking load (each
# changes a reply: checked before and after), and a fix a hot patch cannot
# carry refused with its reason.  Fails on any failed reply, a demo that did
# not change, a refusal for another reason, or a fix blocked by moltcc.
# Plain build tree only (the servers it builds are not sanitized).  Its work
# directory, outside the repository, keeps the fetched package and the
# build for the next run.
#   by hand:  ctest --test-dir build -L realworld --output-on-failure
if(NOT MOLT_SANITIZE)
  add_test(NAME realworld_fixes
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/fixes/run.sh --quick --strict)
  set_tests_properties(realworld_fixes PROPERTIES TIMEOUT 1800 LABELS "realworld"
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_FIXES_WORK=/var/tmp/molt-fixes-ctest;MOLT_FIXES_PORT=27400")
endif()
