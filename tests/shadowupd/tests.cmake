# Shadowed updates (docs/design.md §17): a full update rehearsed in a
# forked follower that replays the leader's calls.  The server under test
# is progs/kvs.c, built with this tree's moltcc; clients check every reply.
# Under ThreadSanitizer the follower (a child of a multi-threaded fork()
# that starts threads) needs die_after_fork=0, which the test sets.
molt_pytest(shadowupd ${CMAKE_CURRENT_LIST_DIR}/test_shadowupd.py
  TIMEOUT 300 LABELS shadowupd fullupdate concurrency moltcc cli
  ENV SHADOW_WORK=${CMAKE_CURRENT_BINARY_DIR}/shadowupd)
