# Debuggability of patched processes (issue 12): warnings of generated code,
# the names tools show for updatable functions (backtrace_symbols, __func__,
# assert, addr2line), gdb on a live process and on its core, and what
# `molt status` says about old versions still running.
molt_pytest(debug_pytest ${CMAKE_CURRENT_LIST_DIR} TIMEOUT 900 LABELS debug moltcc cli)
