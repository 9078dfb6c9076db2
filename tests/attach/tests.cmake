# molt attach end to end (issue 13): a plainly built multi-threaded server
# patched under a checking load, rolled back, refused, molt killed half way;
# patches stacked, callbacks run in the server, --all on a forking server.
# Needs ptrace of a child process (root in CI).  Not under ThreadSanitizer:
# the code under test is the CLI, whose threads are none.
molt_pytest(attach ${CMAKE_CURRENT_LIST_DIR}/test_attach.py TIMEOUT 600 LABELS attach cli moltcc)
