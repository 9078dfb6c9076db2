# Shadowed updates (docs/design.md §17): a full update rehearsed in a
# forked follower that replays the leader's calls.  The server under test
# is progs/kvs.c, built with this tree's moltcc; clients check every reply.
# Under ThreadSanitizer the follower (a child of a multi-threaded fork()
# that starts threads) needs die_after_fork=0, which the test sets.
molt_pytest(shadowupd ${CMAKE_CURRENT_LIST_DIR}/test_shadowupd.py
  TIMEOUT 300 LABELS shadowupd fullupdate concurrency moltcc cli
  ENV SHADOW_WORK=${CMAKE_CURRENT_BINARY_DIR}/shadowupd)

# The same for an epoll server (progs/eps.c: an acceptor hands each
# connection to a worker's epoll instance, its data a heap pointer): a
# self-shadow, a divergence, promote/rollback/commit, the leader killed,
# same-data registrations dropped and refused (shadow/epoll.c).
molt_pytest(shadowupd_epoll ${CMAKE_CURRENT_LIST_DIR}/test_shadow_epoll.py
  TIMEOUT 300 LABELS shadowupd fullupdate concurrency moltcc cli
  ENV SHADOW_WORK=${CMAKE_CURRENT_BINARY_DIR}/shadowupd-epoll)

# Retries (--retries N): a follower that diverged only on its first attempt
# succeeds on the second; one that always diverges ends after exactly N+1
# attempts, the leader unharmed; a failed transformer retried, molt rollback
# cancelling the wait; bad values refused.
molt_pytest(shadowupd_retry ${CMAKE_CURRENT_LIST_DIR}/test_shadow_retry.py
  TIMEOUT 300 LABELS shadowupd fullupdate concurrency moltcc cli
  ENV SHADOW_WORK=${CMAKE_CURRENT_BINARY_DIR}/shadowupd-retry)

# Threads started after the fork (progs/tps.c: a thread per connection,
# started by the main thread, ended when the client hangs up): a
# self-shadow under hundreds of connections, a changed reply caught on a
# connection's thread, a version that starts no thread caught,
# promote/rollback/commit, the leader killed while such threads serve.
molt_pytest(shadowupd_threads ${CMAKE_CURRENT_LIST_DIR}/test_shadow_threads.py
  TIMEOUT 300 LABELS shadowupd fullupdate concurrency moltcc cli
  ENV SHADOW_WORK=${CMAKE_CURRENT_BINARY_DIR}/shadowupd-threads)

# The rule language (src/common/rules.c): good and bad files with their
# file:line:col, patterns, and a deterministic mutation loop (60,000 inputs:
# ~0.1 s plain, ~1.5 s under TSan;
# raise the count for a soak: shadowupd_rules fuzz ITERATIONS SEED).
add_executable(shadowupd_rules ${CMAKE_CURRENT_LIST_DIR}/test_rules.c)
target_link_libraries(shadowupd_rules PRIVATE molt_common)
add_test(NAME shadowupd_rules COMMAND shadowupd_rules unit)
add_test(NAME shadowupd_rules_fuzz COMMAND shadowupd_rules fuzz 60000)
set_tests_properties(shadowupd_rules PROPERTIES TIMEOUT 60 LABELS "shadowupd")
set_tests_properties(shadowupd_rules_fuzz PROPERTIES TIMEOUT 300 LABELS "shadowupd;fuzz")

# kvfull (an acceptor that hands connections to its workers) shadowed by
# itself for 12 s under busy clients, persistent clients and short
# connections made after the fork: 0 false divergences, every reply checked
# (examples/kvfull/shadow.py; the 60 s run is its default).
add_test(NAME shadowupd_kvfull
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/kvfull/shadow.py --seconds 12
          --molt-build ${CMAKE_BINARY_DIR} --obj ${CMAKE_CURRENT_BINARY_DIR}/shadowupd/kvfull)
set_tests_properties(shadowupd_kvfull PROPERTIES TIMEOUT 300
  LABELS "shadowupd;concurrency;demo;moltcc;cli")

# MVEDSUA's three fault classes (bench/shadowupd/faults.py, short): a new
# version that crashes on one request, a migration hook that loses values
# (seen later, on reads of keys set before the update), and a divergence
# that one follower in two shows (retried until an attempt escapes it);
# exit status 1 on any wrong or lost reply, or a run that never escaped in
# 10 retries (odds 1 in 2,048 per run).  About 10 s plain.
add_test(NAME shadowupd_faults
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/shadowupd/faults.py --timing-runs 2)
set_tests_properties(shadowupd_faults PROPERTIES TIMEOUT 300
  LABELS "shadowupd;fullupdate;concurrency;moltcc;cli"
  ENVIRONMENT "MOLT_BUILD_DIR=${CMAKE_BINARY_DIR};SHADOW_WORK=${CMAKE_CURRENT_BINARY_DIR}/shadowupd-faults")
