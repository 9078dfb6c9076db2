# molt attach end to end (issue 13): a plainly built multi-threaded server
# patched under a checking load, rolled back, refused, molt killed half way;
# patches stacked, callbacks run in the server, --all on a forking server.
# Needs ptrace of a child process (root in CI).  Not under ThreadSanitizer:
# the code under test is the CLI, whose threads are none.
# The plain build runs the issue's 1,000 attach + rollback cycles on the
# 100-thread server (183 s on the 2-core machine, 250 took 45-60 s:
# tests/README.md); a sanitized build keeps the default 50 (molt and the
# checks run 2-3x slower under ASan, and the cycles test molt's stop logic,
# which the plain build covers).
if(MOLT_SANITIZE)
  set(molt_attach_cycles 50)
else()
  set(molt_attach_cycles 1000)
endif()
molt_pytest(attach ${CMAKE_CURRENT_LIST_DIR}/test_attach.py TIMEOUT 900 LABELS attach cli moltcc
  ENV ATTACH_CYCLES=${molt_attach_cycles})
# Attach patches built from a unified diff by the two-version builder
# against a plainly built program (moltcc --molt-patch on a target without
# a compile record): applied under load, refused, clear errors.
molt_pytest(attach_fix ${CMAKE_CURRENT_LIST_DIR}/test_attach_fix.py TIMEOUT 300 LABELS attach cli moltcc)
# A real server, short version (examples/attach/run.sh --quick): Debian's
# memcached 1.6.18-1+deb12u1 fetched with apt-get source (network: the Debian
# archive), its security update's patches taken out, built plainly (gcc -O2
# -g, its own configure and make); the update's three patches built as attach
# patches straight from debian/patches: the SASL fix attached to the running
# server under a checking load (a login it changes: refused before, accepted
# after, refused after rollback; 2 cycles), the two proxy fixes refused with
# their reason.  Fails on any failed reply or a fix that did not change the
# login.  Plain build tree only (memcached is not sanitized); the work
# directory, outside the repository, keeps the source and build for the next
# run.  by hand:  ctest --test-dir build -R attach_realworld --output-on-failure
if(NOT MOLT_SANITIZE)
  string(SHA1 molt_attach_key "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${molt_attach_key}" 0 8 molt_attach_tag)
  string(SUBSTRING "${molt_attach_key}" 0 2 molt_attach_byte)
  math(EXPR molt_attach_port "26000 + 20 * (0x${molt_attach_byte} % 50)")
  add_test(NAME attach_realworld
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/attach/run.sh --quick)
  set_tests_properties(attach_realworld PROPERTIES TIMEOUT 900 LABELS "attach;realworld"
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_ATTACH_WORK=/var/tmp/molt-attach-ctest-${molt_attach_tag};MOLT_ATTACH_PORT=${molt_attach_port}")
endif()
