# molt attach end to end (issue 13): a plainly built multi-threaded server
# patched under a checking load, rolled back, refused, molt killed half way.
# Needs ptrace of a child process (root in CI).  Not under ThreadSanitizer:
# the code under test is the CLI, whose threads are none.
molt_pytest(attach ${CMAKE_CURRENT_LIST_DIR}/test_attach.py TIMEOUT 600 LABELS attach cli moltcc)
# Attach patches built from a unified diff by the two-version builder
# against a plainly built program (moltcc --molt-patch on a target without
# a compile record): applied under load, refused, clear errors.
molt_pytest(attach_fix ${CMAKE_CURRENT_LIST_DIR}/test_attach_fix.py TIMEOUT 300 LABELS attach cli moltcc)
