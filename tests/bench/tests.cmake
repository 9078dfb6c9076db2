# Tools of bench/ that measure (their measurements are bench/ scripts, not
# tests): the hiccup meter of bench/latency records a stall it is shown.
molt_pytest(bench_tools ${CMAKE_CURRENT_LIST_DIR}/test_hiccup_meter.py
  TIMEOUT 60 LABELS bench)
